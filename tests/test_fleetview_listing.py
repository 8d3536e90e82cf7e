"""
The fleet view reads the inventory once for many pages where a listing is
dear (NetBox): a listing serves pages for C{listingAge} seconds, pages asked
for meanwhile share one read, and a failed read is every waiter's failure
and is not kept (issue 20 item 2: fast at 10,000 devices, and NetBox not
walked on every refresh).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.fleet.view import FleetQuery, FleetView
from fleetd.inventory.model import InventoryError, validateDevice

UUID = "4c4c4544-0042-3510-8050-b4c04f4d32{:02d}"


class _Inventory:
    """Answers L{list} with a Deferred the test fires; counts the reads."""

    def __init__(self) -> None:
        self.reads: list[Deferred[Any]] = []

    def list(self) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.reads.append(d)
        return d


class _Runs:
    def views(self, names: list[str]) -> Deferred[dict[str, Any]]:
        return Deferred.fromCoroutine(self._none())

    async def _none(self) -> dict[str, Any]:
        return {}


class _Alerts:
    def openFor(self, name: str) -> list[str]:
        return []


class _Flow:
    def pending(self) -> list[Any]:
        return []


def devices(n: int) -> list[Any]:
    return [
        validateDevice(
            name=f"w{i}", serial=f"S{i}", uuid=UUID.format(i), device_class="worker"
        )
        for i in range(n)
    ]


class ListingAgeTests(SynchronousTestCase):
    def view(self, age: float) -> tuple[FleetView, _Inventory, Clock]:
        clock, inventory = Clock(), _Inventory()
        view = FleetView(inventory, _Runs(), _Alerts(), _Flow(), clock,  # type: ignore[arg-type]
                         listingAge=age)  # fmt: skip
        return view, inventory, clock

    def page(self, view: FleetView) -> Deferred[Any]:
        return Deferred.fromCoroutine(view.page(FleetQuery()))

    def test_pagesWhileReading_shareOneRead(self) -> None:
        view, inventory, _ = self.view(10.0)
        first, second = self.page(view), self.page(view)
        self.assertEqual(len(inventory.reads), 1)
        inventory.reads[0].callback(devices(3))
        self.assertEqual(self.successResultOf(first).total, 3)
        self.assertEqual(self.successResultOf(second).total, 3)

    def test_listingServesPagesForItsAge_thenReadAgain(self) -> None:
        view, inventory, clock = self.view(10.0)
        d = self.page(view)
        inventory.reads[0].callback(devices(2))
        self.assertEqual(self.successResultOf(d).listedAt, 0.0)
        clock.advance(9.9)
        self.assertEqual(self.successResultOf(self.page(view)).total, 2)
        self.assertEqual(len(inventory.reads), 1)
        clock.advance(0.1)
        d = self.page(view)
        self.assertEqual(len(inventory.reads), 2)
        inventory.reads[1].callback(devices(4))
        page = self.successResultOf(d)
        self.assertEqual((page.total, page.listedAt), (4, 10.0))

    def test_noAge_everyPageReads(self) -> None:
        """SQLite's own listing is exact and cheap: no age, no date shown."""
        view, inventory, _ = self.view(0.0)
        d = self.page(view)
        inventory.reads[0].callback(devices(1))
        self.assertIsNone(self.successResultOf(d).listedAt)
        self.page(view)
        self.assertEqual(len(inventory.reads), 2)

    def test_failedRead_everyWaiterFails_notKept(self) -> None:
        view, inventory, _ = self.view(10.0)
        first, second = self.page(view), self.page(view)
        inventory.reads[0].errback(InventoryError("netbox down", "unavailable"))
        self.failureResultOf(first, InventoryError)
        self.failureResultOf(second, InventoryError)
        self.page(view)
        self.assertEqual(len(inventory.reads), 2)
