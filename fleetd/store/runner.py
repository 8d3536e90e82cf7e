"""
Run database work off the reactor thread.

L{DatabaseRunner} owns one dedicated thread, so every call sees the single
connection serially and in submission order; L{InlineRunner} runs calls
synchronously for L{twisted.trial.unittest.SynchronousTestCase} tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from fleetd.store.db import Database, StoreError

_T = TypeVar("_T")


class IRunner(Protocol):
    """Something that runs C{f(db)} somewhere and reports the result."""

    def run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        """Call C{f} with the database; fire with its result or failure."""


class DatabaseRunner:
    """Run database calls on one dedicated thread named C{fleetd-db}."""

    def __init__(self, reactor: IReactorFromThreads, db: Database) -> None:
        self._reactor = reactor
        self._db = db
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="fleetd-db")
        self._stopped = False

    def start(self) -> None:
        """Start the database thread."""
        self._pool.start()

    def stop(self) -> None:
        """
        Let queued calls finish, join the thread and close the database.
        Idempotent; this blocks while queued work drains.
        """
        if self._stopped:
            return
        self._stopped = True
        self._pool.stop()
        self._db.close()

    def run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        """Call C{f(db)} on the database thread."""
        if self._stopped:
            return fail(StoreError("database runner is stopped"))
        return deferToThreadPool(self._reactor, self._pool, f, self._db)


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


class RunnerService(Service):
    """Start and stop the database thread with the daemon."""

    def __init__(self, runner: DatabaseRunner) -> None:
        self.runner = runner

    def startService(self) -> None:
        super().startService()
        self.runner.start()

    def stopService(self) -> None:
        super().stopService()
        self.runner.stop()
