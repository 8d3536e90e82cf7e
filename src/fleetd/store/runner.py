"""
Run database work off the reactor thread.

L{DatabaseRunner} owns one dedicated thread, so every call sees the single
connection serially and in submission order; L{InlineRunner} runs calls
synchronously for L{twisted.trial.unittest.SynchronousTestCase} tests.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from twisted.application.service import MultiService, Service
from twisted.internet.defer import (
    Deferred,
    DeferredList,
    fail,
    maybeDeferred,
    succeed,
)
from twisted.internet.interfaces import IReactorFromThreads
from twisted.python.failure import Failure

from fleetd.store.db import Database, StoreError

_T = TypeVar("_T")


class IRunner(Protocol):
    """Something that runs C{f(db)} somewhere and reports the result."""

    def run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        """Call C{f} with the database; fire with its result or failure."""


class DatabaseRunner:
    """
    Run database calls on one dedicated thread named C{fleetd-db}, with
    group commit.

    Calls queue up while the thread is busy; the next batch runs them all,
    in submission order, in one write transaction (each call's own
    transaction a savepoint) and fires their Deferreds only after the single
    commit. Under load a boot storm's many small durable writes share one
    fsync; when idle a call runs at once, alone.

    The thread is fed batches through a L{queue.SimpleQueue} and reports
    back with C{callFromThread}: at most one batch is in flight, so the
    thread needs no pool, no worker bookkeeping and no context capture
    (a Twisted C{ThreadPool} call cost the reactor thread several times
    more).
    """

    maxBatch = 256

    def __init__(self, reactor: IReactorFromThreads, db: Database) -> None:
        self._reactor = reactor
        self._db = db
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._queue: list[tuple[Callable[[Database], Any], Deferred[Any]]] = []
        self._inflight: tuple[list[Any], list[tuple[bool, Any]]] | None = None
        self._busy = False
        self._stopped = False

    def start(self) -> None:
        """Start the database thread."""
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(
                target=self._loop, name="fleetd-db", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        get = self._work.get
        while (work := get()) is not None:
            work()

    def stop(self) -> None:
        """
        Let queued calls finish, join the thread and close the database.
        Idempotent; this blocks while queued work drains.
        """
        if self._stopped:
            return
        self._stopped = True
        if self._thread is not None:  # the batch in flight completes...
            self._work.put(None)
            self._thread.join()
            self._thread = None
        if self._inflight is not None:  # ...and reports before anything later
            batch, outcomes = self._inflight
            self._inflight = None
            self._deliver(batch, outcomes)
        while self._queue:  # what was still waiting runs here, in order
            batch, self._queue = (
                self._queue[: self.maxBatch],
                self._queue[self.maxBatch :],
            )
            self._deliver(batch, _runBatch(self._db, [f for f, _ in batch]))
        self._db.close()

    def run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        """Call C{f(db)} on the database thread."""
        if self._stopped:
            return fail(StoreError("database runner is stopped"))
        d: Deferred[_T] = Deferred()
        self._queue.append((f, d))
        if not self._busy:
            self._next()
        return d

    def _next(self) -> None:
        if self._stopped or not self._queue:
            self._busy = False
            return
        self._busy = True
        batch, self._queue = self._queue[: self.maxBatch], self._queue[self.maxBatch :]
        functions = [f for f, _ in batch]

        def work() -> None:
            outcomes: list[tuple[bool, Any]] = []
            try:
                outcomes = _runBatch(self._db, functions)
            finally:  # whatever happened, the reactor hears of it
                if len(outcomes) != len(functions):
                    failure = Failure(StoreError("database call did not complete"))
                    outcomes = [(False, failure)] * len(functions)
                self._inflight = (batch, outcomes)
                self._reactor.callFromThread(self._finished)

        self._work.put(work)

    def _finished(self) -> None:
        if self._inflight is not None:  # not already delivered by stop()
            batch, outcomes = self._inflight
            self._inflight = None
            self._deliver(batch, outcomes)
        self._next()

    @staticmethod
    def _deliver(batch: list[Any], outcomes: list[tuple[bool, Any]]) -> None:
        for (_, d), (ok, value) in zip(batch, outcomes, strict=True):
            if d.called:  # cancelled by its caller
                continue
            if ok:
                d.callback(value)
            else:
                d.errback(value)


def _runBatch(
    db: Database, functions: list[Callable[[Database], Any]]
) -> list[tuple[bool, Any]]:
    """
    Run C{functions} in one group commit; a failing one fails alone, a
    failing commit fails them all.
    """
    if len(functions) == 1:  # nothing to share: the call's own transaction
        try:
            return [(True, functions[0](db))]
        except BaseException:
            return [(False, Failure())]
    outcomes: list[tuple[bool, Any]] = []
    try:
        with db.groupCommit():
            for f in functions:
                try:
                    outcomes.append((True, f(db)))
                except BaseException:
                    outcomes.append((False, Failure()))
                if not db.connection.in_transaction:
                    # SQLite rolled the batch back: nothing in it is durable.
                    raise StoreError("the group commit was rolled back by SQLite")
    except BaseException:
        failure = Failure()
        return [(False, failure) for _ in functions]
    return outcomes


class InlineRunner:
    """Run database calls synchronously, on the calling thread (tests)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        """Call C{f(db)} now; the result is already fired."""
        try:
            result = f(self._db)
        except Exception:
            return fail()
        return succeed(result)


class RunnerService(MultiService):
    """
    The database thread around the services that use it: started before
    its children, stopped only once every child finished stopping.
    """

    def __init__(self, runner: DatabaseRunner) -> None:
        super().__init__()
        self.runner = runner

    def startService(self) -> None:
        Service.startService(self)
        self.runner.start()
        for child in self:
            child.startService()

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)
        stopping = [maybeDeferred(child.stopService) for child in reversed(list(self))]
        return DeferredList(stopping, consumeErrors=True).addCallback(
            lambda _: self.runner.stop()
        )
