"""
The L{IInventory} contract run against the NetBox inventory over the fake
NetBox (L{fleetd.testing.netbox}), and what is particular to it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory import Device, DeviceStatus, IInventory
from tests.inventorysupport import W1, W2
from tests.netbox_support import NetBoxRig, seedFake
from tests.test_inventory import InventoryContractMixin

_T = TypeVar("_T")


class NetBoxInventoryContractTests(InventoryContractMixin, SynchronousTestCase):
    """The shared contract, against L{NetBoxInventory} and the fake NetBox."""

    def openInventory(self) -> IInventory:
        if not hasattr(self, "rig"):
            self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
            self.addCleanup(self.rig.close)
            return self.rig.inventory
        return self.rig.open()

    def seed(self, *devices: Device) -> None:
        for device in devices:
            seedFake(self.rig.fake, device)

    def ok(self, d: Deferred[_T]) -> _T:
        self.rig.settle()
        return self.successResultOf(d)

    def test_add_refused(self) -> None:
        """With NetBox, devices are created in NetBox: add and import refuse."""
        for d in (
            self.rig.inventory.add(W1, journal=()),
            self.rig.inventory.importDevices([W1], journal=()),
        ):
            error = self.refused(d, "invalid")
            self.assertIn("added in NetBox", str(error))
        self.assertEqual(self.rig.fake.devices, {})

    def test_forgetIdentity_refused(self) -> None:
        """With NetBox a device's identity is NetBox's: fleetd changes nothing."""
        self.seed(W1)
        error = self.refused(self.inventory.forgetIdentity("w1", journal=[]), "invalid")
        self.assertIn("NetBox", str(error))
        self.assertEqual(self.ok(self.inventory.get("w1")), W1)

    def test_bySerial_severalNamedThem(self) -> None:
        """
        design.md, NetBox: several NetBox devices with one serial (in any case) are
        a duplicate error naming them, not the first one found.
        """
        self.seed(W1)
        seedFake(self.rig.fake, replace(W2, serial="sn-0001"))
        d = self.rig.inventory.bySerial("SN-0001")
        self.rig.settle()
        error = self.refused(d, "duplicate")
        self.assertIn("w1, w2", str(error))

    def test_bySerial_asksNetBoxForThatSerialOnly(self) -> None:
        """
        M5: a serial lookup filters by serial in NetBox and reads one
        device's interfaces; it never lists the whole fleet.
        """
        self.seed(W1, W2)
        asked: list[tuple[str, dict[str, Any]]] = []
        listAll = self.rig.client.listAll

        async def spy(path: str, params: Any = None) -> list[dict[str, Any]]:
            asked.append((path, dict(params or {})))
            return await listAll(path, params)

        self.rig.client.listAll = spy  # type: ignore[method-assign]
        self.assertEqual(self.ok(self.rig.inventory.bySerial("sn-0002")), W2)
        self.assertEqual([sorted(p) for _, p in asked], [["serial"], ["device_id"]])

    def test_bySerial_notAFleetDeviceIsNone(self) -> None:
        """A NetBox device without fleetd_class is not fleetd's: None."""
        self.rig.fake.addDevice("pdu1", "SN-PDU")
        self.assertIsNone(self.ok(self.rig.inventory.bySerial("SN-PDU")))

    def test_bySerial_netboxDown_neverFromCache(self) -> None:
        """
        Item 11: NetBox down, bySerial fails C{unavailable} for a listed
        serial and an unknown one alike: it decides credentials, so it
        never answers from the list NetBox last gave (list still does).
        """
        self.seed(W1, W2)
        self.ok(self.rig.inventory.list())
        self.rig.http.down = True
        self.refused(self.rig.inventory.bySerial("SN-0002"), "unavailable")
        self.refused(self.rig.inventory.bySerial("SN-404"), "unavailable")
        self.assertEqual(self.ok(self.rig.inventory.list()), [W1, W2])

    def test_bySerial_overlaysPendingStatus(self) -> None:
        """
        [J1] A status fleetd committed but has not pushed yet shows in
        bySerial (the outbox overlays NetBox's answer), as in get.
        """
        ident = seedFake(self.rig.fake, W1)
        self.successResultOf(self.rig.worker.stop())
        self.successResultOf(
            self.rig.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        self.assertEqual(self.rig.fake.devices[ident]["status"], "inventory")
        found = self.ok(self.rig.inventory.bySerial("SN-0001"))
        assert found is not None
        self.assertEqual(found.status, DeviceStatus.PLANNED)


class ServedAtManyTests(SynchronousTestCase):
    """servedAt over more names than one SQL parameter list holds."""

    def test_servedAt_manyNames(self) -> None:
        """
        Both backends answer servedAt for 1,200 names (lists of 500 host
        parameters each): every device with a release, none without.
        """
        from fleetd.netbox import outbox
        from fleetd.store import Database, InlineRunner
        from tests.support import inventoryOver

        db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(db.close)
        names = [f"w{i}" for i in range(1200)]
        with db.transaction() as conn:
            conn.executemany(
                "INSERT INTO netbox_outbox (device, status, run, served_at,"
                " created_at) VALUES (?, 'staged', ?, ?, 0)",
                [(n, f"run-{n}", float(i)) for i, n in enumerate(names) if i % 3],
            )
            conn.executemany(
                "INSERT INTO devices (name, serial, uuid, class, status)"
                " VALUES (?, ?, ?, 'worker', 'staged')",
                [(n, f"S{n}", f"u{n}") for n in names],
            )
            conn.executemany(
                "INSERT INTO served_records (run, device, served_at, peer)"
                " VALUES (?, ?, ?, 'p')",
                [(f"run-{n}", n, float(i)) for i, n in enumerate(names) if i % 3],
            )
        expected = {n: float(i) for i, n in enumerate(names) if i % 3}
        self.assertEqual(outbox.servedAt(db, names), expected)
        local = inventoryOver(InlineRunner(db)).servedAt(names)
        self.assertEqual(self.successResultOf(local), expected)
