"""
Provisions and retirements: the changes that start and end runs.

Every change follows [J1]: the database writes and their journal entries
commit together (L{AsyncJournal.change}), memory changes only after that
commit, vault files are written before the commit that refers to them and
removed only after the commit that retires them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import DeferredLock
from twisted.logger import Logger

from fleetd.inventory.model import Device, DeviceStatus, IInventory
from fleetd.runs.alerts import AlertTracker, clearAlerts
from fleetd.runs.codes import codeDigest, mintCode, mintRunId
from fleetd.runs.index import BootIndex
from fleetd.runs.run import Run, RunCore
from fleetd.runs.store import RunRecord, endRuns, insertRuns, latestRun
from fleetd.runs.vaultnames import codeName, configName
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.vault import VaultError

RETIRED = "retired"  # superseded_by of a run its device's retirement ended [R1]
_T = TypeVar("_T")

# Every status a provision may move to planned: all but a retirement's.
PROVISIONABLE = frozenset(DeviceStatus) - {DeviceStatus.DECOMMISSIONING}


@dataclass(frozen=True)
class Provisioned:
    """A new run, with the code shown to the owner exactly once."""

    run: str
    code: str = field(repr=False)
    device: str
    # Its Tinkerbell objects after their first try ([tinkerbell]), if any.
    objects: Mapping[str, Any] | None = None

    def toJSON(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "run": self.run,
            "code": self.code,
            "device": self.device,
        }
        if self.objects is not None:
            found["tinkerbell"] = dict(self.objects)
        return found


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


class IRunObjects(Protocol):
    """
    Objects outside fleetd made for each new run (Tinkerbell's Hardware
    and Workflow, L{fleetd.tinkerbell.service}): their intents recorded in
    the provision's transaction [J1], the calls made after its commit.
    """

    def recordProvision(
        self,
        db: Database,
        journal: Recorder,
        started: Sequence[tuple[Device, str]],
        actor: str,
        at: float,
    ) -> Any:
        "Record the intents for C{started} (device, run id); what was written."

    def committed(self, recorded: Any) -> None:
        "The provision committed: memory follows, the calls start."


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


class RunMoved(Exception):
    """
    C{device}'s latest run was not the one the caller expected it to
    supersede (C{expected}; L{None}: none) when the provision's transaction
    ran: another provision (a second submit of one confirmation) came
    first. Nothing was provisioned.
    """

    def __init__(self, device: str, expected: str | None, current: str | None) -> None:
        super().__init__(
            f"{device}'s latest run is {current or 'none'} now,"
            f" not {expected or 'none'}"
        )
        self.device = device
        self.expected = expected
        self.current = current


class Provisioner:
    """Start and end runs, serialised, each in one transaction [J1]."""

    def __init__(
        self,
        core: RunCore,
        index: BootIndex,
        journal: AsyncJournal,
        inventory: IInventory,
        alerts: AlertTracker,
        log: Logger,
    ) -> None:
        self._core = core
        self._journal = journal
        self._index = index
        self._inventory = inventory
        self._alerts = alerts
        self._log = log
        self._lock = DeferredLock()

    async def provision(
        self,
        devices: Iterable[Device],
        *,
        actor: str,
        render: Callable[..., bytes],
        desiredAction: str | None = None,
        credentials: ICredentials | None = None,
        via: str | None = None,
        supersedes: Mapping[str, str | None] | None = None,
        objects: IRunObjects | None = None,
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

        @param via: where the owner asked (C{console}), journaled when given.
        @param supersedes: per device, the run its latest run must still be
            (L{None}: it has none) when the transaction runs, else nothing
            is provisioned (L{RunMoved}): a confirmation the owner saw.
        @param objects: records the intents of objects made for the new
            runs in their transaction (L{IRunObjects}).
        @raise NotReady: the registry is still loading after a start.
        """
        if not self._index.loaded:
            raise NotReady("fleetd is still loading its runs")
        devices = list(devices)
        if len({d.name for d in devices}) != len(devices):
            raise ValueError("a device appears twice in one provision")
        async with self._lock:
            return await self._provision(
                devices,
                actor,
                render,
                desiredAction,
                credentials,
                via,
                supersedes,
                objects,
            )

    async def _provision(
        self,
        devices: list[Device],
        actor: str,
        render: Callable[..., bytes],
        desiredAction: str | None,
        credentials: ICredentials | None = None,
        via: str | None = None,
        supersedes: Mapping[str, str | None] | None = None,
        objects: IRunObjects | None = None,
    ) -> list[Provisioned]:
        core, index = self._core, self._index
        now = core.clock.seconds()
        batch: list[tuple[Device, RunRecord, str]] = []
        issued: list[Any] = []
        try:
            for device in devices:
                code = mintCode()
                record = RunRecord(
                    id=mintRunId(),
                    device=device.name,
                    digest=codeDigest(index.codeKey, code),
                    created_at=now,
                    desired_action=desiredAction,
                )
                if credentials is None:
                    body = render(device, record.id)
                else:  # the Secret exists before the run that names it [K1]
                    issued.append(await credentials.issue(device.name, record.id))
                    body = render(device, record.id, issued[-1].token.bearer)
                batch.append((device, record, code))
                core.vault.put(configName(record.id), body)
                # The install plan hands the code to the node (META 0x0b);
                # the database holds only its keyed digest.
                core.vault.put(codeName(record.id), code.encode("ascii"))
        except VaultError:
            self._forget(batch)
            index.vaultFailures.labels("config").inc()
            if credentials is not None:
                await credentials.discard(issued)
            raise
        except Exception:
            self._forget(batch)
            if credentials is not None:
                await credentials.discard(issued)
            raise
        records = [record for _, record, _ in batch]

        def change(db: Database, journal: Recorder) -> tuple[list[RunRecord], Any]:
            for name, expected in (supersedes or {}).items():
                latest = latestRun(db, name)
                current = None if latest is None else latest.id
                if current != expected:
                    raise RunMoved(name, expected, current)
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
                if not self._inventory.transitionIn(
                    db, device.name, PROVISIONABLE, DeviceStatus.PLANNED
                ):
                    raise Decommissioning(device.name)
                clearAlerts(db, device.name)
                journal(
                    "run.provisioned",
                    actor=actor,
                    device=device.name,
                    run=record.id,
                    fields={"desired_action": desiredAction}
                    | ({} if via is None else {"via": via}),
                )
            if credentials is not None:
                credentials.recordIn(db, journal, issued, actor)
            recorded = None
            if objects is not None:
                started = [(device, record.id) for device, record, _ in batch]
                recorded = objects.recordProvision(db, journal, started, actor, now)
            return superseded, recorded

        try:
            superseded, recorded = await self._journal.change(change)
        except Exception:
            self._forget(batch)
            if credentials is not None:
                await credentials.discard(issued)
            raise
        if credentials is not None:
            credentials.committed(issued)
        if objects is not None:
            objects.committed(recorded)
        # Committed: now memory follows, and the old runs' files go.
        index.supersededCommitted(superseded)
        results = []
        for device, record, code in batch:
            index.identities[device.name] = (device.uuid, device.serial)
            index.issued.add(record.digest)  # the database has it from now on
            index.add(Run(core, record)).restoredReady()
            self._alerts.clear(device.name)
            results.append(Provisioned(record.id, code, device.name))
        return results

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
        if not self._index.loaded:
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

        async with self._lock:
            ended, result = await self._journal.change(change)
            self._index.supersededCommitted(ended)
            self._alerts.clear(device)
        return result

    def _forget(self, batch: list[tuple[Device, RunRecord, str]]) -> None:
        for _, record, _ in batch:
            try:
                self._core.vault.delete(configName(record.id))
                self._core.vault.delete(codeName(record.id))
            except VaultError:
                self._log.failure("runs.vault.cleanup-failed {run}", run=record.id)
