"""
Record deliveries: the journal entry and the inventory release in one
transaction [J1], retried until it commits.

Right after a delivery the served-config record exists only in the vault.
Recording it makes the record durable in the inventory (moving the
device to C{staged} if it is still C{planned}: a retirement or a kubelet
approval that committed since keeps its status) and appends one
C{run.delivered} entry that names the peer and what the release did
(C{status: staged}, C{status_kept}, or C{superseded} when it released
nothing), all in one commit. If the database or
inventory is unavailable the whole change is retried with exponential
backoff; the vault keeps the record, so the next start records it again.
A run superseded before its delivery was recorded is journaled as
delivered but released to nobody: the device keeps the status its newer
run (or its retirement) gave it.

Records wait together: while one change for new records is queued for the
database thread, later deliveries join it, so a boot storm records tens of
deliveries in one change (one savepoint, one append of all their journal
entries) instead of one change each. Each record's entries and writes are
still in the transaction that commits them [J1]. If that change fails,
nothing of it stays, and each of its records is retried on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import (
    DeviceStatus,
    IInventory,
    InventoryError,
    ServedRecord,
)
from fleetd.runs.store import isSuperseded, supersededAmong
from fleetd.store.db import Database
from fleetd.store.entries import hasEvent
from fleetd.store.journal import AsyncJournal, Recorder

FIRST_DELAY = 1.0
MAX_DELAY = 60.0


@dataclass
class _Pending:
    record: ServedRecord
    superseded: bool
    onRecorded: Callable[[], None]
    recovering: bool = False  # found at start: it may have been recorded before
    at: float | None = None  # when it was handed over, for its journal entries


def _alreadyRecorded(db: Database, run: str) -> bool:
    return hasEvent(db, run=run, event="run.delivered")


class Releaser:
    """Record each delivery once, retrying while the store is unavailable."""

    log = Logger()

    def __init__(
        self, clock: IReactorTime, inventory: IInventory, journal: AsyncJournal
    ) -> None:
        self._clock = clock
        self._inventory = inventory
        self._journal = journal
        self._pending: dict[str, _Pending] = {}
        self._timers: dict[str, IDelayedCall] = {}
        self._inflight: set[Deferred[None]] = set()
        self._stopped = False
        # New records not yet taken by the database thread; the lock
        # guards the hand-over between the two threads.
        self._batch: list[_Pending] | None = None
        self._lock = threading.Lock()

    def pending(self) -> int:
        return len(self._pending)

    def release(
        self,
        record: ServedRecord,
        *,
        superseded: bool = False,
        onRecorded: Callable[[], None] = lambda: None,
        recovering: bool = False,
    ) -> None:
        """
        Record C{record}'s delivery (and release it, unless C{superseded});
        call C{onRecorded} once that committed. C{recovering}: a served
        mark found at start, whose record may already be in the journal.
        """
        if self._stopped or record.run in self._pending:
            return
        pending = _Pending(
            record, superseded, onRecorded, recovering, self._clock.seconds()
        )
        self._pending[record.run] = pending
        with self._lock:
            batch = self._batch
            if batch is not None:  # a change not yet started takes it along
                batch.append(pending)
                return
            batch = self._batch = [pending]
        d = self._journal.change(
            lambda db, record: self._recordBatch(db, record, batch)
        ).addCallbacks(self._batchRecorded, self._batchFailed, errbackArgs=(batch,))
        if not d.called:
            self._inflight.add(d)
            d.addBoth(self._settled, d)

    def _close(self, batch: list[_Pending]) -> list[_Pending]:
        """Let no more records join C{batch}; what it holds."""
        with self._lock:
            if self._batch is batch:
                self._batch = None
            return list(batch)

    def _recordBatch(
        self, db: Database, record: Recorder, batch: list[_Pending]
    ) -> list[_Pending]:
        """(Database thread.) Record every delivery in C{batch}, in one change."""
        taken = self._close(batch)
        self._recordMany(db, record, taken)
        return taken

    def _batchRecorded(self, taken: list[_Pending]) -> None:
        for pending in taken:
            self._recorded(None, pending.record.run)

    def _batchFailed(self, f: Failure, batch: list[_Pending]) -> None:
        # Nothing of the change stayed: each record is tried again alone.
        for pending in self._close(batch):
            self._failed(f, pending.record.run, FIRST_DELAY)

    def supersede(self, run: str, onRecorded: Callable[[], None]) -> bool:
        """
        C{run} was superseded: if its delivery is still to be recorded,
        record it as superseded (release nothing), then call C{onRecorded}
        instead of what was asked before. Whether one was pending.
        """
        pending = self._pending.get(run)
        if pending is None:
            return False
        pending.superseded = True
        pending.onRecorded = onRecorded
        return True

    def _attempt(self, run: str, delay: float) -> None:
        self._timers.pop(run, None)
        pending = self._pending.get(run)
        if pending is None or self._stopped:
            return
        d = self._journal.change(lambda db, record: self._record(db, record, pending))
        d.addCallbacks(
            self._recorded, self._failed, callbackArgs=(run,), errbackArgs=(run, delay)
        )
        if not d.called:
            self._inflight.add(d)
            d.addBoth(self._settled, d)

    def _record(
        self,
        db: Database,
        record: Recorder,
        pending: _Pending,
        at: float | None = None,
    ) -> None:
        """One delivery's record, alone in its change (a retry)."""
        served = pending.record
        if pending.recovering and _alreadyRecorded(db, served.run):
            return
        # The database decides, not the flag: a provision may have committed
        # ahead of this record in the same batch.
        if pending.superseded or isSuperseded(db, served.run):
            outcome: bool | InventoryError | None = None
        else:
            outcome = self._releaseOne(db, served)
        self._entries(record, served, outcome, at)

    def _recordMany(
        self, db: Database, record: Recorder, taken: list[_Pending]
    ) -> None:
        """
        L{_record} for each of C{taken}, in order, reading what decides
        them and writing the releases once for all (when the inventory
        can: L{SQLiteInventory.releaseManyIn}); same entries, same writes.
        """
        todo = [
            p
            for p in taken
            if not (p.recovering and _alreadyRecorded(db, p.record.run))
        ]
        superseded = supersededAmong(db, [p.record.run for p in todo])
        toRelease = [
            p.record for p in todo if not (p.superseded or p.record.run in superseded)
        ]
        releaseMany = getattr(type(self._inventory), "releaseManyIn", None)
        if releaseMany is None:
            outcomes = [self._releaseOne(db, served) for served in toRelease]
        else:
            outcomes = releaseMany(self._inventory, db, toRelease)
            for outcome in outcomes:
                if (
                    isinstance(outcome, InventoryError)
                    and outcome.kind == "unavailable"
                ):
                    raise outcome
        released = {
            served.run: outcome
            for served, outcome in zip(toRelease, outcomes, strict=True)
        }
        for p in todo:
            self._entries(record, p.record, released.get(p.record.run), p.at)

    def _releaseOne(self, db: Database, served: ServedRecord) -> bool | InventoryError:
        """Release C{served}; a refusal is returned, unavailability raised."""
        try:
            return self._inventory.releaseIn(db, served)
        except InventoryError as e:
            if e.kind == "unavailable":
                raise
            return e

    def _entries(
        self,
        record: Recorder,
        served: ServedRecord,
        outcome: bool | InventoryError | None,
        at: float | None,
    ) -> None:
        """
        A delivery's journal entry (and the refusal's, if the inventory
        refused the release): C{outcome} is whether the device
        moved to staged, the inventory's refusal, or L{None} when the run
        was superseded (released to nobody).
        """
        fields: dict[str, str | bool] = {"peer": served.peer}
        if outcome is None:
            fields["superseded"] = True
        elif outcome is True:
            fields["status"] = DeviceStatus.STAGED.value
        elif outcome is False:
            # Retired or approved meanwhile: the device keeps that status.
            fields["status_kept"] = True
        record(
            "run.delivered",
            actor=f"node:{served.device}",
            device=served.device,
            run=served.run,
            fields=fields,
            at=at,
        )
        if isinstance(outcome, InventoryError):
            # Retrying cannot help (device deleted, run claimed elsewhere):
            # the delivery is recorded, the refusal beside it.
            record(
                "run.release-refused",
                actor="fleetd",
                device=served.device,
                run=served.run,
                fields={"reason": str(outcome)},
                at=at,
            )
            self.log.error(
                "runs.release.refused {run}: {reason}",
                run=served.run,
                reason=str(outcome),
            )

    def _settled(self, result: object, d: Deferred[None]) -> object:
        self._inflight.discard(d)
        return result

    def _recorded(self, _: object, run: str) -> None:
        pending = self._pending.pop(run, None)
        if pending is not None:
            pending.onRecorded()

    def _failed(self, f: Failure, run: str, delay: float) -> None:
        if self._stopped:  # the vault keeps the record; the next start retries
            return
        self.log.warn(
            "runs.record.retry {run} in {delay}s: {reason}",
            run=run,
            delay=delay,
            reason=f.getErrorMessage(),
        )
        self._timers[run] = self._clock.callLater(
            delay, self._attempt, run, min(delay * 2, MAX_DELAY)
        )

    def stop(self) -> Deferred[None]:
        """Cancel retries; fire once the attempts in flight have settled."""
        self._stopped = True
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()
        inflight = list(self._inflight)
        return DeferredList(inflight, consumeErrors=True).addCallback(lambda _: None)
