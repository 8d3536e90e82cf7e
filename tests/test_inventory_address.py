"""
A device's optional inventory address (issue 30): the node's own IPv4 or
IPv6 address, which the disk-key service may check a request's source
against. Stored by the embedded inventory (migration 14, an existing
database migrates), unique, freed with a retired device's identity; given
by the CSV import's optional column and the admin API; read from NetBox's
primary IP; shown by C{fleetctl status} when a device has one.

The backend-neutral read-back and the duplicate refusals are in
L{tests.test_inventory}'s contract mixins.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory import InventoryError, parseDeviceCSV
from fleetd.inventory.model import DeviceStatus
from fleetd.netbox.devices import toDevice
from fleetd.statuswords import headline
from fleetd.store import Database, InlineRunner
from fleetd.store.migrations import MIGRATIONS
from tests.devicessupport import devicesTree
from tests.inventorysupport import UUID1, UUID2, UUID3, W1, W2
from tests.netbox_support import NetBoxRig, seedFake
from tests.ownersupport import W1 as W1_DOC
from tests.support import inventoryOver

BASE = "https://admin.test/devices"


class MigrationTests(SynchronousTestCase):
    """Migration 14 adds the column to a database that has devices."""

    def test_existingDevices_migrateWithoutAddress(self) -> None:
        """
        Devices stored before migration 14 read back unchanged, with no
        address; afterwards an address can be given and is unique, and
        any number of devices may have none.
        """
        path = Path(self.mktemp()) / "fleetd.sqlite3"
        path.parent.mkdir()
        before = tuple(m for m in MIGRATIONS if m[0] < 14)
        db = Database.open(path, before)
        db.connection.execute(
            "INSERT INTO devices (name, serial, uuid, class, cluster, status)"
            " VALUES ('w1', 'SN-0001', ?, 'worker-g3', 'folly', 'inventory')",
            (UUID1,),
        )
        db.connection.execute(
            "INSERT INTO device_macs (mac, device, position)"
            " VALUES ('52:54:00:00:00:01', 'w1', 0)"
        )
        db.close()
        db = Database.open(path)
        self.addCleanup(db.close)
        self.assertGreaterEqual(db.userVersion, 14)
        inventory = inventoryOver(InlineRunner(db))
        self.assertEqual(self.successResultOf(inventory.get("w1")), W1)
        placed = replace(W2, address="192.0.2.2")
        self.successResultOf(inventory.add(placed, journal=()))
        third = replace(W1, name="w3", serial="SN-3", uuid=UUID3, macs=())
        self.successResultOf(inventory.add(third, journal=()))
        self.assertEqual(
            [d.address for d in self.successResultOf(inventory.list())],
            [None, "192.0.2.2", None],
        )


class AdminAPITests(SynchronousTestCase):
    """The admin API takes, shows, refuses and frees an address."""

    def setUp(self) -> None:
        tree = devicesTree(self)
        self.stub, self.inventory, self.journal = (
            tree.stub,
            tree.inventory,
            tree.journal,
        )

    def call(self, method: str, url: str, document: Any) -> tuple[int, Any]:
        body = None if document is None else json.dumps(document).encode()
        d = self.stub.request(method, url, data=body)
        self.stub.flush()
        response = self.successResultOf(d)
        content = self.successResultOf(response.content())
        try:
            return response.code, json.loads(content)
        except ValueError:
            return response.code, content.decode()

    def test_add_addressCanonicalInTheAnswer(self) -> None:
        """An address is stored and answered in its canonical form."""
        code, body = self.call("POST", BASE, {**W1_DOC, "address": "2001:DB8::0:1"})
        self.assertEqual((code, body["address"]), (201, "2001:db8::1"))
        code, body = self.call("GET", f"{BASE}/w1", None)
        self.assertEqual((code, body["address"]), (200, "2001:db8::1"))

    def test_add_nullOrAbsentAddress_noKey(self) -> None:
        """A null address is no address: the answer has no key for it."""
        code, body = self.call("POST", BASE, {**W1_DOC, "address": None})
        self.assertEqual(code, 201)
        self.assertNotIn("address", body)

    def test_add_badAddress_400OneLineNothingAdded(self) -> None:
        """A bad address is a 400 line naming the field; nothing is added."""
        for address, line in [
            (7, "address: must be a JSON str"),
            ("192.0.2.1/24", "address: '192.0.2.1/24' has a prefix length"),
            ("127.0.0.1", "address: 127.0.0.1 is a loopback address"),
        ]:
            code, body = self.call("POST", BASE, {**W1_DOC, "address": address})
            self.assertEqual(code, 400, body)
            self.assertTrue(body.startswith(line), body)
        self.assertEqual(self.call("GET", BASE, None)[1], {"devices": []})

    def test_add_sharedAddress_409NamesTheHolder(self) -> None:
        """A second device with a held address is refused with 409."""
        self.assertEqual(
            self.call("POST", BASE, {**W1_DOC, "address": "192.0.2.1"})[0], 201
        )
        other = {
            **W1_DOC,
            "name": "w2",
            "serial": "SN-2",
            "uuid": UUID2,
            "macs": [],
            "address": "::ffff:192.0.2.1",
        }
        code, body = self.call("POST", BASE, other)
        self.assertEqual(code, 409)
        self.assertIn("address 192.0.2.1 already belongs to device w1", body)

    def test_forgetIdentity_freesTheAddress(self) -> None:
        """
        A retired device's address is freed with its serial, uuid and MACs
        (refused before); the journal entry keeps what it was.
        """
        self.call("POST", BASE, {**W1_DOC, "address": "192.0.2.1"})
        self.successResultOf(
            self.inventory.setStatus("w1", DeviceStatus.DECOMMISSIONING, journal=[])
        )
        newcomer = {
            **W1_DOC,
            "name": "w9",
            "serial": "SN-9",
            "uuid": UUID3,
            "macs": [],
            "address": "192.0.2.1",
        }
        self.assertEqual(self.call("POST", BASE, newcomer)[0], 409)
        code, body = self.call(
            "POST", f"{BASE}/w1/forget-identity", {"reason": "rack moved"}
        )
        self.assertEqual(code, 200, body)
        self.assertNotIn("address", body)
        self.assertEqual(self.call("POST", BASE, newcomer)[0], 201)
        (entry,) = [
            e
            for e in self.successResultOf(self.journal.query())
            if e.event == "device.identity-forgotten"
        ]
        self.assertEqual(entry.fields["address"], "192.0.2.1")

    def test_import_addressColumn(self) -> None:
        """The CSV import takes the optional address column."""
        csv = (
            "name,serial,uuid,class,address\n"
            f"w1,SN-1,{UUID1},worker-g3,192.0.2.1\n"
            f"w2,SN-2,{UUID2},worker-g3,\n"
        )
        d = self.stub.request("POST", f"{BASE}/import", data=csv.encode())
        self.stub.flush()
        self.assertEqual(self.successResultOf(d).code, 200)
        devices = self.successResultOf(self.inventory.list())
        self.assertEqual([d.address for d in devices], ["192.0.2.1", None])


class CSVTests(SynchronousTestCase):
    """The CSV's optional C{address} column."""

    HEADER = "name,serial,uuid,class,address\n"

    def test_column_optionalAndCanonical(self) -> None:
        """An address cell is canonicalised; an empty one is no address."""
        devices = parseDeviceCSV(
            self.HEADER
            + f"w1,SN-1,{UUID1},worker,2001:DB8::1\n"
            + f"w2,SN-2,{UUID2},worker,\n"
        )
        self.assertEqual([d.address for d in devices], ["2001:db8::1", None])
        plain = parseDeviceCSV(f"name,serial,uuid,class\nw1,SN-1,{UUID1},worker\n")
        self.assertIsNone(plain[0].address)

    def test_badOrTwice_lineNumbered(self) -> None:
        """A bad address, or one listed twice, names its line."""
        for rows, message in [
            (
                f"w1,SN-1,{UUID1},worker,224.0.0.1\n",
                "line 2: address: 224.0.0.1 is a multicast address",
            ),
            (
                f"w1,SN-1,{UUID1},worker,192.0.2.1\n"
                f"w2,SN-2,{UUID2},worker,::ffff:192.0.2.1\n",
                "line 3: duplicate address 192.0.2.1 (first on line 2)",
            ),
        ]:
            with self.assertRaises(InventoryError) as caught:
                parseDeviceCSV(self.HEADER + rows)
            self.assertTrue(str(caught.exception).startswith(message), caught.exception)


class NetBoxAddressTests(SynchronousTestCase):
    """NetBox's primary IP is the device's address, without its prefix."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.fake = self.rig.fake

    def fetch(self, name: str) -> Any:
        self.rig.settle()
        return self.successResultOf(self.rig.inventory.get(name))

    def test_primaryIP_preferredFamily(self) -> None:
        """
        NetBox's C{primary_ip}: the IPv6 one unless the site prefers IPv4
        (C{PREFER_IPV4}); a device without one has no address.
        """
        ident = seedFake(self.fake, W1)
        self.assertIsNone(self.fetch("w1").address)
        self.fake.setPrimaryIP(ident, "192.0.2.1/24")
        self.assertEqual(self.fetch("w1").address, "192.0.2.1")
        self.fake.setPrimaryIP(ident, "2001:db8::1/64")
        self.assertEqual(self.fetch("w1").address, "2001:db8::1")
        self.fake.preferIPv4 = True
        self.assertEqual(self.fetch("w1").address, "192.0.2.1")

    def test_unusablePrimaryIP_deviceRefusedNamingIt(self) -> None:
        """
        A primary IP no node speaks from (loopback) is refused as any bad
        field of a NetBox device is: one line naming the device and field.
        """
        ident = seedFake(self.fake, W1)
        self.fake.setPrimaryIP(ident, "127.0.0.1/8")
        self.rig.settle()
        failure = self.failureResultOf(self.rig.inventory.get("w1"), InventoryError)
        self.assertEqual(
            str(failure.value),
            "NetBox device 'w1': address: 127.0.0.1 is a loopback address,"
            " not a node's own address",
        )

    def test_netboxDown_cachedListKeepsTheAddress(self) -> None:
        """The list answered from the cache while NetBox is down has it."""
        seedFake(self.fake, replace(W1, address="192.0.2.1"))
        self.rig.settle()
        listed = self.successResultOf(self.rig.inventory.list())
        self.rig.http.down = True
        cached = self.successResultOf(self.rig.inventory.list())
        self.assertEqual([d.address for d in cached], ["192.0.2.1"])
        self.assertEqual(cached, listed)

    def test_toDevice_withoutPrimaryIPKeys(self) -> None:
        """An answer without the primary IP keys at all gives no address."""
        data = {
            "id": 1,
            "name": "w1",
            "serial": "SN-0001",
            "status": {"value": "inventory"},
            "custom_fields": {"fleetd_uuid": UUID1, "fleetd_class": "worker-g3"},
        }
        self.assertIsNone(toDevice(data, []).address)


class HeadlineTests(SynchronousTestCase):
    """C{fleetctl status} and the device page name the address when set."""

    def test_headline(self) -> None:
        plain = {"device": W1.toJSON()}
        self.assertNotIn("address", headline(plain))
        placed = {"device": replace(W1, address="192.0.2.1").toJSON()}
        self.assertEqual(headline(placed), headline(plain) + "  address 192.0.2.1")
