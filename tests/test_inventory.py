"""
Tests for L{fleetd.inventory}: validation, and the L{IInventory} contract
run against the embedded SQLite inventory.

L{InventoryContractMixin} is backend-neutral: a test case supplies
C{openInventory()} and runs every contract test against its backend (the
NetBox fake runs the same mixin).
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory import (
    Device,
    DeviceStatus,
    IInventory,
    InventoryError,
    ServedRecord,
    validateDevice,
)
from fleetd.store import Database, InlineRunner, StoreError
from tests.inventorysupport import (
    UUID1,
    UUID2,
    UUID3,
    W1,
    W2,
    W3,
    FailingRunner,
    device,
)
from tests.support import inventoryOver

_T = TypeVar("_T")

if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object


class InventoryContractMixin(_Base):
    """
    The behaviour every L{IInventory} backend shares.

    Subclasses implement L{openInventory} (each call returns a new
    inventory over the same backing store, as after a restart) and
    L{seed}, which puts devices into the store the way that backend gets
    them: C{importDevices} for the embedded inventory, an operator's
    entry in NetBox for the NetBox one.
    """

    def openInventory(self) -> IInventory:
        raise NotImplementedError()

    def seed(self, *devices: Device) -> None:
        """Put C{devices} into the backing store (as an operator would)."""
        raise NotImplementedError()

    def setUp(self) -> None:
        self.inventory = self.openInventory()

    def ok(self, d: Deferred[_T]) -> _T:
        return self.successResultOf(d)

    def refused(self, d: Deferred[Any], kind: str) -> InventoryError:
        failure: Failure = self.failureResultOf(d, InventoryError)
        error = failure.value
        assert isinstance(error, InventoryError)
        self.assertEqual(error.kind, kind, str(error))
        self.assertNotIn("\n", str(error))
        return error

    def test_get_returnsDevice(self) -> None:
        """A device in the inventory is returned by get, case-insensitively."""
        self.seed(W2)
        self.assertEqual(self.ok(self.inventory.get("w2")), W2)
        self.assertEqual(self.ok(self.inventory.get("W2")), W2)

    def test_get_unknownIsNone(self) -> None:
        """get of an unknown or malformed name fires with None."""
        self.assertIsNone(self.ok(self.inventory.get("nope")))
        self.assertIsNone(self.ok(self.inventory.get("not a name!")))

    def test_list_orderedByName(self) -> None:
        """list returns every device, ordered by name, MACs in their order."""
        self.seed(W3, W1, W2)
        self.assertEqual(self.ok(self.inventory.list()), [W1, W2, W3])

    def test_identities_nameUUIDSerialOfEach(self) -> None:
        """identities gives (name, uuid, serial) of every device, as list has them."""
        self.seed(W3, W1, W2)
        identities: list[tuple[str, str, str]] = self.successResultOf(
            self.inventory.identities()
        )
        self.assertEqual(
            sorted(identities),
            [(d.name, d.uuid, d.serial) for d in self.ok(self.inventory.list())],
        )
        self.assertEqual(len(identities), 3)

    def test_address_readBack(self) -> None:
        """
        Issue 30: a device's address comes back from get, bySerial and list
        as it was entered; a device without one has none.
        """
        placed = replace(W2, address="2001:db8::2")
        self.seed(W1, placed)
        self.assertEqual(self.ok(self.inventory.get("w2")), placed)
        self.assertEqual(self.ok(self.inventory.bySerial("SN-0002")), placed)
        self.assertEqual(self.ok(self.inventory.list()), [W1, placed])
        plain = self.ok(self.inventory.get("w1"))
        self.assertEqual((plain, plain and plain.address), (W1, None))

    def test_list_empty(self) -> None:
        """An empty inventory lists nothing."""
        self.assertEqual(self.ok(self.inventory.list()), [])

    def test_bySerial_caseInsensitive(self) -> None:
        """bySerial finds the device with its serial, any case (design.md, NetBox)."""
        self.seed(W1, W2)
        self.assertEqual(self.ok(self.inventory.bySerial("sn-0002")), W2)
        self.assertEqual(self.ok(self.inventory.bySerial("SN-0001")), W1)

    def test_bySerial_unknownIsNone(self) -> None:
        """bySerial of an unknown or malformed serial fires with None."""
        self.seed(W1)
        self.assertIsNone(self.ok(self.inventory.bySerial("SN-404")))
        self.assertIsNone(self.ok(self.inventory.bySerial("not a serial")))
        self.assertIsNone(self.ok(self.inventory.bySerial("")))

    def test_bySerial_showsChanges(self) -> None:
        """bySerial shows the device as changed, like get."""
        self.seed(W1)
        self.ok(self.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=()))
        found = self.ok(self.inventory.bySerial("SN-0001"))
        self.assertEqual(found, self.ok(self.inventory.get("w1")))
        assert found is not None
        self.assertEqual(found.status, DeviceStatus.PLANNED)

    def test_setStatus_changesAndReturns(self) -> None:
        """setStatus changes the status and fires with the changed device."""
        self.seed(W1)
        changed = self.ok(
            self.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        self.assertEqual(changed.status, DeviceStatus.PLANNED)
        self.assertEqual(self.ok(self.inventory.get("w1")), changed)

    def test_setStatus_unknownDevice(self) -> None:
        """setStatus of an unknown device fails with not-found."""
        self.refused(
            self.inventory.setStatus("w9", DeviceStatus.ACTIVE, journal=()), "not-found"
        )

    def test_setStatus_unknownStatus(self) -> None:
        """A status that is not a DeviceStatus is refused as invalid."""
        self.seed(W1)
        bogus: Any = "exploded"
        self.refused(self.inventory.setStatus("w1", bogus, journal=()), "invalid")

    def test_setDesiredAction_setAndClear(self) -> None:
        """setDesiredAction sets an action and None clears it."""
        self.seed(W1)
        changed = self.ok(self.inventory.setDesiredAction("w1", "netboot", journal=()))
        self.assertEqual(changed.desired_action, "netboot")
        cleared = self.ok(self.inventory.setDesiredAction("w1", None, journal=()))
        self.assertIsNone(cleared.desired_action)
        self.assertEqual(self.ok(self.inventory.get("w1")), cleared)

    def test_setDesiredAction_refusals(self) -> None:
        """A malformed action is invalid; an unknown device is not-found."""
        self.seed(W1)
        self.refused(
            self.inventory.setDesiredAction("w1", "net boot", journal=()), "invalid"
        )
        self.refused(
            self.inventory.setDesiredAction("w9", "netboot", journal=()), "not-found"
        )

    def test_release_recordsAndStages(self) -> None:
        """release records the run and moves the device to staged."""
        self.seed(W1)
        self.ok(self.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=()))
        self.ok(
            self.inventory.release(
                ServedRecord("run-1", "w1", 10.0, "10.0.0.7"), journal=()
            )
        )
        self.assertEqual(self.ok(self.inventory.releasedRuns()), {"run-1"})
        got = self.ok(self.inventory.get("w1"))
        assert got is not None
        self.assertEqual(got.status, DeviceStatus.STAGED)

    def test_release_idempotentForSameRun(self) -> None:
        """Releasing the same run again changes nothing, not even the status."""
        self.seed(W1)
        record = ServedRecord("run-1", "w1", 10.0, "10.0.0.7")
        self.ok(self.inventory.release(record, journal=()))
        self.ok(self.inventory.setStatus("w1", DeviceStatus.ACTIVE, journal=()))
        self.assertIsNone(self.ok(self.inventory.release(record, journal=())))
        self.assertEqual(self.ok(self.inventory.releasedRuns()), {"run-1"})
        got = self.ok(self.inventory.get("w1"))
        assert got is not None
        self.assertEqual(got.status, DeviceStatus.ACTIVE)

    def test_release_sameRunOtherDevice(self) -> None:
        """One run released for two devices is refused as a duplicate."""
        self.seed(W1, W2)
        self.ok(
            self.inventory.release(ServedRecord("run-1", "w1", 1.0, "p"), journal=())
        )
        self.refused(
            self.inventory.release(ServedRecord("run-1", "w2", 1.0, "p"), journal=()),
            "duplicate",
        )

    def test_release_unknownDevice(self) -> None:
        """Releasing for a device not in the inventory fails with not-found."""
        self.refused(
            self.inventory.release(ServedRecord("run-1", "w9", 1.0, "p"), journal=()),
            "not-found",
        )
        self.assertEqual(self.ok(self.inventory.releasedRuns()), set())

    def test_servedAt_newestReleasedDelivery(self) -> None:
        """
        servedAt gives, by name, when each device's newest released
        delivery was served; devices with none, unknown and malformed
        names are left out; it survives a reopen.
        """
        self.seed(W1, W2, W3)
        released = (("r1", "w1", 10.0), ("r2", "w1", 30.0), ("r3", "w2", 5.0))
        for run, name, at in released:
            record = ServedRecord(run, name, at, "10.0.0.7")
            self.ok(self.inventory.release(record, journal=()))
        wanted = ["w1", "w2", "w3", "w9", "w1", "not a name!"]
        served = self.ok(self.inventory.servedAt(wanted))
        self.assertEqual(served, {"w1": 30.0, "w2": 5.0})
        self.assertEqual(self.ok(self.inventory.servedAt([])), {})
        reopened = self.openInventory()
        self.assertEqual(self.ok(reopened.servedAt(["w2"])), {"w2": 5.0})

    def test_releasedRuns_surviveReopen(self) -> None:
        """Released runs and devices are still there after a reopen."""
        self.seed(W1, W2)
        self.ok(
            self.inventory.release(ServedRecord("run-1", "w1", 1.0, "p"), journal=())
        )
        self.ok(
            self.inventory.release(ServedRecord("run-2", "w2", 2.0, "p"), journal=())
        )
        reopened = self.openInventory()
        self.assertEqual(self.ok(reopened.releasedRuns()), {"run-1", "run-2"})
        self.assertEqual([d.name for d in self.ok(reopened.list())], ["w1", "w2"])


class InventoryAddContractMixin(InventoryContractMixin):
    """
    The contract of backends that add devices themselves (the embedded
    inventory; with NetBox, devices are created in NetBox).
    """

    def seed(self, *devices: Device) -> None:
        self.ok(self.inventory.importDevices(devices, journal=()))

    def test_add_getReturnsDevice(self) -> None:
        """A device added is returned by add and by get, case-insensitively."""
        self.assertEqual(self.ok(self.inventory.add(W2, journal=())), W2)
        self.assertEqual(self.ok(self.inventory.get("w2")), W2)
        self.assertEqual(self.ok(self.inventory.get("W2")), W2)

    def test_add_defaultsToInventoryStatus(self) -> None:
        """A new device is in status inventory, with no desired action."""
        added = self.ok(self.inventory.add(W3, journal=()))
        self.assertEqual((added.status, added.desired_action), ("inventory", None))

    def assertDuplicate(self, other: Device, field: str) -> None:
        self.ok(self.inventory.add(W1, journal=()))
        error = self.refused(self.inventory.add(other, journal=()), "duplicate")
        self.assertIn(field, str(error))
        self.assertEqual(self.ok(self.inventory.list()), [W1])

    def test_add_duplicateName(self) -> None:
        """A name already taken is refused as a duplicate naming the field."""
        self.assertDuplicate(device("w1", "SN-9", UUID2, ()), "name")

    def test_add_duplicateSerial(self) -> None:
        """A serial already taken, in any case, is refused as a duplicate."""
        self.assertDuplicate(device("w9", "sn-0001", UUID2, ()), "serial")

    def test_add_duplicateUUID(self) -> None:
        """A UUID already taken is refused as a duplicate."""
        self.assertDuplicate(device("w9", "SN-9", UUID1.upper(), ()), "uuid")

    def test_add_duplicateMAC(self) -> None:
        """A MAC already on another device is refused as a duplicate."""
        other = device("w9", "SN-9", UUID2, ("52-54-00-00-00-09", "525400000001"))
        self.assertDuplicate(other, "mac")

    def test_add_duplicateAddress(self) -> None:
        """Issue 30: an address another device holds is refused, naming it."""
        self.ok(self.inventory.add(replace(W1, address="192.0.2.10"), journal=()))
        error = self.refused(
            self.inventory.add(replace(W2, address="192.0.2.10"), journal=()),
            "duplicate",
        )
        self.assertEqual(str(error), "address 192.0.2.10 already belongs to device w1")
        self.assertEqual([d.name for d in self.ok(self.inventory.list())], ["w1"])
        # Devices without an address do not share "none".
        self.ok(self.inventory.importDevices([W2, W3], journal=()))

    def test_import_duplicateAddressAgainstExisting(self) -> None:
        """Issue 30: an import whose device takes a held address adds nothing."""
        self.ok(self.inventory.add(replace(W1, address="2001:db8::1"), journal=()))
        clash = replace(W3, address="2001:db8::1")
        error = self.refused(
            self.inventory.importDevices([W2, clash], journal=()), "duplicate"
        )
        self.assertIn("device w3: address 2001:db8::1", str(error))
        self.assertEqual([d.name for d in self.ok(self.inventory.list())], ["w1"])

    def test_import_addsAll(self) -> None:
        """importDevices adds every device and fires with the count."""
        self.assertEqual(
            self.ok(self.inventory.importDevices([W1, W2, W3], journal=())), 3
        )
        self.assertEqual(self.ok(self.inventory.list()), [W1, W2, W3])

    def test_import_allOrNothingAgainstExisting(self) -> None:
        """One duplicate of an existing device rejects the whole import."""
        self.ok(self.inventory.add(W1, journal=()))
        clash = device("w9", "SN-9", UUID3, ("52:54:00:00:00:01",))
        error = self.refused(
            self.inventory.importDevices([W2, clash], journal=()), "duplicate"
        )
        self.assertIn("w9", str(error))
        self.assertEqual(self.ok(self.inventory.list()), [W1])

    def test_import_allOrNothingWithinBatch(self) -> None:
        """Two devices of one batch sharing a serial reject the batch."""
        twin = device("w9", "SN-0002", UUID3, ())
        self.refused(
            self.inventory.importDevices([W1, W2, twin], journal=()), "duplicate"
        )
        self.assertEqual(self.ok(self.inventory.list()), [])

    def test_import_empty(self) -> None:
        """Importing nothing succeeds with 0."""
        self.assertEqual(self.ok(self.inventory.importDevices([], journal=())), 0)


class SQLiteInventoryContractTests(InventoryAddContractMixin, SynchronousTestCase):
    """The contract, against L{SQLiteInventory} over a temporary database."""

    def openInventory(self) -> IInventory:
        if not hasattr(self, "path"):
            self.path = Path(self.mktemp()) / "fleetd.sqlite3"
        previous: Database | None = getattr(self, "db", None)
        if previous is not None:
            previous.close()
        self.db = Database.open(self.path)
        self.addCleanup(self.db.close)
        return inventoryOver(InlineRunner(self.db))


class SQLiteBySerialTests(SynchronousTestCase):
    def test_bySerial_usesTheSerialIndex(self) -> None:
        """
        bySerial is one indexed lookup: devices.serial is COLLATE NOCASE
        UNIQUE, so its equality uses that unique index, never a scan.
        """
        from fleetd.inventory.sqlite_rows import BY_SERIAL

        db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(db.close)
        plan = db.execute(f"EXPLAIN QUERY PLAN {BY_SERIAL}", ("x",)).fetchall()
        details = " ".join(str(row[-1]) for row in plan)
        self.assertIn("USING INDEX sqlite_autoindex_devices", details)
        self.assertNotIn("SCAN", details)


class SQLiteInventoryTests(SynchronousTestCase):
    """Behaviour particular to the SQLite backend."""

    def test_migration2_tables(self) -> None:
        """Migration 2 creates devices, device_macs and served_records."""
        db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        self.addCleanup(db.close)
        names = {
            name
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        self.assertTrue({"devices", "device_macs", "served_records"} <= names)

    def test_database_unavailable(self) -> None:
        """A stopped runner or a database error is reported as unavailable."""
        for error in (StoreError("stopped"), sqlite3.OperationalError("disk I/O")):
            inventory = inventoryOver(FailingRunner(error))
            for d in (
                inventory.list(),
                inventory.add(W1, journal=()),
                inventory.releasedRuns(),
            ):
                failure = self.failureResultOf(d, InventoryError)
                self.assertEqual(failure.value.kind, "unavailable")

    def test_add_revalidates(self) -> None:
        """A Device built by hand with a bad field is refused, not stored."""
        db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        self.addCleanup(db.close)
        inventory = inventoryOver(InlineRunner(db))
        bad = Device("W 1", "S", UUID1, (), "worker", None)
        failure = self.failureResultOf(inventory.add(bad, journal=()), InventoryError)
        self.assertEqual(failure.value.kind, "invalid")
        self.assertEqual(self.successResultOf(inventory.list()), [])


class ValidateDeviceTests(SynchronousTestCase):
    """L{validateDevice} normalises good input and names the bad field."""

    def base(self, **changes: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "name": "w1",
            "serial": "SN1",
            "uuid": UUID1,
            "macs": (),
            "device_class": "worker",
            "cluster": None,
        }
        fields.update(changes)
        return fields

    def test_normalises_goodInput(self) -> None:
        """Names, UUIDs, MACs, classes and clusters come out canonical."""
        cases: list[tuple[dict[str, Any], str, Any]] = [
            ({"name": "W1"}, "name", "w1"),
            ({"name": "a" * 63}, "name", "a" * 63),
            ({"name": "rack-1-node-02"}, "name", "rack-1-node-02"),
            ({"serial": "X" * 64}, "serial", "X" * 64),
            ({"serial": "CZ2.3/4#x~"}, "serial", "CZ2.3/4#x~"),
            ({"uuid": UUID1.upper()}, "uuid", UUID1),
            ({"macs": ["52:54:00:AB:CD:EF"]}, "macs", ("52:54:00:ab:cd:ef",)),
            ({"macs": ["52-54-00-ab-cd-ef"]}, "macs", ("52:54:00:ab:cd:ef",)),
            ({"macs": ["525400ABCDEF"]}, "macs", ("52:54:00:ab:cd:ef",)),
            (
                {"macs": ["52:54:00:00:00:02", "52:54:00:00:00:01"]},
                "macs",
                ("52:54:00:00:00:02", "52:54:00:00:00:01"),
            ),
            ({"device_class": "Worker-G2"}, "device_class", "worker-g2"),
            ({"cluster": "folly"}, "cluster", "folly"),
            ({"desired_action": "netboot"}, "desired_action", "netboot"),
            ({"status": "planned"}, "status", DeviceStatus.PLANNED),
            ({"address": "192.0.2.7"}, "address", "192.0.2.7"),
            ({"address": "10.20.30.40"}, "address", "10.20.30.40"),
            ({"address": "2001:DB8:0:0::7"}, "address", "2001:db8::7"),
            ({"address": "::ffff:192.0.2.7"}, "address", "192.0.2.7"),
            ({"address": None}, "address", None),
        ]
        for changes, field, expected in cases:
            result = validateDevice(**self.base(**changes))
            self.assertEqual(getattr(result, field), expected, changes)

    def test_refuses_badInput(self) -> None:
        """Each bad value is refused as invalid, in one line naming its field."""
        cases: list[tuple[dict[str, Any], str]] = [
            ({"name": ""}, "name:"),
            ({"name": "-w1"}, "name:"),
            ({"name": "w1-"}, "name:"),
            ({"name": "w_1"}, "name:"),
            ({"name": "w1.example"}, "name:"),
            ({"name": "a" * 64}, "name:"),
            ({"name": 7}, "name:"),
            ({"serial": ""}, "serial:"),
            ({"serial": "SN 1"}, "serial:"),
            ({"serial": "X" * 65}, "serial:"),
            ({"serial": "SN\u00e91"}, "serial:"),
            ({"serial": "SN\n1"}, "serial:"),
            ({"uuid": "4c4c4544004235108052b4c04f384833"}, "uuid:"),
            ({"uuid": "{" + UUID1 + "}"}, "uuid:"),
            ({"uuid": UUID1[:-1] + "g"}, "uuid:"),
            ({"uuid": "00000000-0000-0000-0000-000000000000"}, "uuid:"),
            ({"uuid": "ffffffff-ffff-ffff-ffff-ffffffffffff"}, "uuid:"),
            ({"macs": ["52:54:00:ab:cd"]}, "mac:"),
            ({"macs": ["52:54-00:ab:cd:ef"]}, "mac:"),
            ({"macs": ["5254.00ab.cdef"]}, "mac:"),
            ({"macs": ["01:00:5e:00:00:01"]}, "multicast"),
            ({"macs": ["ff:ff:ff:ff:ff:ff"]}, "multicast"),
            ({"macs": ["00:00:00:00:00:00"]}, "all-zero"),
            ({"macs": ["52:54:00:00:00:01", "525400000001"]}, "twice"),
            ({"macs": "52:54:00:00:00:01"}, "macs:"),
            ({"device_class": ""}, "class:"),
            ({"device_class": "-worker"}, "class:"),
            ({"device_class": "w" * 33}, "class:"),
            ({"cluster": "fol ly"}, "cluster:"),
            ({"status": "exploded"}, "status:"),
            ({"desired_action": "net_boot"}, "desired_action:"),
            ({"address": ""}, "address: must not be empty"),
            ({"address": 7}, "address: must be a string"),
            ({"address": "192.0.2.7/24"}, "prefix length"),
            ({"address": "fe80::1%eth0"}, "zone"),
            ({"address": "192.0.2"}, "not an IPv4 or IPv6"),
            ({"address": "010.0.0.1"}, "not an IPv4 or IPv6"),
            ({"address": " 192.0.2.7"}, "not an IPv4 or IPv6"),
            ({"address": "w1.example"}, "not an IPv4 or IPv6"),
            ({"address": "0.0.0.0"}, "unspecified"),
            ({"address": "::"}, "unspecified"),
            ({"address": "127.0.0.1"}, "loopback"),
            ({"address": "::1"}, "loopback"),
            ({"address": "::ffff:127.0.0.1"}, "127.0.0.1 is a loopback"),
            ({"address": "224.0.0.1"}, "multicast"),
            ({"address": "ff02::1"}, "multicast"),
            ({"address": "169.254.1.1"}, "link-local"),
            ({"address": "fe80::1"}, "link-local"),
            ({"address": "255.255.255.255"}, "reserved"),
            ({"address": "240.0.0.1"}, "reserved"),
        ]
        for changes, fragment in cases:
            with self.assertRaises(InventoryError, msg=repr(changes)) as caught:
                validateDevice(**self.base(**changes))
            error = caught.exception
            self.assertEqual(error.kind, "invalid")
            self.assertIn(fragment, str(error), changes)
            self.assertNotIn("\n", str(error))

    def test_toJSON_address_onlyWhenSet(self) -> None:
        """
        Issue 30: C{address} is in the device's JSON only when it has one,
        so answers for devices without one are as before.
        """
        self.assertNotIn("address", W2.toJSON())
        placed = replace(W2, address="192.0.2.2")
        self.assertEqual(placed.toJSON(), {**W2.toJSON(), "address": "192.0.2.2"})

    def test_toJSON_keys(self) -> None:
        """toJSON names the fields as the admin API does (class, macs list)."""
        self.assertEqual(
            W2.toJSON(),
            {
                "name": "w2",
                "serial": "SN-0002",
                "uuid": UUID2,
                "macs": ["52:54:00:00:00:02", "52:54:00:00:00:12"],
                "class": "worker-g3",
                "cluster": "folly",
                "status": "inventory",
                "desired_action": None,
            },
        )

    def test_status_namesAreNetBoxs(self) -> None:
        """DeviceStatus values are NetBox's DeviceStatusChoices names."""
        self.assertEqual(
            sorted(s.value for s in DeviceStatus),
            sorted(
                "offline active planned staged failed inventory decommissioning".split()
            ),
        )


_STATUSES = ["planned", "staged", "active", "decommissioning"]


class ReleaseManyTests(SynchronousTestCase):
    """L{SQLiteInventory.releaseManyIn} is L{releaseIn} for each, in bulk."""

    def setUp(self) -> None:
        self.directory = Path(self.mktemp())
        self.directory.mkdir()
        self.count = 0

    def database(
        self, statuses: list[str | None], served: list[tuple[int, int]]
    ) -> Database:
        self.count += 1
        db = Database.open(self.directory / f"db{self.count}.sqlite3")
        self.addCleanup(db.close)
        with db.transaction() as conn:
            for i, status in enumerate(statuses):
                if status is not None:
                    conn.execute(
                        "INSERT INTO devices (name, serial, uuid, class, status)"
                        " VALUES (?, ?, ?, 'worker', ?)",
                        (f"n{i}", f"S{i}", f"u{i}", status),
                    )
            for run, device in served:
                if statuses[device] is None:
                    continue  # a served record names an existing device
                conn.execute(
                    "INSERT INTO served_records (run, device, served_at, peer)"
                    " VALUES (?, ?, 1.0, '10.0.0.1')",
                    (f"r-{run}", f"n{device}"),
                )
        return db

    @staticmethod
    def state(db: Database) -> tuple[list[Any], list[Any]]:
        return (
            list(db.execute("SELECT name, status FROM devices ORDER BY name")),
            list(db.execute("SELECT * FROM served_records ORDER BY run")),
        )

    @given(
        statuses=st.lists(st.sampled_from([*_STATUSES, None]), min_size=3, max_size=3),
        served=st.lists(
            st.tuples(st.integers(0, 5), st.integers(0, 2)),
            max_size=3,
            unique_by=lambda pair: pair[0],
        ),
        records=st.lists(
            st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans()),
            max_size=6,
        ),
    )
    @example(  # two runs of one planned device: only the first moves it
        statuses=["planned", "staged", None],
        served=[],
        records=[(0, 0, True), (1, 0, True)],
    )
    @example(
        statuses=["planned", "active", None],
        served=[(2, 1)],
        records=[(2, 1, True), (2, 0, True), (3, 2, True), (4, 1, False), (5, 0, True)],
    )
    @settings(max_examples=40, deadline=None)
    def test_releaseManyIn_sameAsOneByOne(
        self,
        statuses: list[str | None],
        served: list[tuple[int, int]],
        records: list[tuple[int, int, bool]],
    ) -> None:
        """
        [J1] Releasing records in bulk gives each the outcome, and leaves
        the tables as, releasing them one by one in order: moved to staged
        or kept, refused (unknown device, run released to another device,
        a bad record) with nothing written for it.
        """
        batch = [
            ServedRecord(f"r-{run}", f"n{device}", 2.0, "10.0.0.9" if ok else "\x00")
            for run, device, ok in records
        ]
        one = self.database(statuses, served)
        many = self.database(statuses, served)
        inventory = inventoryOver(InlineRunner(one))
        expected: list[Any] = []
        with one.transaction():
            for record in batch:
                try:
                    expected.append(inventory.releaseIn(one, record))
                except InventoryError as e:
                    expected.append((e.kind, str(e)))
        with many.transaction():
            got = [
                (o.kind, str(o)) if isinstance(o, InventoryError) else o
                for o in inventory.releaseManyIn(many, batch)
            ]
        self.assertEqual(got, expected)
        self.assertEqual(self.state(many), self.state(one))
