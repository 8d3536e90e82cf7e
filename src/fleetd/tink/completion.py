"""
Boot completion per run [B1] [B2] [B3]: the L{fleetd.tink.boot} machines
fed from the proxy's observations and the run registry's deliveries.

Durable facts are journal entries, each committed in one transaction with
the state it records [J1]: C{boot.rebooting} (a workflow's SUCCESS means
the reboot starts, not that the disk boots [B1]) and
C{boot.hookos-after-install} (the first return to HookOS of a run, with
its alert series, [B2] [V6]); C{boot.completed} clears that series when
the configuration is finally fetched. A restart re-enters each current
run's state from those entries, so the return is journaled once per run,
ever. A poll counts as a return to HookOS only on a downstream connection
opened after the one the workflow finished on, and at least
C{minReboot} seconds after the finish (a reboot through firmware and
HookOS takes longer than that; a reconnect does not).

A workflow's end can be told twice: by the calls the proxy sees and by
the Workflow's state in Kubernetes (L{fleetd.tink.wfstate}), in either
order. Each run keeps the workflows whose end it took (restored from its
C{boot.rebooting} entries after a restart); a second signal for one of
them changes nothing, so the outcome is the same whichever comes first
and the end is journaled once [B2]. A new action of that workflow (it
runs again) makes its next end count. The Kubernetes signal for a
Workflow first seen already finished counts only if the Workflow was
created after the run (an older one belongs to an older run).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol as TypingProtocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.config import TinkSettings
from fleetd.runs.alerts import HOOKOS, AlertTracker, clearAlert, storeAlert
from fleetd.runs.store import RunRecord, isSuperseded
from fleetd.store.db import Database
from fleetd.store.entries import fieldsOf, hasEvent, lastEvent
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner
from fleetd.tink.boot import BootEffects, BootInputs, BootMachine, WorkflowEnd

NETBOOT = "netboot"
MIN_REBOOT = TinkSettings.min_reboot
REBOOTING = "boot.rebooting"
RETURNED = "boot.hookos-after-install"
COMPLETED = "boot.completed"


class IRuns(TypingProtocol):
    """What boot completion needs of the run registry."""

    deliveryObservers: list[Callable[[RunRecord], None]]

    def current(self, device: str) -> RunRecord | None: ...

    def configDelivered(self, run: str) -> bool: ...


def bootHistory(db: Database, runs: list[str]) -> dict[str, str]:
    """The last boot.* journal event of each of C{runs}."""
    found: dict[str, str] = {}
    for run in runs:
        event = lastEvent(db, run=run, events=(REBOOTING, RETURNED, COMPLETED))
        if event is not None:
            found[run] = event
    return found


def finishedWorkflows(db: Database, runs: list[str]) -> dict[str, set[str]]:
    """The workflows whose end each of C{runs} journaled (C{boot.rebooting})."""
    found: dict[str, set[str]] = {}
    for run in runs:
        for fields in fieldsOf(db, run=run, event=REBOOTING):
            workflow = fields.get("workflow")
            if isinstance(workflow, str):
                found.setdefault(run, set()).add(workflow)
    return found


def returnedRuns(db: Database, runs: list[str]) -> set[str]:
    """Which of C{runs} already have their return to HookOS journaled."""
    return {run for run in runs if hasEvent(db, run=run, event=RETURNED)}


class _RunBoot(BootEffects):
    """One run's boot machine and the effects it asks for."""

    def __init__(self, tracker: BootTracker, record: RunRecord) -> None:
        self.tracker = tracker
        self.record = record
        self.doneConnection = -1
        self.doneAt = float("-inf")
        self.finished: set[str] = set()  # workflows whose end this run took
        self.machine: BootInputs = BootMachine(self)

    def rebooting(self, workflow: str, signal: str) -> None:
        self.tracker.logRebooting(self, workflow, signal)

    def inHookOS(self) -> None:
        self.tracker.noteHookOS(self)

    def netbootExpected(self) -> None:
        self.tracker.log.info(
            "boot.netboot-expected {device} {run}",
            device=self.record.device,
            run=self.record.id,
        )

    def completed(self, afterHookOS: bool) -> None:
        self.tracker.completed(self, afterHookOS)


class BootTracker:
    """
    Every current run's boot machine (an L{fleetd.tink.workflows.IBootEvents}),
    made on the run's first event.
    """

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        runs: IRuns,
        runner: IRunner,
        journal: AsyncJournal,
        alerts: AlertTracker,
        minReboot: float = MIN_REBOOT,
    ) -> None:
        self.clock = clock
        self.runs = runs
        self.runner = runner
        self.journal = journal
        self.alerts = alerts
        self.minReboot = minReboot
        self._byDevice: dict[str, _RunBoot] = {}
        self._noted: set[str] = set()  # runs whose return is journaled
        self._noting: set[str] = set()
        runs.deliveryObservers.append(self.delivered)

    async def load(self, devices: list[str]) -> None:
        """Re-enter each current run's state (after the registry loaded)."""
        records = [r for r in map(self.runs.current, devices) if r is not None]
        ids = [r.id for r in records]
        history = await self.runner.run(lambda db: bootHistory(db, ids))
        self._noted |= await self.runner.run(lambda db: returnedRuns(db, ids))
        finished = await self.runner.run(lambda db: finishedWorkflows(db, ids))
        now = self.clock.seconds()
        for record in records:
            took = finished.get(record.id)
            state = history.get(record.id)
            if not (took or state in (REBOOTING, RETURNED)):
                # Nothing to restore: its machine is made on its first
                # event, as for a run provisioned since the start, done if
                # its configuration went out (50,000 idle machines were
                # 23 MiB after a restart).
                continue
            boot = self._boot(record.device)  # done if delivered
            if boot is None:
                continue
            if took:
                boot.finished |= took
            if boot.machine.describe() != "waiting":
                # Delivered, or an event since the runs loaded (a worker
                # polled) came first: it is newer than the history.
                continue
            if state == REBOOTING:
                boot.doneAt = now
                boot.machine.restoreRebooting()
            elif state == RETURNED:
                boot.machine.restoreReturned()

    def _boot(self, device: str) -> _RunBoot | None:
        record = self.runs.current(device)
        if record is None:
            self._byDevice.pop(device, None)
            return None
        boot = self._byDevice.get(device)
        if boot is None or boot.record.id != record.id:
            boot = self._byDevice[device] = _RunBoot(self, record)
            if self.runs.configDelivered(record.id):
                # A delivery before its first event: the machine starts
                # where that delivery would have put it (nothing to do).
                boot.machine.restoreDone()
        return boot

    # IBootEvents (from the proxy's observations)

    def running(self, device: str, workflow: str) -> None:
        boot = self._boot(device)
        if boot is not None:
            boot.finished.discard(workflow)  # it runs (again): its end counts
            boot.machine.running()

    def done(
        self,
        device: str,
        workflow: str,
        connection: int,
        *,
        signal: str = "proxy",
        createdAt: float | None = None,
    ) -> None:
        """
        C{device}'s C{workflow} finished, as C{signal} tells; the proxy's
        last poll for it was on C{connection}. C{createdAt}: when the
        Workflow was created, for a Workflow first seen finished (it must
        not be older than the run, whole seconds as Kubernetes keeps them).
        """
        boot = self._boot(device)
        if boot is None:
            return
        boot.doneConnection = max(boot.doneConnection, connection)
        if workflow in boot.finished:
            return  # told already (the other signal, or a retried report)
        if createdAt is not None and createdAt < math.floor(boot.record.created_at):
            self.log.info(
                "boot.workflow-older-than-run {device} {run} {workflow}",
                device=device,
                run=boot.record.id,
                workflow=workflow,
            )
            return
        boot.finished.add(workflow)  # a second signal meanwhile changes nothing
        if boot.machine.workflowEnded() is WorkflowEnd.NOTHING:
            return  # another workflow's end
        self._recordDone(boot, workflow, signal)

    def polled(self, device: str, connection: int) -> None:
        boot = self._boot(device)
        if boot is None or connection <= boot.doneConnection:
            return  # the connection the workflow finished on: not a restart
        if self.clock.seconds() - boot.doneAt < self.minReboot:
            return
        if boot.record.desired_action == NETBOOT:
            boot.machine.netbooted()  # expected: silent [B3]
        else:
            boot.machine.returned()

    # From the run registry

    def delivered(self, record: RunRecord) -> None:
        # No machine yet: nothing happened to the run before, and its
        # first event makes one that starts done (L{_boot}). Nothing is
        # made on the delivery path.
        boot = self._byDevice.get(record.device)
        if boot is not None and boot.record.id == record.id:
            boot.machine.configFetched()

    # Effects

    def _recordDone(self, boot: _RunBoot, workflow: str, signal: str) -> None:
        """Journal the workflow's end [B1], then move the run to C{rebooting}
        [J1]: a refused entry changes nothing, and the next signal for the
        workflow (a retried report, the other signal) tries again."""
        record = boot.record

        def change(db: Database, journal: Recorder) -> bool:
            if isSuperseded(db, record.id):
                return False  # a new provision committed first
            journal(
                REBOOTING,
                actor=f"node:{record.device}",
                device=record.device,
                run=record.id,
                fields={"workflow": workflow[:256], "signal": signal},
            )
            return True

        def recorded(ok: bool) -> None:
            if ok and self._byDevice.get(record.device) is boot:
                boot.doneAt = self.clock.seconds()
                boot.machine.done(workflow, signal)

        def refused(f: Failure) -> None:
            boot.finished.discard(workflow)
            self._failed(f)

        self.journal.change(change).addCallbacks(recorded, refused)

    def logRebooting(self, boot: _RunBoot, workflow: str, signal: str) -> None:
        """The run moved to C{rebooting}; its entry is already committed."""
        record = boot.record
        self.log.info(
            "boot.rebooting {device} {run} {workflow} {signal}",
            device=record.device,
            run=record.id,
            workflow=workflow,
            signal=signal,
        )

    def noteHookOS(self, boot: _RunBoot) -> None:
        """The node is (still) in HookOS with its configuration unread:
        journal the first time per run, keep the series up [B2] [V6]."""
        record = boot.record
        device = record.device
        first = record.id not in self._noted
        if record.id in self._noting:
            return
        if not first and not self.alerts.needsWrite(HOOKOS, device):
            self.alerts.note(HOOKOS, device, stored=False)
            return
        self._noting.add(record.id)
        now = self.clock.seconds()

        def change(db: Database, journal: Recorder) -> bool:
            if isSuperseded(db, record.id):
                return False  # a new provision committed first: no alert
            storeAlert(db, device, HOOKOS, now)
            if first:
                journal(
                    RETURNED,
                    actor=f"node:{device}",
                    device=device,
                    run=record.id,
                    fields={"since": now - boot.doneAt if boot.doneAt > 0 else None},
                )
            return True

        def stored(ok: bool) -> None:
            if not ok:
                return
            if first:
                self._noted.add(record.id)
                self.log.warn(
                    "boot.hookos-after-install {device} {run}",
                    device=device,
                    run=record.id,
                )
            current = self.runs.current(device)
            if current is not None and current.id == record.id:
                self.alerts.note(HOOKOS, device, stored=True)

        d = self.journal.change(change)
        d.addCallbacks(stored, self._failed)
        d.addBoth(lambda _: self._noting.discard(record.id))

    def completed(self, boot: _RunBoot, afterHookOS: bool) -> None:
        record = boot.record
        if not afterHookOS:
            return  # the delivery is the registry's to journal
        device = record.device

        def change(db: Database, journal: Recorder) -> None:
            clearAlert(db, device, HOOKOS)
            journal(
                COMPLETED,
                actor=f"node:{device}",
                device=device,
                run=record.id,
                fields={"after": "hookos"},
            )

        def cleared(_: None) -> None:
            self.alerts.clear(device, HOOKOS)

        self.journal.change(change).addCallbacks(cleared, self._failed)

    def _failed(self, f: Failure) -> Deferred[None] | None:
        self.log.failure("boot.record.failed", failure=f)
        return None
