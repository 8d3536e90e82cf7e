"""
The end of a node's disk keys [E3].

L{KeyRetirement} is a part of the retirement
(L{fleetd.fleet.retire.IRetirementPart}): in the retirement's own
transaction it destroys every key of the device and journals each
C{kms.key-destroyed} [J1], so from that commit on no Unseal for the node
can succeed, after a restart too.

L{sweepDecommissioned} runs at start, before the KMS answers anything: a
restored older backup may hold keys of devices retired since; the keys of
every device the inventory holds as C{decommissioning} are destroyed, and
journaled, in one transaction. Until it has run the KMS refuses every
call C{starting}; it is tried again every L{SWEEP_RETRY} seconds while the
inventory or the database cannot be asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import DeviceStatus, IInventory
from fleetd.kms import store
from fleetd.kms.reasons import KMSMetrics
from fleetd.kms.service import DiskKeys
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder

RETIRED = "retired"
SWEPT = "decommissioned-at-start"
SWEEP_RETRY = 30.0


def destroyKeys(
    db: Database,
    journal: Recorder,
    device: str,
    *,
    actor: str,
    at: float,
    why: str,
) -> list[str]:
    """Destroy C{device}'s live keys in the caller's transaction, each
    with its C{kms.key-destroyed} entry; return their ids."""
    destroyed = []
    for row in store.liveKeys(db, device):
        store.destroyKey(db, row.id, at, why)
        journal(
            "kms.key-destroyed",
            actor=actor,
            device=device,
            run=row.generation or None,
            fields={"kek_id": row.id, "why": why},
        )
        destroyed.append(row.id)
    return destroyed


class KeyRetirement:
    """The retirement's part for disk keys (L{fleetd.fleet.retire.IRetirementPart})."""

    answerKey = "disk_keys"

    def __init__(self, metrics: KMSMetrics) -> None:
        self.metrics = metrics
        self._views: dict[str, dict[str, Any]] = {}

    def recordRetirement(
        self, db: Database, journal: Recorder, device: str, actor: str, at: float
    ) -> tuple[str, list[str]]:
        """[E3] Destroy the device's keys in the retirement's transaction."""
        return device, destroyKeys(db, journal, device, actor=actor, at=at, why=RETIRED)

    def committed(self, recorded: tuple[str, list[str]]) -> None:
        device, destroyed = recorded
        if destroyed:
            self.metrics.destroyed.labels(RETIRED).inc(len(destroyed))
        self._views[device] = {"state": "destroyed", "destroyed": list(destroyed)}

    def settled(self, devices: Sequence[str]) -> Deferred[None]:
        """Nothing waits: the keys went with the commit."""
        return succeed(None)

    def view(self, device: str) -> dict[str, Any] | None:
        """What the retirement did to C{device}'s keys (this process)."""
        return self._views.get(device)


async def sweepDecommissioned(
    inventory: IInventory, journal: AsyncJournal, clock: IReactorTime
) -> list[str]:
    """
    [E3] Destroy the keys of every device the inventory holds as
    C{decommissioning}, in one transaction with their entries; return the
    key ids destroyed.
    """
    devices = await inventory.list()
    gone = {d.name for d in devices if d.status is DeviceStatus.DECOMMISSIONING}
    at = clock.seconds()

    def work(db: Database, record: Recorder) -> list[str]:
        destroyed: list[str] = []
        for device in store.devicesWithLiveKeys(db):
            if device in gone:
                destroyed += destroyKeys(
                    db, record, device, actor="fleetd", at=at, why=SWEPT
                )
        return destroyed

    return await journal.change(work)


class SweepService(Service):
    """Run the start-up sweep, then let L{DiskKeys} answer."""

    log = Logger()

    def __init__(
        self,
        keys: DiskKeys,
        inventory: IInventory,
        journal: AsyncJournal,
        clock: IReactorTime,
    ) -> None:
        self.keys = keys
        self.inventory = inventory
        self.journal = journal
        self.clock = clock
        self._retry: IDelayedCall | None = None
        self.swept: Deferred[None] = Deferred()  # fires once it has run

    def startService(self) -> None:
        super().startService()
        self.keys.runner.run(store.secureDelete).addErrback(self._pragmaFailed)

    def _pragmaFailed(self, failure: Failure) -> None:
        self.log.failure("kms.secure-delete-not-set", failure=failure)

    def begin(self) -> Deferred[None]:
        """The first sweep (once the runs are loaded, so the KMS knows
        every uuid when it starts answering); fires once it was tried. A
        failed sweep is tried again every L{SWEEP_RETRY} seconds."""
        return self._sweep()

    def _sweep(self) -> Deferred[None]:
        self._retry = None
        d = Deferred.fromCoroutine(
            sweepDecommissioned(self.inventory, self.journal, self.clock)
        )
        return d.addCallbacks(self._done, self._failed)

    def _done(self, destroyed: list[str]) -> None:
        if destroyed:
            self.keys.metrics.destroyed.labels(SWEPT).inc(len(destroyed))
        self.log.info("kms.swept {destroyed}", destroyed=len(destroyed))
        self.keys.ready = True
        if not self.swept.called:
            self.swept.callback(None)

    def _failed(self, failure: Failure) -> None:
        self.log.failure("kms.sweep-failed", failure=failure)
        if self.running:
            self._retry = self.clock.callLater(SWEEP_RETRY, self._sweep)

    def stopService(self) -> None:
        super().stopService()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
