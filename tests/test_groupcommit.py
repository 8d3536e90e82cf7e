"""Group commit in L{fleetd.store.runner.DatabaseRunner}."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

from twisted.internet import reactor
from twisted.internet.defer import DeferredList
from twisted.internet.interfaces import IReactorFromThreads
from twisted.trial.unittest import TestCase

from fleetd.store.db import Database
from fleetd.store.runner import DatabaseRunner, _runBatch


class GroupCommitTests(TestCase):
    def setUp(self) -> None:
        self.db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        self.db.execute("CREATE TABLE t (n INTEGER NOT NULL)")
        self.runner = DatabaseRunner(cast(IReactorFromThreads, reactor), self.db)
        self.runner.start()
        self.addCleanup(self.runner.stop)

    def insert(self, n: int) -> Any:
        def f(db: Database) -> tuple[int, bool]:
            with db.transaction() as conn:
                conn.execute("INSERT INTO t (n) VALUES (?)", (n,))
                if n == 13:
                    raise ValueError("unlucky")
            return n, db._batching

        return f

    async def test_queuedCalls_shareOneCommit_failuresAlone(self) -> None:
        """
        Calls queued while the database thread is busy run in one group
        commit, in order; a failing call's writes alone are rolled back.
        """
        gate = threading.Event()
        first = self.runner.run(lambda db: gate.wait(10))
        queued = [self.runner.run(self.insert(n)) for n in range(1, 31)]
        gate.set()
        await first
        results = await DeferredList(queued, consumeErrors=True)
        ok = [value for success, value in results if success]
        failed = [value for success, value in results if not success]
        self.assertEqual([n for n, _ in ok], [n for n in range(1, 31) if n != 13])
        self.assertTrue(all(batched for _, batched in ok))  # one shared commit
        self.assertEqual(len(failed), 1)
        self.assertIsInstance(failed[0].value, ValueError)
        rows = await self.runner.run(
            lambda db: [r[0] for r in db.execute("SELECT n FROM t ORDER BY rowid")]
        )
        self.assertEqual(rows, [n for n in range(1, 31) if n != 13])

    async def test_idle_callRunsAlone(self) -> None:
        """When the thread is idle a call runs at once in its own transaction."""
        n, batched = await self.runner.run(self.insert(1))
        self.assertEqual((n, batched), (1, False))

    async def test_stop_runsWhatWasQueued(self) -> None:
        """Stopping lets queued calls finish, in order, before closing."""
        gate = threading.Event()
        first = self.runner.run(lambda db: gate.wait(10))
        later = [self.runner.run(self.insert(n)) for n in (1, 2)]
        threading.Timer(0.05, gate.set).start()  # the reactor is blocked in stop()
        self.runner.stop()  # blocks until the thread is done, then runs the rest
        await first
        self.assertEqual([await d for d in later], [(1, True), (2, True)])


class StopOrderTests(TestCase):
    async def test_stop_reportsInFlightBeforeQueued(self) -> None:
        """On stop, the batch in flight reports first, then the queued calls."""
        db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        runner = DatabaseRunner(cast(IReactorFromThreads, reactor), db)
        runner.start()
        order: list[str] = []
        gate = threading.Event()
        first = runner.run(lambda db: gate.wait(10))
        first.addCallback(lambda _: order.append("in flight"))
        later = runner.run(lambda db: 2)
        later.addCallback(lambda _: order.append("queued"))
        threading.Timer(0.05, gate.set).start()
        runner.stop()
        self.assertEqual(order, ["in flight", "queued"])


class AutoRollbackTests(TestCase):
    def test_sqliteRollsBackBatch_nothingLaterRunsAlone(self) -> None:
        """
        When SQLite rolls the whole group commit back (full disk, I/O error,
        interrupt), every call in it fails and no later call commits alone.
        """
        db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        self.addCleanup(db.close)
        db.execute("CREATE TABLE t (n INTEGER)")

        def insert(n: int) -> Any:
            def f(db: Database) -> int:
                with db.transaction() as conn:
                    conn.execute("INSERT INTO t VALUES (?)", (n,))
                return n

            return f

        def interrupted(db: Database) -> None:
            with db.transaction() as conn:
                conn.execute("INSERT INTO t VALUES (99)")
                db.connection.set_progress_handler(lambda: 1, 1)  # SQLITE_INTERRUPT
                try:
                    conn.execute("INSERT INTO t SELECT n FROM t")
                finally:
                    db.connection.set_progress_handler(None, 1)

        outcomes = _runBatch(db, [insert(1), interrupted, insert(2), insert(3)])
        self.assertEqual([ok for ok, _ in outcomes], [False] * 4)
        self.assertEqual(list(db.execute("SELECT n FROM t")), [])


class DedicatedThreadTests(TestCase):
    async def test_callsBeforeStart_runOnceStarted_oneThread_joinedOnStop(self) -> None:
        """
        A call made before the runner starts waits for it and then runs on
        the one dedicated C{fleetd-db} thread; stopping joins that thread.
        """
        db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        runner = DatabaseRunner(cast(IReactorFromThreads, reactor), db)
        self.addCleanup(runner.stop)
        early = runner.run(lambda db: threading.current_thread().name)
        self.assertNoResult(early)
        runner.start()
        runner.start()  # idempotent: still one thread
        self.assertEqual(await early, "fleetd-db")
        names = [t.name for t in threading.enumerate()]
        self.assertEqual(names.count("fleetd-db"), 1)
        runner.stop()
        self.assertNotIn("fleetd-db", [t.name for t in threading.enumerate()])
