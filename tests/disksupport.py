"""Disk reports for [D1] tests: two nodes, a disk builder, a fleet's disk service."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.nodes import NodeIdentity
from fleetd.trust.disk_report import Disk
from fleetd.trust.disks import DiskService, diskRefusal, targetDiskFor
from tests.fleetsupport import Fleet

GB = 10**9


W1 = NodeIdentity("w1", "SER1")


W2 = NodeIdentity("w2", "SER2")


def d(name: str, serial: str | None, size: int = 500 * GB, **kw: Any) -> Disk:
    return Disk(name, serial, kw.get("wwn"), size, kw.get("removable", False))


class DiskFleet:
    def __init__(self, test: SynchronousTestCase) -> None:
        self.test = test
        self.fleet = Fleet(test)
        self.service = DiskService(
            self.fleet.runner, self.fleet.journal, self.fleet.clock
        )

    def report(self, identity: NodeIdentity, *disks: Disk) -> Any:
        coroutine = self.service.report(identity, list(disks))
        return self.test.successResultOf(Deferred.fromCoroutine(coroutine))

    def target(self, device: str) -> str | None:
        with self.fleet.db.transaction(write=False) as conn:
            return targetDiskFor(conn, device)

    def refusal(self, device: str) -> str:
        with self.fleet.db.transaction(write=False) as conn:
            return diskRefusal(conn, device)

    def entries(self) -> list[tuple[str, str | None, dict[str, Any]]]:
        found = self.test.successResultOf(self.fleet.journal.query())
        return [(e.event, e.device, dict(e.fields)) for e in found]
