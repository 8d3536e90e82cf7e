"""
What the Workflow watch (L{fleetd.tink.wfstate}) tells of the Workflows
fleetd made, and how fleetd reports what someone else did to one: never
by making it again [V3].

L{judge} decides from plain values: a made Workflow (C{created} or
C{changed}) seen deleted is C{lost}, or C{removed} when it had ended
(POST or SUCCESS: the install ran, and whoever deleted it cleaned up); one
whose labels are no longer fleetd's for its device and run is
C{disowned} (fleetd never touches it again); one whose spec is not the
spec fleetd made is C{changed} (still fleetd's: a new provision or a
retirement deletes it). A name now held by another object (another uid)
means fleetd's was deleted.

L{Reports} records each verdict with its journal entry [J1]
(C{tinkerbell.workflow-lost}, C{tinkerbell.workflow-removed}) and counts
it; a list after a gap that lacks a made Workflow is confirmed with a
read before anything is reported. A verdict the journal could not take is
tried again later.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.k8s.errors import KubeError
from fleetd.logs import ThrottledLog
from fleetd.store.entries import Entry
from fleetd.tinkerbell import objects
from fleetd.tinkerbell.api import TinkerbellAPI
from fleetd.tinkerbell.book import Book
from fleetd.tinkerbell.store import (
    CHANGED,
    CREATED,
    DISOWNED,
    LOST,
    REMOVED,
    WorkflowRecord,
    moved,
)

ENDED = frozenset({"POST", "SUCCESS"})
RETRY = 10.0
_log = Logger()
HOW = {LOST: "deleted", CHANGED: "changed", DISOWNED: "disowned"}


def ended(state: str | None) -> bool:
    return state is not None and state.upper().removeprefix("STATE_") in ENDED


def judge(
    record: WorkflowRecord, obj: dict[str, Any] | None, seen: str | None
) -> str | None:
    """
    The state a made Workflow moves to, given it as it is now (L{None}:
    deleted) and the last state the watch saw; L{None}: no change.
    """
    if record.state not in (CREATED, CHANGED):
        return None
    if obj is None or (record.uid and objects.uidOf(obj) != record.uid):
        return REMOVED if ended(seen) else LOST
    if not objects.owned(obj, record.device, record.run):
        return DISOWNED
    if record.state == CREATED and objects.specDigest(obj) != record.digest:
        return CHANGED
    return None


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Reports:
    """The Workflow watch's observer (L{fleetd.tink.wfstate.IWorkflowObserver})."""

    def __init__(
        self, clock: IReactorTime, api: TinkerbellAPI, book: Book, lost: Counter
    ) -> None:
        self.clock = clock
        self.api = api
        self.book = book
        self.lost = lost
        self.log = ThrottledLog(clock, burst=3, window=60.0)
        self._retries: dict[tuple[str, str], IDelayedCall] = {}
        self._calls: set[Deferred[None]] = set()
        self._stopped = False

    # IWorkflowObserver

    def workflowSeen(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        state = objects.stateOf(obj)
        record = self.book.workflows.get(key)
        if record is None:
            return
        if state is not None:
            self.book.seen[key] = state
        self._decide(record, obj)

    def workflowDeleted(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        record = self.book.workflows.get(key)
        if record is None:
            return
        if record.uid and objects.uidOf(obj) not in ("", record.uid):
            return  # another object of that name went
        self._decide(record, None)

    def workflowsListed(self, items: list[dict[str, Any]]) -> None:
        present = {_key(obj): obj for obj in items}
        for obj in present.values():
            self.workflowSeen(obj)
        for key, record in list(self.book.workflows.items()):
            if key not in present and record.state in (CREATED, CHANGED):
                self._confirm(record)  # gone during a gap? read it

    def stop(self) -> None:
        self._stopped = True
        for call in self._retries.values():
            if call.active():
                call.cancel()
        self._retries.clear()
        for d in list(self._calls):
            d.cancel()

    # Verdicts

    def _decide(self, record: WorkflowRecord, obj: dict[str, Any] | None) -> None:
        verdict = judge(record, obj, self.book.seen.get(record.key, record.seen))
        if verdict is not None:
            self._track(Deferred.fromCoroutine(self._record(record, verdict)))

    def _confirm(self, record: WorkflowRecord) -> None:
        async def read() -> None:
            try:
                obj = await self.api.get("workflows", record.name)
            except KubeError as e:
                self.log.warn(
                    "tinkerbell.confirm-failed {workflow}: {reason}",
                    workflow=record.path,
                    reason=str(e),
                )
                self._later(record)
                return
            current = self.book.workflows.get(record.key, record)
            verdict = judge(current, obj, self.book.seen.get(record.key))
            if verdict is not None:
                await self._record(current, verdict)

        self._track(Deferred.fromCoroutine(read()))

    def _track(self, d: Deferred[None]) -> None:
        self._calls.add(d)
        d.addErrback(self._bug)
        d.addBoth(lambda _: self._calls.discard(d))

    @staticmethod
    def _bug(f: Failure) -> None:
        if f.check(CancelledError) is None:
            _log.failure("tinkerbell.watch.bug", f)

    async def _record(self, record: WorkflowRecord, verdict: str) -> None:
        current = self.book.workflows.get(record.key)
        if current is None or current.state != record.state:
            return  # decided meanwhile (a deletion of fleetd's own, say)
        seen = self.book.seen.get(record.key, record.seen)
        event = (
            "tinkerbell.workflow-removed"
            if verdict == REMOVED
            else ("tinkerbell.workflow-lost")
        )
        how = HOW.get(verdict, "deleted")
        fields = {"workflow": record.path, "how": how, "seen": seen}
        if verdict != REMOVED:
            fields["note"] = "fleetd does not make it again; a new provision does"
        entry = Entry(event, "fleetd", record.device, record.run, fields)
        updated = moved(record, verdict, self.clock.seconds(), seen=seen)
        try:
            await self.book.commit([updated], [], [entry])
        except Exception:
            _log.failure("tinkerbell.report-failed {workflow}", workflow=record.path)
            self._later(record)
            return
        self.lost.labels(how if verdict != REMOVED else "removed").inc()
        self.log.warn(
            "tinkerbell.workflow-{how} {workflow}: not made again",
            how=how,
            workflow=record.path,
        )

    def _later(self, record: WorkflowRecord) -> None:
        if self._stopped or record.key in self._retries:
            return

        def again() -> None:
            self._retries.pop(record.key, None)
            current = self.book.workflows.get(record.key)
            if current is not None:
                self._confirm(current)

        self._retries[record.key] = self.clock.callLater(RETRY, again)
