"""
The end of a node's disk keys [E3].

L{KeyRetirement} is a part of the retirement
(L{fleetd.fleet.retire.IRetirementPart}): in the retirement's own
transaction it destroys every key of the device and journals each
C{kms.key-destroyed} [J1], so from that commit on no Unseal for the node
can succeed, after a restart too; after the commit the keys' ids are
appended to the destruction record outside the database
(L{fleetd.kms.record}), and the retirement's answer waits for that.

L{sweepAtStart} runs at start, before the KMS answers anything. A
restored older database may hold keys destroyed since it was copied (and,
with the embedded inventory, its devices' old statuses): in one
transaction, every live key the destruction record names is destroyed
again (C{restored-after-destruction}), and so are the keys of every
device the inventory holds as C{decommissioning}, each journaled; then
every key the database holds destroyed but the record lacks (a crash
between a commit and its append, or this sweep's) is appended. Until it
has run the KMS refuses every call C{starting}; it is tried again every
L{SWEEP_RETRY} seconds while the inventory or the database cannot be
asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import DeviceStatus, IInventory
from fleetd.kms import store
from fleetd.kms.reasons import DESTROYED
from fleetd.kms.record import Destroyed, destroyedRow
from fleetd.kms.service import DiskKeys
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder

RETIRED = "retired"
SWEPT = "decommissioned-at-start"
RESTORED = "restored-after-destruction"  # live again in a restored database
SWEEP_RETRY = 30.0


def destroyKeys(
    db: Database,
    journal: Recorder,
    device: str,
    *,
    actor: str,
    at: float,
    why: str,
) -> list[Destroyed]:
    """Destroy C{device}'s live keys in the caller's transaction, each
    with its C{kms.key-destroyed} entry; return them as the destruction
    record's lines."""
    return _destroy(db, journal, store.liveKeys(db, device), actor, at, why)


def _destroy(
    db: Database,
    journal: Recorder,
    rows: list[store.KeyRow],
    actor: str,
    at: float,
    why: str,
) -> list[Destroyed]:
    for row in rows:
        store.destroyKey(db, row.id, at, why)
        journal(
            "kms.key-destroyed",
            actor=actor,
            device=row.device,
            run=row.generation or None,
            fields={"kek_id": row.id, "why": why},
        )
    return [destroyedRow(row, why, at) for row in rows]


class KeyRetirement:
    """The retirement's part for disk keys (L{fleetd.fleet.retire.IRetirementPart})."""

    answerKey = "disk_keys"

    def __init__(self, keys: DiskKeys) -> None:
        self.keys = keys
        self.metrics = keys.metrics
        self._views: dict[str, dict[str, Any]] = {}
        self._appends: dict[str, Deferred[bool]] = {}

    def recordRetirement(
        self, db: Database, journal: Recorder, device: str, actor: str, at: float
    ) -> tuple[str, list[Destroyed], bool]:
        """[E3] Destroy the device's keys in the retirement's transaction."""
        had = bool(store.keysOf(db, device))
        destroyed = destroyKeys(db, journal, device, actor=actor, at=at, why=RETIRED)
        return device, destroyed, had

    def committed(self, recorded: tuple[str, list[Destroyed], bool]) -> None:
        device, destroyed, had = recorded
        if destroyed:
            self.metrics.destroyed.labels(RETIRED).inc(len(destroyed))
        if had:
            self.keys.watch.state(device, DESTROYED)
        self._views[device] = {
            "state": "destroyed",
            "destroyed": [entry.kek_id for entry in destroyed],
        }
        self._appends[device] = self.keys.record.add(destroyed)

    def settled(self, devices: Sequence[str]) -> Deferred[None]:
        """Once the destroyed keys' ids are in the destruction record (or
        that append's first try failed: it is retried)."""
        waits = []
        for device in devices:
            append = self._appends.pop(device, None)
            if append is not None:
                waits.append(append.addCallback(self._recorded, device))
        return gatherResults(waits).addCallback(lambda _: None)

    def _recorded(self, ok: bool, device: str) -> None:
        view = self._views.get(device)
        if view is not None:
            view["recorded"] = ok

    def view(self, device: str) -> dict[str, Any] | None:
        """What the retirement did to C{device}'s keys (this process):
        C{recorded} says whether their ids are in the destruction record."""
        return self._views.get(device)


@dataclass(frozen=True)
class Swept:
    """What the start-up sweep did and found."""

    restored: list[Destroyed]  # live again in a restored database
    decommissioned: list[Destroyed]  # of devices held as decommissioning
    unrecorded: list[Destroyed]  # destroyed here, missing from the record
    states: dict[str, str]  # each device with keys: sealed or destroyed


async def sweepAtStart(
    inventory: IInventory,
    journal: AsyncJournal,
    clock: IReactorTime,
    recorded: frozenset[str],
) -> Swept:
    """
    [E3] In one transaction, with their entries: destroy every live key
    whose id is in C{recorded} (the destruction record's), and the keys of
    every device the inventory holds as C{decommissioning}; then read the
    destroyed keys C{recorded} lacks, and each device's key state.
    """
    devices = await inventory.list()
    gone = {d.name for d in devices if d.status is DeviceStatus.DECOMMISSIONING}
    at = clock.seconds()

    def work(db: Database, record: Recorder) -> Swept:
        again = store.liveKeysAmong(db, recorded)
        restored = _destroy(db, record, again, "fleetd", at, RESTORED)
        swept: list[Destroyed] = []
        for device in store.devicesWithLiveKeys(db):
            if device in gone:
                swept += destroyKeys(
                    db, record, device, actor="fleetd", at=at, why=SWEPT
                )
        unrecorded = [destroyedRow(r) for r in store.destroyedKeysNotIn(db, recorded)]
        return Swept(restored, swept, unrecorded, store.keyStates(db))

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
        d = Deferred.fromCoroutine(self._run())
        return d.addErrback(self._failed)

    async def _run(self) -> None:
        keys = self.keys
        swept = await sweepAtStart(
            self.inventory, self.journal, self.clock, keys.record.ids()
        )
        for why, entries in ((RESTORED, swept.restored), (SWEPT, swept.decommissioned)):
            if entries:
                keys.metrics.destroyed.labels(why).inc(len(entries))
        keys.watch.states(swept.states)
        # Before the KMS answers: what the record lacks (a failure is
        # retried by the record, and raises FleetDiskKeyDestructionUnrecorded).
        recorded = await keys.record.add(swept.unrecorded)
        self.log.info(
            "kms.swept restored={restored} decommissioned={decommissioned}"
            " appended={appended} recorded={recorded}",
            restored=len(swept.restored), decommissioned=len(swept.decommissioned),
            appended=len(swept.unrecorded), recorded=recorded,
        )  # fmt: skip
        keys.ready = True
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
        self.keys.record.stop()
