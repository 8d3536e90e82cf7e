"""
The fleet by status, for Prometheus, counted in the background.

  - C{fleetd_devices{status}}: how many devices the inventory holds in
    each status (every L{DeviceStatus}, 0 included).
  - C{fleetd_staged_longest_seconds}, only where fleetd approves kubelet
    certificates (C{[kubernetes]}; without it C{staged} is where a node's
    path ends): how long the device that has been C{staged} longest has
    waited since its configuration was delivered (the release that made
    it C{staged}) for its first kubelet certificate; 0 when none waits.
    C{FleetNodeStagedTooLong} watches it. One series, not one per
    device: the alert says that a node waits and for how long, the fleet
    view filtered on C{staged} (or C{fleetctl device list}) says which.

A scrape never lists the inventory: over NetBox a listing walks NetBox's
device and interface pages. L{Census} counts every C{interval} seconds,
beginning once the start-up load settled, and the gauges show the last
count. The staged time is measured at each scrape from the oldest
delivery the last count found, so it grows between counts; a device
approved since drops out at the next count. A count that fails keeps
the last one and is logged (C{census.failed}). A device set C{staged} by
hand (no released delivery in fleetd's database) is counted by status
but has no staged time.
"""

from __future__ import annotations

import math
from collections import Counter

from prometheus_client import CollectorRegistry, Gauge
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import DeviceStatus, IInventory, InventoryError
from fleetd.periodic import After, PeriodicAfter

# Seconds between counts: the embedded inventory keeps its listing until it
# changes, so a count is cheap; a NetBox listing walks NetBox's pages (some
# 150 requests at 50,000 devices), so it is counted less often.
LOCAL_INTERVAL = 60.0
REMOTE_INTERVAL = 300.0


class Census(Service):
    """Count the inventory's devices by status every C{interval} seconds."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        inventory: IInventory,
        registry: CollectorRegistry | None,
        *,
        interval: float = LOCAL_INTERVAL,
        staged: bool = False,
        after: After | None = None,
    ) -> None:
        """
        @param staged: export C{fleetd_staged_longest_seconds} (fleetd
            approves kubelet certificates: C{[kubernetes]} is set).
        @param after: called at start with a function that begins the
            counts; L{None} begins them at once. fleetd passes
            L{fleetd.readiness.Readiness.whenSettled}, so the first count
            does not compete with the run load.
        """
        self._clock = clock
        self._inventory = inventory
        self._staged = staged
        self.interval = interval
        self._periodic = PeriodicAfter(clock, self.count, after=after)
        self._counted = False
        self._oldest: float | None = None  # served_at of the longest staged
        self._devices = Gauge(
            "fleetd_devices",
            "Devices in the inventory by status, as of the last count (every"
            " minute; every 5 minutes over NetBox).",
            ["status"],
            registry=registry,
        )
        if staged:
            Gauge(
                "fleetd_staged_longest_seconds",
                "Seconds the longest-staged device has waited since its"
                " configuration was delivered for its first kubelet certificate;"
                " 0 when none waits (FleetNodeStagedTooLong).",
                registry=registry,
            ).set_function(self.longestStaged)

    def longestStaged(self) -> float:
        """
        Seconds the longest-staged device has waited, at the clock's time
        now; 0 when none waits, NaN before the first count.
        """
        if not self._counted:
            return math.nan
        if self._oldest is None:
            return 0.0
        return max(0.0, self._clock.seconds() - self._oldest)

    @property
    def _loop(self) -> LoopingCall | None:
        """The counts' loop, while they go on."""
        return self._periodic.loop

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._periodic.start(self.interval)

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        self._periodic.stop()

    def count(self) -> Deferred[None]:
        """Count once; the gauges follow. Never fails (a failure is logged)."""
        return Deferred.fromCoroutine(self._count()).addErrback(self._failed)

    async def _count(self) -> None:
        devices = await self._inventory.list()
        oldest = None
        if self._staged:
            names = [d.name for d in devices if d.status is DeviceStatus.STAGED]
            served = await self._inventory.servedAt(names) if names else {}
            oldest = min(served.values(), default=None)
        counts = Counter(d.status for d in devices)
        for status in DeviceStatus:
            self._devices.labels(status.value).set(counts[status])
        self._oldest, self._counted = oldest, True

    def _failed(self, failure: Failure) -> None:
        if not failure.check(InventoryError):
            self.log.failure("census.failed", failure=failure)
            return
        self.log.warn(
            "census.failed {reason}: fleetd_devices keeps the last count",
            reason=failure.getErrorMessage(),
        )
