"""
The run registry: every current run's delivery machine, indexed for the
boot path.

Lookups on the boot listener are synchronous and in memory (a dict from
code digest to run), so deciding and marking a delivery happens in one
reactor turn: concurrent requests for one code cannot both be served [C1].
Superseded history stays in the database and is looked up only when a
code is not found in memory (L{RunRegistry.retired}).

Every change follows [J1]: the database writes and their journal entries
commit together (L{AsyncJournal.change}), memory changes only after that
commit, vault files are written before the commit that refers to them and
removed only after the commit that retires them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from json.encoder import encode_basestring_ascii as _string
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import Device, DeviceStatus, IInventory, ServedRecord
from fleetd.runs.alerts import (
    MISSING,
    REFETCHED,
    AlertTracker,
    clearAlerts,
    loadAlerts,
    storeAlert,
)
from fleetd.runs.codes import codeDigest, mintCode, mintRunId
from fleetd.runs.identities import IdentityIndex
from fleetd.runs.issued import IssuedDigests
from fleetd.runs.machine import Outcome, RunEffects, RunInputs, RunMachine
from fleetd.runs.releaser import Releaser
from fleetd.runs.store import (
    RunRecord,
    endRuns,
    insertRuns,
    issuedDigests,
    isSuperseded,
    latestRun,
    loadRuns,
    noteRun,
    retiredRun,
)
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner
from fleetd.vault import IVault, VaultError

ABORT_JOURNAL_EVERY = 600.0
RETIRED = "retired"  # superseded_by of a run its device's retirement ended [R1]
_T = TypeVar("_T")
_RUN_FILE = re.compile(r"^(r-[0-9a-f]{16})\.(yaml|served|code)$")


def configName(run: str) -> str:
    return f"{run}.yaml"


def servedName(run: str) -> str:
    return f"{run}.served"


def codeName(run: str) -> str:
    """The run's code, kept beside its configuration for the install plan."""
    return f"{run}.code"


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

    # One per run, 50,000 and more held for the process's life: no __dict__.
    __slots__ = (
        "_abortJournaledAt",
        "_aborts",
        "_machine",
        "_ready",
        "_served",
        "record",
        "registry",
        "servedPeer",
    )

    def __init__(self, registry: RunRegistry, record: RunRecord) -> None:
        self.registry = registry
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
        return self.registry.vault

    # RunEffects
    def markServed(self, peer: str) -> None:
        self.servedPeer = peer
        served = ServedRecord(
            self.record.id, self.record.device, self.registry.clock.seconds(), peer
        )
        self._served = None
        self.vault.put(servedName(self.record.id), _servedJSON(served))
        self._served = served

    def dropMark(self) -> None:
        # The write failed; a partial file must not survive to mean "served".
        try:
            self.vault.delete(servedName(self.record.id))
        except VaultError:
            self.registry.log.failure(
                "runs.mark.cleanup-failed {run}", run=self.record.id
            )

    def withdrawServed(self) -> None:
        self.vault.delete(servedName(self.record.id))
        self._served = None
        # Anyone holding a code can abort deliveries at will: one entry per
        # run per ABORT_JOURNAL_EVERY seconds, counting the ones between.
        self._aborts += 1
        now = self.registry.clock.seconds()
        if now - self._abortJournaledAt >= ABORT_JOURNAL_EVERY:
            self.registry.journalEvent(
                "run.delivery-aborted",
                self,
                peer=self.servedPeer,
                aborts=str(self._aborts),
            )
            self._aborts, self._abortJournaledAt = 0, now

    def delivered(self) -> None:
        # Never served again: once the delivery is recorded, the secret
        # leaves the vault; the mark stays.
        self.registry.releaser.release(self.servedRecord(), onRecorded=self.dropConfig)
        self.registry.notifyDelivered(self.record)

    def deliveredSuperseded(self) -> None:
        # The owner already replaced this run: record the delivery, release
        # nothing (the device stays as the newer run set it).
        self.registry.releaser.release(
            self.servedRecord(), superseded=True, onRecorded=self.dropFiles
        )

    def noteRefetch(self, peer: str) -> None:
        self.registry.noteRequest(
            self, "refetch_noted", REFETCHED, "config.refetched", peer
        )

    def noteMissing(self, peer: str) -> None:
        self.registry.noteRequest(
            self, "missing_noted", MISSING, "config.missing", peer
        )

    def dropConfig(self) -> None:
        self.vault.delete(configName(self.record.id))
        self.vault.delete(codeName(self.record.id))

    def dropAll(self) -> None:
        self.dropConfig()
        # A delivery not yet recorded keeps its served mark until it is
        # (J1: files go only after the commit that retires them).
        if not self.registry.releaser.supersede(self.record.id, self.dropFiles):
            self.dropFiles()

    def dropFiles(self) -> None:
        self.vault.delete(configName(self.record.id))
        self.vault.delete(codeName(self.record.id))
        self.vault.delete(servedName(self.record.id))

    def servedRecord(self) -> ServedRecord:
        if self._served is not None:  # written by this process: no need to read
            return self._served
        raw = self.vault.get(servedName(self.record.id))
        doc = json.loads(raw) if raw else {}
        return ServedRecord(
            run=self.record.id,
            device=self.record.device,
            served_at=float(doc.get("served_at", self.registry.clock.seconds())),
            peer=str(doc.get("peer", self.servedPeer)),
        )


def _servedJSON(served: ServedRecord) -> bytes:
    """
    The served mark's contents: C{json.dumps} of run, device, served_at and
    peer, written out directly (this runs once per delivery, on the
    reactor thread). C{served_at} comes from the clock: a finite float,
    which JSON writes as C{repr} does.
    """
    return (
        f'{{"run": {_string(served.run)}, "device": {_string(served.device)}, '
        f'"served_at": {served.served_at!r}, "peer": {_string(served.peer)}}}'
    ).encode("ascii")


def _readServed(vault: IVault, run: str) -> ServedRecord | None:
    """The served record a mark in the vault holds, if it is readable."""
    raw = vault.get(servedName(run))
    try:
        doc = json.loads(raw) if raw else None
        if not isinstance(doc, dict):
            return None
        return ServedRecord(
            run=run,
            device=str(doc["device"]),
            served_at=float(doc["served_at"]),
            peer=str(doc.get("peer", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None


class ICredentials(Protocol):
    """
    Per-node cluster credentials issued with a provision [K1]
    (L{fleetd.kube.book.TokenBook}): created outside the database before
    the commit, recorded inside it, discarded if it fails.
    """

    async def issue(self, device: str, run: str) -> Any:
        "Create C{device}'s credential for C{run}; C{.token.bearer} is it."

    def recordIn(
        self, db: Database, journal: Recorder, issued: list[Any], actor: str
    ) -> None:
        "Store them in the provision's transaction [J1]."

    async def discard(self, issued: list[Any]) -> None:
        "The provision did not commit: undo the creations."

    def committed(self, issued: list[Any]) -> None:
        "The provision committed."


class NotReady(Exception):
    """The registry is still loading; try again shortly."""


class Decommissioning(Exception):
    """
    A device of the provision was retired (its status is
    C{decommissioning}) when the provision's transaction ran; nothing
    was provisioned [R1].
    """

    def __init__(self, device: str) -> None:
        super().__init__(f"{device} is retired and cannot be provisioned")
        self.device = device


# Every status a provision may move to planned: all but a retirement's.
PROVISIONABLE = frozenset(DeviceStatus) - {DeviceStatus.DECOMMISSIONING}


@dataclass(frozen=True)
class RunView:
    """A run as people see it (C{fleetctl status}): no code, no body."""

    record: RunRecord
    state: str


class RunRegistry:
    """All current runs of this fleetd, and the decisions of the boot path."""

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
        metrics: CollectorRegistry | None = None,
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
        self._identity = IdentityIndex()
        self._issued = IssuedDigests()
        self._noting: set[tuple[str, str]] = set()
        self._provisioning = DeferredLock()
        self.loaded = False
        self.releaser = Releaser(clock, inventory, journal)
        # Called with a run's record when its configuration was delivered
        # (boot completion [B1] listens here).
        self.deliveryObservers: list[Callable[[RunRecord], None]] = []
        self.vaultFailures = Counter(
            "fleetd_vault_write_failures_total",
            "Vault writes that failed (a full or broken tmpfs), by purpose.",
            ["purpose"],
            registry=metrics,
        )
        for purpose in ("served-mark", "config"):
            self.vaultFailures.labels(purpose)  # exposed at 0 from the start

    async def load(self) -> None:
        """Rebuild every current run's state from the database, vault and inventory."""
        records = await self.runner.run(loadRuns)
        self._issued = await self.runner.run(issuedDigests)
        released = await self.inventory.releasedRuns()
        for device in await self.inventory.list():
            self._identity[device.name] = (device.uuid, device.serial)
        for name, kind, first, last in await self.runner.run(loadAlerts):
            self.alerts.restore(name, kind, first, last)
        vault = self.vault
        ready = 0
        for record in records:
            run = self._add(record)
            if servedName(record.id) in vault:
                # The mark reached the vault, so the body may have gone out:
                # consumed, whatever else is there [C1].
                run.machine.restoreConsumed()
                if record.id not in released:
                    # Delivered, but not recorded before we stopped.
                    self.releaser.release(
                        run.servedRecord(), onRecorded=run.dropConfig, recovering=True
                    )
                else:
                    run.dropConfig()
            elif record.id in released:
                run.machine.restoreConsumed()
            elif configName(record.id) in vault:
                run.restoredReady()
                ready += record.superseded_by is None
            else:
                run.machine.restoreLost()
        strays = self._strayFiles()
        self._recordStrayMarks(strays)
        self._dropOrphans(strays)
        self.loaded = True
        self.log.info(
            "runs.loaded {runs} runs, {ready} ready", runs=len(self._runs), ready=ready
        )

    def _strayFiles(self) -> set[str]:
        """
        The vault's names that no loaded run accounts for, in one pass:
        at start-up every name is looked at once (100,000 at 50,000 runs),
        and nearly all of them belong to a run.
        """
        runs = self._runs
        return {
            name for name in self.vault.names() if name.partition(".")[0] not in runs
        }

    def _recordStrayMarks(self, names: set[str]) -> None:
        """
        Served marks of runs that are no longer current: fleetd stopped
        after the provision that superseded them committed, before their
        delivery was recorded. Record them (as superseded, released to
        nobody) before their files go.
        """
        for name in sorted(names):
            match = _RUN_FILE.match(name)
            if match is None or match.group(2) != "served":
                continue
            run = match.group(1)
            if run in self._runs:
                continue
            served = _readServed(self.vault, run)
            if served is None:
                continue
            names.discard(name)
            self.releaser.release(
                served,
                superseded=True,
                recovering=True,
                onRecorded=partial(self.vault.delete, name),
            )

    def _dropOrphans(self, names: Iterable[str]) -> None:
        """
        Remove run files no current run accounts for: a crash between
        rendering into the vault and storing the run, or between a
        supersede's commit and its file removal, leaves them behind.
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
        """Stop retrying records; fire when the ones in flight settled."""
        return self.releaser.stop()

    # Provisioning

    async def provision(
        self,
        devices: Iterable[Device],
        *,
        actor: str,
        render: Callable[..., bytes],
        desiredAction: str | None = None,
        credentials: ICredentials | None = None,
    ) -> list[Provisioned]:
        """
        Start one run per device: render its configuration into the vault,
        then, in one transaction with their journal entries, store the
        runs, supersede the devices' earlier runs and mark them planned
        [J1]. Only after that commit do the new codes work and the old
        ones stop; if it fails, the new files are removed and everything
        stays as it was.

        A device that is C{decommissioning} when that transaction runs
        refuses the whole provision (L{Decommissioning}).

        Provisions are serialised. With C{credentials}, each device's
        bootstrap token is created first and C{render(device, run, token)}
        gets it (L{ICredentials}); without, C{render(device, run)}.

        @raise NotReady: the registry is still loading after a start.
        """
        if not self.loaded:
            raise NotReady("fleetd is still loading its runs")
        devices = list(devices)
        if len({d.name for d in devices}) != len(devices):
            raise ValueError("a device appears twice in one provision")
        async with self._provisioning:
            return await self._provision(
                devices, actor, render, desiredAction, credentials
            )

    async def _provision(
        self,
        devices: list[Device],
        actor: str,
        render: Callable[..., bytes],
        desiredAction: str | None,
        credentials: ICredentials | None = None,
    ) -> list[Provisioned]:
        now = self.clock.seconds()
        batch: list[tuple[Device, RunRecord, str]] = []
        issued: list[Any] = []
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
                if credentials is None:
                    body = render(device, record.id)
                else:  # the Secret exists before the run that names it [K1]
                    issued.append(await credentials.issue(device.name, record.id))
                    body = render(device, record.id, issued[-1].token.bearer)
                batch.append((device, record, code))
                self.vault.put(configName(record.id), body)
                # The install plan hands the code to the node (META 0x0b);
                # the database holds only its keyed digest.
                self.vault.put(codeName(record.id), code.encode("ascii"))
        except VaultError:
            self._forget(batch)
            self.vaultFailures.labels("config").inc()
            if credentials is not None:
                await credentials.discard(issued)
            raise
        except Exception:
            self._forget(batch)
            if credentials is not None:
                await credentials.discard(issued)
            raise
        records = [record for _, record, _ in batch]

        def change(db: Database, journal: Recorder) -> list[RunRecord]:
            superseded = insertRuns(db, records)
            for old in superseded:
                journal(
                    "run.superseded",
                    actor=actor,
                    device=old.device,
                    run=old.id,
                    fields={"by": old.superseded_by},
                )
            for device, record, _ in batch:
                # Checked here, not before: a retirement that committed
                # since the caller looked refuses the whole provision.
                if not self.inventory.transitionIn(
                    db, device.name, PROVISIONABLE, DeviceStatus.PLANNED
                ):
                    raise Decommissioning(device.name)
                clearAlerts(db, device.name)
                journal(
                    "run.provisioned",
                    actor=actor,
                    device=device.name,
                    run=record.id,
                    fields={"desired_action": desiredAction},
                )
            if credentials is not None:
                credentials.recordIn(db, journal, issued, actor)
            return superseded

        try:
            superseded = await self.journal.change(change)
        except Exception:
            self._forget(batch)
            if credentials is not None:
                await credentials.discard(issued)
            raise
        if credentials is not None:
            credentials.committed(issued)
        # Committed: now memory follows, and the old runs' files go.
        self._supersededCommitted(superseded)
        results = []
        for device, record, code in batch:
            self._identity[device.name] = (device.uuid, device.serial)
            self._issued.add(record.digest)  # the database has it from now on
            self._add(record).restoredReady()
            self.alerts.clear(device.name)
            results.append(Provisioned(record.id, code, device.name))
        return results

    def _supersededCommitted(self, superseded: list[RunRecord]) -> None:
        for old in superseded:
            run = self._runs.get(old.id)
            if run is not None:
                run.record = old
                if self._current.get(old.device) is run:
                    self._current.pop(old.device)
                run.machine.supersede()

    async def retire(
        self,
        device: str,
        actor: str,
        work: Callable[[Database, Recorder], _T],
    ) -> _T:
        """
        A retirement [R1]: in one transaction with C{work} (the rest of the
        retirement) and their journal entries, end C{device}'s current run
        (C{run.superseded} by C{retired}) so its code stops working [J1].
        Only after that commit does memory follow; the run's files leave
        the vault then (a delivery in flight finishes and is recorded as
        superseded, releasing nothing). Serialised with provisions.

        @raise NotReady: the registry is still loading after a start.
        """
        if not self.loaded:
            raise NotReady("fleetd is still loading its runs")

        def change(db: Database, journal: Recorder) -> tuple[list[RunRecord], _T]:
            ended = endRuns(db, device, RETIRED)
            for old in ended:
                journal(
                    "run.superseded",
                    actor=actor,
                    device=device,
                    run=old.id,
                    fields={"by": RETIRED},
                )
            clearAlerts(db, device)
            return ended, work(db, journal)

        async with self._provisioning:
            ended, result = await self.journal.change(change)
            self._supersededCommitted(ended)
            self.alerts.clear(device)
        return result

    def _forget(self, batch: list[tuple[Device, RunRecord, str]]) -> None:
        for _, record, _ in batch:
            try:
                self.vault.delete(configName(record.id))
                self.vault.delete(codeName(record.id))
            except VaultError:
                self.log.failure("runs.vault.cleanup-failed {run}", run=record.id)

    # The boot path

    def byCode(self, code: str) -> _Run | None:
        return self._byDigest.get(codeDigest(self._codeKey, code))

    def retired(self, code: str) -> Deferred[RunRecord | None]:
        """
        The superseded run a code belonged to, from the database; a code
        fleetd never issued is known not to be one without asking it.
        """
        digest = codeDigest(self._codeKey, code)
        if not self._issued.mayHold(digest):
            return succeed(None)
        return self.runner.run(lambda db: retiredRun(db, digest))

    def byId(self, run: str) -> _Run | None:
        return self._runs.get(run)

    def current(self, device: str) -> RunRecord | None:
        run = self._current.get(device)
        return None if run is None else run.record

    def currentRun(self, device: str) -> _Run | None:
        """C{device}'s current run, for the device flow's grants [F2]."""
        return self._current.get(device)

    async def view(self, device: str) -> RunView | None:
        """C{device}'s latest run and its state, for people."""
        run = self._current.get(device)
        if run is not None:
            return RunView(run.record, run.describe())
        record = await self.runner.run(lambda db: latestRun(db, device))
        return None if record is None else RunView(record, "superseded")

    def identity(self, device: str) -> tuple[str, str] | None:
        """The (uuid, serial) the inventory holds for C{device}."""
        return self._identity.get(device)

    def deviceByIdentity(self, uuid: str, serial: str) -> str | None:
        """The device with this uuid and serial, if any (IRunLookup)."""
        return self._identity.deviceByIdentity(uuid, serial)

    def readyRun(self, device: str) -> str | None:
        """The device's run that a request now would get (IRunLookup)."""
        run = self._current.get(device)
        if run is None or not run.deliverable():
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
            # The mark could not be written (tmpfs full?): nothing was sent,
            # nothing happened that the journal must know of.
            self.vaultFailures.labels("served-mark").inc()
            self.log.error(
                "runs.mark.failed {run}: the vault refused the served mark",
                run=run.record.id,
            )
            run.machine.markFailed()
            return Outcome.UNAVAILABLE, None
        if outcome is not Outcome.DELIVER:
            return outcome, None
        body = self.vault.get(configName(run.record.id))
        if body is None:  # the vault lost it under us
            run.machine.configVanished(peer)
            return Outcome.LOST, None
        return outcome, body

    def finished(self, run: _Run, complete: bool) -> None:
        """
        The operating system has the whole response (C{complete}), or the
        connection failed before it did.
        """
        if complete:
            run.machine.sent()
        else:
            run.machine.aborted()

    def notifyDelivered(self, record: RunRecord) -> None:
        for observer in list(self.deliveryObservers):
            try:
                observer(record)
            except Exception:
                self.log.failure("runs.delivery-observer.failed {run}", run=record.id)

    def configDelivered(self, run: str) -> bool:
        """Whether C{run}'s configuration went out (it counts as consumed)."""
        found = self._runs.get(run)
        return found is not None and found.configDelivered()

    # Bookkeeping for the machine's effects

    def journalEvent(self, event: str, run: _Run, **fields: str) -> None:
        """An event that changes no stored state (an aborted delivery)."""
        self.journal.append(
            event,
            actor=f"node:{run.record.device}",
            device=run.record.device,
            run=run.record.id,
            fields=dict(fields),
        ).addErrback(self._journalFailed)

    def noteRequest(
        self, run: _Run, note: str, kind: str, event: str, peer: str
    ) -> None:
        """
        A node asked for a lost or consumed run: journal the first such
        request per run, and keep the alert series up [V4] [C2] [V6]. The
        series and the run's flag change only once that is stored [J1].
        """
        device = run.record.device
        first = not getattr(run.record, note)
        if (run.record.id, note) in self._noting:
            return  # the first one is being recorded right now
        if not first and not self.alerts.needsWrite(kind, device):
            self.alerts.note(kind, device, stored=False)
            return
        self._noting.add((run.record.id, note))

        def change(db: Database, journal: Recorder) -> None:
            if isSuperseded(db, run.record.id):
                return  # the recovery provision committed first: no alert
            storeAlert(db, device, kind, self.clock.seconds())
            if first:
                noteRun(db, run.record.id, note)
                journal(
                    event,
                    actor=f"node:{device}",
                    device=device,
                    run=run.record.id,
                    fields={"peer": peer},
                )

        def stored(_: None) -> None:
            if first and note == "missing_noted":
                run.record = replace(run.record, missing_noted=True)
            elif first:
                run.record = replace(run.record, refetch_noted=True)
            if self._current.get(device) is run:  # not superseded meanwhile
                self.alerts.note(kind, device, stored=True)

        d = self.journal.change(change)
        d.addCallbacks(stored, self._journalFailed)
        d.addBoth(lambda _: self._noting.discard((run.record.id, note)))

    def _journalFailed(self, f: Failure) -> None:
        self.log.failure("runs.record.failed", failure=f)
