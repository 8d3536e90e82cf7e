"""
What a run's requests leave in the journal and the alert series: an
aborted delivery, and the first request for a lost or consumed run
[V4] [C2] [V6]. Every change follows [J1]: memory changes only after the
database commit that records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.runs.alerts import AlertTracker, storeAlert
from fleetd.runs.store import RunRecord, isSuperseded, noteRun
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder


class NotedRun(Protocol):
    """A run as the notes see it: its record, replaced once a note is stored."""

    record: RunRecord


class RunNotes:
    """The journal entries and alerts a run's requests cause."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        journal: AsyncJournal,
        alerts: AlertTracker,
        current: Mapping[str, object],
    ) -> None:
        self._clock = clock
        self._journal = journal
        self._alerts = alerts
        self._current = current  # device -> its current run (the boot index's)
        self._noting: set[tuple[str, str]] = set()

    def event(self, event: str, record: RunRecord, **fields: str) -> None:
        """An event that changes no stored state (an aborted delivery)."""
        self._journal.append(
            event,
            actor=f"node:{record.device}",
            device=record.device,
            run=record.id,
            fields=dict(fields),
        ).addErrback(self._failed)

    def request(
        self, run: NotedRun, note: str, kind: str, event: str, peer: str
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
        if not first and not self._alerts.needsWrite(kind, device):
            self._alerts.note(kind, device, stored=False)
            return
        self._noting.add((run.record.id, note))

        def change(db: Database, journal: Recorder) -> None:
            if isSuperseded(db, run.record.id):
                return  # the recovery provision committed first: no alert
            storeAlert(db, device, kind, self._clock.seconds())
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
                self._alerts.note(kind, device, stored=True)

        d = self._journal.change(change)
        d.addCallbacks(stored, self._failed)
        d.addBoth(lambda _: self._noting.discard((run.record.id, note)))

    def _failed(self, f: Failure) -> None:
        self.log.failure("runs.record.failed", failure=f)
