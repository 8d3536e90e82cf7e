"""
The run registry: every run's delivery machine, indexed for the boot path.

Lookups on the boot listener are synchronous and in memory (a dict from
code digest to run), so deciding and marking a delivery happens in one
reactor turn: concurrent requests for one code cannot both be served [C1].
Persistence goes through the database runner; the vault holds each ready
run's configuration (C{<run>.yaml}) and, once delivery starts, its
served-config record (C{<run>.served}).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from twisted.internet.defer import Deferred, DeferredLock, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import Device, DeviceStatus, IInventory, ServedRecord
from fleetd.runs.alerts import MISSING, REFETCHED, AlertTracker
from fleetd.runs.codes import codeDigest, mintCode, mintRunId
from fleetd.runs.machine import Outcome, RunEffects, RunInputs, RunMachine
from fleetd.runs.releaser import Releaser
from fleetd.runs.store import RunRecord, insertRuns, loadRuns, noteRun
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner
from fleetd.vault import IVault, VaultError

_RUN_FILE = re.compile(r"^(r-[0-9a-f]{16})\.(yaml|served)$")


def configName(run: str) -> str:
    return f"{run}.yaml"


def servedName(run: str) -> str:
    return f"{run}.served"


@dataclass(frozen=True)
class Provisioned:
    """A new run, with the code shown to the owner exactly once."""

    run: str
    code: str = field(repr=False)
    device: str

    def toJSON(self) -> dict[str, str]:
        return {"run": self.run, "code": self.code, "device": self.device}


class _Run(RunEffects):
    """One run: its record, its machine, and the effects the machine asks for."""

    def __init__(self, registry: RunRegistry, record: RunRecord) -> None:
        self.registry = registry
        self.record = record
        self.servedPeer = ""  # who holds the served mark: the journal names them
        self.machine: RunInputs = RunMachine(self)

    @property
    def vault(self) -> IVault:
        return self.registry.vault

    # RunEffects
    def markServed(self, peer: str) -> None:
        self.servedPeer = peer
        record = {
            "run": self.record.id,
            "device": self.record.device,
            "served_at": self.registry.clock.seconds(),
            "peer": peer,
        }
        self.vault.put(servedName(self.record.id), json.dumps(record).encode("utf-8"))

    def withdrawServed(self) -> None:
        self.vault.delete(servedName(self.record.id))
        self.registry.journalEvent("run.delivery-aborted", self, peer=self.servedPeer)

    def delivered(self) -> None:
        self.registry.journalEvent("run.delivered", self, peer=self.servedPeer)
        self.registry.releaser.release(self.servedRecord())
        # Never served again: the secret leaves the vault, the mark stays.
        self.vault.delete(configName(self.record.id))

    def deliveredSuperseded(self) -> None:
        # The owner already replaced this run: record the delivery, release
        # nothing (the device stays as the newer run set it).
        self.registry.journalEvent(
            "run.delivered", self, peer=self.servedPeer, superseded="true"
        )
        self.dropAll()

    def noteRefetch(self, peer: str) -> None:
        self.registry.noteFirst(
            self, "refetch_noted", REFETCHED, "config.refetched", peer
        )

    def noteMissing(self, peer: str) -> None:
        self.registry.noteFirst(self, "missing_noted", MISSING, "config.missing", peer)

    def dropConfig(self) -> None:
        self.vault.delete(configName(self.record.id))

    def dropAll(self) -> None:
        self.registry.releaser.cancel(self.record.id)
        self.vault.delete(configName(self.record.id))
        self.vault.delete(servedName(self.record.id))

    def servedRecord(self) -> ServedRecord:
        raw = self.vault.get(servedName(self.record.id))
        doc = json.loads(raw) if raw else {}
        return ServedRecord(
            run=self.record.id,
            device=self.record.device,
            served_at=float(doc.get("served_at", self.registry.clock.seconds())),
            peer=str(doc.get("peer", self.servedPeer)),
        )


class NotReady(Exception):
    """The registry is still loading; try again shortly."""


class RunRegistry:
    """All runs of this fleetd, and the decisions of the boot path."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        vault: IVault,
        runner: IRunner,
        inventory: IInventory,
        journal: AsyncJournal,
        alerts: AlertTracker,
        codeKey: bytes,
    ) -> None:
        self.clock = clock
        self.vault = vault
        self.runner = runner
        self.inventory = inventory
        self.journal = journal
        self.alerts = alerts
        self._codeKey = codeKey
        self._runs: dict[str, _Run] = {}
        self._byDigest: dict[str, _Run] = {}
        self._current: dict[str, _Run] = {}
        self._identity: dict[str, tuple[str, str]] = {}
        self._provisioning = DeferredLock()
        self.loaded = False
        self.releaser = Releaser(clock, inventory, journal)

    async def load(self) -> None:
        """Rebuild every run's state from the database, vault and inventory."""
        records = await self.runner.run(loadRuns)
        released = await self.inventory.releasedRuns()
        for device in await self.inventory.list():
            self._identity[device.name] = (device.uuid, device.serial)
        names = set(self.vault.names())
        for record in records:
            run = self._add(record)
            if record.superseded_by is not None:
                run.machine.restoreSuperseded()
                self.vault.delete(configName(record.id))
                self.vault.delete(servedName(record.id))
            elif servedName(record.id) in names:
                run.machine.restoreConsumed()
                self.vault.delete(configName(record.id))
                if record.id not in released:
                    # Delivered, but the release did not finish before we stopped.
                    self.releaser.release(run.servedRecord())
            elif record.id in released:
                run.machine.restoreConsumed()
            elif configName(record.id) in names:
                run.machine.restoreReady()
            else:
                run.machine.restoreLost()
        self._dropOrphans(names)
        self.loaded = True
        self.log.info(
            "runs.loaded {runs} runs, {ready} ready",
            runs=len(self._runs),
            ready=sum(1 for r in self._current.values() if r.machine.deliverable()),
        )

    def _dropOrphans(self, names: Iterable[str]) -> None:
        """
        Remove run files no record accounts for: a crash between rendering
        into the vault and storing the run leaves them behind.
        """
        for name in names:
            match = _RUN_FILE.match(name)
            if match is not None and match.group(1) not in self._runs:
                self.vault.delete(name)
                self.log.warn("runs.vault.orphan-removed {name}", name=name)

    def _add(self, record: RunRecord) -> _Run:
        run = _Run(self, record)
        self._runs[record.id] = run
        self._byDigest[record.digest] = run
        if record.superseded_by is None:
            self._current[record.device] = run
        return run

    def stop(self) -> Deferred[None]:
        """Stop retrying releases; fire when the ones in flight settled."""
        return self.releaser.stop()

    # Provisioning

    async def provision(
        self,
        devices: Iterable[Device],
        *,
        actor: str,
        render: Callable[[Device, str], bytes],
        desiredAction: str | None = None,
    ) -> list[Provisioned]:
        """
        Start one run per device: render its configuration into the vault,
        supersede the device's earlier run, then store the records.

        Provisions are serialised. The earlier runs stop being deliverable
        before the database write, so no old code is served once the owner
        asked for a new one; if the write fails they stay withdrawn (fail
        closed) and the owner provisions again.

        @raise NotReady: the registry is still loading after a start.
        """
        if not self.loaded:
            raise NotReady("fleetd is still loading its runs")
        devices = list(devices)
        if len({d.name for d in devices}) != len(devices):
            raise ValueError("a device appears twice in one provision")
        async with self._provisioning:
            return await self._provision(devices, actor, render, desiredAction)

    async def _provision(
        self,
        devices: list[Device],
        actor: str,
        render: Callable[[Device, str], bytes],
        desiredAction: str | None,
    ) -> list[Provisioned]:
        now = self.clock.seconds()
        batch: list[tuple[Device, RunRecord, str]] = []
        try:
            for device in devices:
                code = mintCode()
                record = RunRecord(
                    id=mintRunId(),
                    device=device.name,
                    digest=codeDigest(self._codeKey, code),
                    created_at=now,
                    desired_action=desiredAction,
                )
                self.vault.put(configName(record.id), render(device, record.id))
                batch.append((device, record, code))
        except Exception:
            for _, record, _ in batch:
                self.vault.delete(configName(record.id))
            raise
        previous = [
            self._current.pop(d.name) for d in devices if d.name in self._current
        ]
        for old in previous:
            old.machine.supersede()
        try:
            stored = await self.runner.run(
                lambda db: insertRuns(db, [r for _, r, _ in batch])
            )
        except Exception:
            for _, record, _ in batch:
                self.vault.delete(configName(record.id))
            raise
        for gone in stored:  # whatever the database superseded is superseded here
            stale = self._runs.get(gone.id)
            if stale is not None and stale not in previous:
                stale.machine.supersede()
        results = []
        for device, record, code in batch:
            self._identity[device.name] = (device.uuid, device.serial)
            self._add(record).machine.restoreReady()
            self.alerts.clear(device.name)
            results.append(Provisioned(record.id, code, device.name))
        byDevice = {record.device: record.id for _, record, _ in batch}
        # Submitted together, in order, so the database thread can commit
        # them in a few group commits instead of one fsync each.
        pending: list[Deferred[Any]] = []
        for old in previous:
            old.record = replace(old.record, superseded_by=byDevice[old.record.device])
            pending.append(
                self.journal.append(
                    "run.superseded",
                    actor=actor,
                    device=old.record.device,
                    run=old.record.id,
                    fields={"by": old.record.superseded_by},
                )
            )
        for device, record, _ in batch:
            pending.append(self.inventory.setStatus(device.name, DeviceStatus.PLANNED))
            pending.append(
                self.journal.append(
                    "run.provisioned",
                    actor=actor,
                    device=device.name,
                    run=record.id,
                    fields={"desired_action": desiredAction},
                )
            )
        await gatherResults(pending, consumeErrors=True)
        return results

    # The boot path

    def byCode(self, code: str) -> _Run | None:
        return self._byDigest.get(codeDigest(self._codeKey, code))

    def byId(self, run: str) -> _Run | None:
        return self._runs.get(run)

    def current(self, device: str) -> RunRecord | None:
        run = self._current.get(device)
        return None if run is None else run.record

    def identity(self, device: str) -> tuple[str, str] | None:
        """The (uuid, serial) the inventory holds for C{device}."""
        return self._identity.get(device)

    def readyRun(self, device: str) -> str | None:
        """The device's run that a request now would get (IRunLookup)."""
        run = self._current.get(device)
        if run is None or not run.machine.deliverable():
            return None
        return run.record.id

    def request(self, run: _Run, peer: str) -> tuple[Outcome, bytes | None]:
        """
        A node at C{peer} asks for C{run}'s configuration: decide, and when
        delivering, mark the vault before returning the body.
        """
        try:
            outcome = run.machine.request(peer)
        except VaultError:
            # The mark could not be written (tmpfs full?): nothing was sent.
            self.log.failure("runs.mark.failed {run}", run=run.record.id)
            run.machine.aborted()
            return Outcome.BUSY, None
        if outcome is not Outcome.DELIVER:
            return outcome, None
        body = self.vault.get(configName(run.record.id))
        if body is None:  # the vault lost it under us
            run.machine.aborted()
            return Outcome.LOST, None
        return outcome, body

    def finished(self, run: _Run, complete: bool) -> None:
        """The response for C{run} was handed over whole, or failed."""
        if complete:
            run.machine.sent()
        else:
            run.machine.aborted()

    # Bookkeeping for the machine's effects

    def journalEvent(self, event: str, run: _Run, **fields: str) -> None:
        self.journal.append(
            event,
            actor=f"node:{run.record.device}",
            device=run.record.device,
            run=run.record.id,
            fields=dict(fields),
        ).addErrback(self._journalFailed)

    def noteFirst(self, run: _Run, note: str, kind: str, event: str, peer: str) -> None:
        self.alerts.note(kind, run.record.device)
        if getattr(run.record, note):
            return
        if note == "missing_noted":
            run.record = replace(run.record, missing_noted=True)
        else:
            run.record = replace(run.record, refetch_noted=True)
        self.journalEvent(event, run, peer=peer)
        self.runner.run(lambda db: noteRun(db, run.record.id, note)).addErrback(
            self._journalFailed
        )

    def _journalFailed(self, f: Failure) -> None:
        self.log.failure("runs.record.failed", failure=f)
