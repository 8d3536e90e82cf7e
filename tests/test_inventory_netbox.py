"""
The L{IInventory} contract run against the NetBox inventory over the fake
NetBox (L{fleetd.testing.netbox}), and what is particular to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory import Device, IInventory
from tests.netbox_support import NetBoxRig, seedFake
from tests.test_inventory import W1, InventoryContractMixin

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
