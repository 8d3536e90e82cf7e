"""
One run: its record, its delivery machine (L{fleetd.runs.machine}), and
the effects the machine asks for.

The effects need only what L{RunCore} holds (the clock, the vault, the
releaser, the notes, the delivery observers and a log), never the
registry that indexes the run: as twisted's C{_ClientServiceStateCore}
is to C{ClientService}'s machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.inventory.model import ServedRecord
from fleetd.runs.alerts import MISSING, REFETCHED
from fleetd.runs.machine import RunEffects, RunInputs, RunMachine
from fleetd.runs.notes import RunNotes
from fleetd.runs.releaser import Releaser
from fleetd.runs.store import RunRecord
from fleetd.runs.vaultnames import codeName, configName, servedJSON, servedName
from fleetd.vault import IVault, VaultError

ABORT_JOURNAL_EVERY = 600.0


@dataclass(frozen=True)
class RunCore:
    """What every run's effects share."""

    clock: IReactorTime
    vault: IVault
    releaser: Releaser
    notes: RunNotes
    # Called with a run's record when its configuration was delivered
    # (boot completion [B1] listens here).
    observers: list[Callable[[RunRecord], None]]
    log: Logger

    def notifyDelivered(self, record: RunRecord) -> None:
        for observer in list(self.observers):
            try:
                observer(record)
            except Exception:
                self.log.failure("runs.delivery-observer.failed {run}", run=record.id)


class Run(RunEffects):
    """One run: its record, its machine, and the effects the machine asks for."""

    # One per run, 50,000 and more held for the process's life: no __dict__.
    __slots__ = (
        "_abortJournaledAt",
        "_aborts",
        "_machine",
        "_ready",
        "_served",
        "core",
        "record",
        "servedPeer",
    )

    def __init__(self, core: RunCore, record: RunRecord) -> None:
        self.core = core
        self.record = record
        self.servedPeer = ""  # who holds the served mark: the journal names them
        self._served: ServedRecord | None = None  # the mark as written
        self._aborts = 0
        self._abortJournaledAt = float("-inf")
        self._machine: RunInputs | None = None
        self._ready = False  # restored ready, machine not made yet

    @property
    def machine(self) -> RunInputs:
        """
        The run's delivery machine, made when first used: after a start
        nearly every run is ready and waits, often for hours, and 50,000
        machines made at once cost 10 MB and a quarter of a second.
        """
        machine = self._machine
        if machine is None:
            machine = self._machine = RunMachine(self)
            if self._ready:
                machine.restoreReady()
        return machine

    def restoredReady(self) -> None:
        """The machine's C{restoreReady}, applied when the machine is made."""
        if self._machine is None:
            self._ready = True
        else:
            self._machine.restoreReady()

    def deliverable(self) -> bool:
        if self._machine is None and self._ready:
            return True
        return self.machine.deliverable()

    def configDelivered(self) -> bool:
        if self._machine is None and self._ready:
            return False
        return self.machine.configDelivered()

    def describe(self) -> str:
        if self._machine is None and self._ready:
            return "ready"
        return self.machine.describe()

    @property
    def vault(self) -> IVault:
        return self.core.vault

    # RunEffects
    def markServed(self, peer: str) -> None:
        self.servedPeer = peer
        served = ServedRecord(
            self.record.id, self.record.device, self.core.clock.seconds(), peer
        )
        self._served = None
        self.core.vault.put(servedName(self.record.id), servedJSON(served))
        self._served = served

    def dropMark(self) -> None:
        # The write failed; a partial file must not survive to mean "served".
        try:
            self.core.vault.delete(servedName(self.record.id))
        except VaultError:
            self.core.log.failure("runs.mark.cleanup-failed {run}", run=self.record.id)

    def withdrawServed(self) -> None:
        self.core.vault.delete(servedName(self.record.id))
        self._served = None
        # Anyone holding a code can abort deliveries at will: one entry per
        # run per ABORT_JOURNAL_EVERY seconds, counting the ones between.
        self._aborts += 1
        now = self.core.clock.seconds()
        if now - self._abortJournaledAt >= ABORT_JOURNAL_EVERY:
            self.core.notes.event(
                "run.delivery-aborted",
                self.record,
                peer=self.servedPeer,
                aborts=str(self._aborts),
            )
            self._aborts, self._abortJournaledAt = 0, now

    def delivered(self) -> None:
        # Never served again: once the delivery is recorded, the secret
        # leaves the vault; the mark stays.
        core = self.core
        core.releaser.release(self.servedRecord(), onRecorded=self.dropConfig)
        core.notifyDelivered(self.record)

    def deliveredSuperseded(self) -> None:
        # The owner already replaced this run: record the delivery, release
        # nothing (the device stays as the newer run set it).
        self.core.releaser.release(
            self.servedRecord(), superseded=True, onRecorded=self.dropFiles
        )

    def noteRefetch(self, peer: str) -> None:
        self.core.notes.request(
            self, "refetch_noted", REFETCHED, "config.refetched", peer
        )

    def noteMissing(self, peer: str) -> None:
        self.core.notes.request(self, "missing_noted", MISSING, "config.missing", peer)

    def dropConfig(self) -> None:
        vault = self.core.vault
        vault.delete(configName(self.record.id))
        vault.delete(codeName(self.record.id))

    def dropAll(self) -> None:
        self.dropConfig()
        # A delivery not yet recorded keeps its served mark until it is
        # (J1: files go only after the commit that retires them).
        if not self.core.releaser.supersede(self.record.id, self.dropFiles):
            self.dropFiles()

    def dropFiles(self) -> None:
        vault = self.core.vault
        vault.delete(configName(self.record.id))
        vault.delete(codeName(self.record.id))
        vault.delete(servedName(self.record.id))

    def servedRecord(self) -> ServedRecord:
        if self._served is not None:  # written by this process: no need to read
            return self._served
        raw = self.core.vault.get(servedName(self.record.id))
        doc = json.loads(raw) if raw else {}
        return ServedRecord(
            run=self.record.id,
            device=self.record.device,
            served_at=float(doc.get("served_at", self.core.clock.seconds())),
            peer=str(doc.get("peer", self.servedPeer)),
        )
