"""Tests for L{fleetd.store.db}, L{fleetd.store.runner} and L{fleetd.store.keys}."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.store import (
    JOURNAL_PURPOSE,
    MIGRATIONS,
    Database,
    DatabaseRunner,
    InlineRunner,
    IRunner,
    StoreError,
    deriveKey,
    loadOrCreateKey,
)

LAST = MIGRATIONS[-1][0]


def tables(db: Database) -> set[str]:
    rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    return {name for (name,) in rows}


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class DatabaseOpenTests(SynchronousTestCase):
    """Opening, configuring and migrating the persistent database."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "state" / "fleetd.sqlite3"

    def open(self, migrations: tuple[tuple[int, str], ...] = MIGRATIONS) -> Database:
        db = Database.open(self.path, migrations)
        self.addCleanup(db.close)
        return db

    def test_migrations_numbered(self) -> None:
        """Shipped migrations start at 1 and only grow (numbers owned per subsystem)."""
        numbers = [number for number, _ in MIGRATIONS]
        self.assertEqual(numbers[0], 1)
        self.assertEqual(numbers, sorted(set(numbers)))

    def test_open_appliesMigrations(self) -> None:
        """A new database gets every migration and records the last one."""
        db = self.open()
        self.assertEqual(db.userVersion, LAST)
        self.assertTrue({"meta", "journal", "journal_head"} <= tables(db))

    def test_open_idempotent(self) -> None:
        """Reopening applies no migration twice and keeps the data."""
        counting = ((1, "CREATE TABLE runs (n INTEGER); INSERT INTO runs VALUES (1);"),)
        self.open(counting).close()
        db = self.open(counting)
        self.assertEqual(db.userVersion, 1)
        self.assertEqual(db.execute("SELECT count(*) FROM runs").fetchone(), (1,))

    def test_open_appliesLaterMigration(self) -> None:
        """A migration appended later is applied on the next open, alone."""
        self.open().close()
        later = (*MIGRATIONS, (LAST + 1, "CREATE TABLE extra (x TEXT);"))
        db = self.open(later)
        self.assertEqual(db.userVersion, LAST + 1)
        self.assertIn("extra", tables(db))

    def test_open_failedMigrationRollsBack(self) -> None:
        """A failing migration leaves neither its tables nor its version."""
        self.open().close()
        broken = (
            *MIGRATIONS,
            (LAST + 1, "CREATE TABLE half (x); SELECT * FROM nowhere;"),
        )
        error = self.assertRaises(StoreError, Database.open, self.path, broken)
        self.assertIn(f"migration {LAST + 1}", str(error))
        db = self.open()
        self.assertEqual(db.userVersion, LAST)
        self.assertNotIn("half", tables(db))

    def test_open_refusesMisnumbered(self) -> None:
        """Migrations out of order, repeated or not starting at 1 are refused."""
        for bad in (
            ((1, "SELECT 1;"), (3, "SELECT 1;"), (2, "SELECT 1;")),
            ((1, "SELECT 1;"), (1, "SELECT 1;")),
            ((2, "SELECT 1;"),),
        ):
            self.assertRaises(StoreError, Database.open, self.path, bad)
        bad = ((1, "SELECT 1;"), (3, "SELECT 1;"), (2, "SELECT 1;"))
        self.assertRaises(StoreError, Database.open, self.path, bad)

    def test_open_refusesNewerVersion(self) -> None:
        """A database written by a newer fleetd is refused, untouched."""
        self.open().close()
        raw = sqlite3.connect(self.path)
        raw.execute(f"PRAGMA user_version = {LAST + 1}")
        raw.close()
        error = self.assertRaises(StoreError, Database.open, self.path)
        self.assertIn("knows up to", str(error))
        self.assertIn(str(self.path), str(error))

    def test_open_pragmas(self) -> None:
        """WAL, synchronous=FULL and foreign keys are really in force (§4)."""
        db = self.open()
        self.assertEqual(db.execute("PRAGMA journal_mode").fetchone(), ("wal",))
        self.assertEqual(db.execute("PRAGMA synchronous").fetchone(), (2,))
        self.assertEqual(db.execute("PRAGMA foreign_keys").fetchone(), (1,))

    def test_open_modes(self) -> None:
        """The database and its WAL are 0600 in a new 0700 directory (§4)."""
        db = self.open()
        with db.transaction() as conn:
            conn.execute("INSERT INTO meta VALUES ('a', 'b')")
        self.assertEqual(mode(self.path), 0o600)
        self.assertEqual(mode(self.path.parent), 0o700)
        self.assertEqual(mode(self.path.with_name(self.path.name + "-wal")), 0o600)

    def test_open_fixesFileMode(self) -> None:
        """A database file found with mode 0644 is tightened to 0600."""
        self.open().close()
        os.chmod(self.path, 0o644)
        self.open()
        self.assertEqual(mode(self.path), 0o600)

    def test_open_notAFile(self) -> None:
        """A directory where the database should be is a StoreError."""
        self.path.mkdir(parents=True)
        self.assertRaises(StoreError, Database.open, self.path)


class TransactionTests(SynchronousTestCase):
    """L{Database.transaction} commits, rolls back and does not nest."""

    def setUp(self) -> None:
        self.db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        self.addCleanup(self.db.close)

    def count(self) -> int:
        (n,) = self.db.execute("SELECT count(*) FROM meta").fetchone()
        return int(n)

    def test_transaction_commits(self) -> None:
        """A block that returns normally is committed."""
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO meta VALUES ('a', 'b')")
        self.assertFalse(self.db.connection.in_transaction)
        self.assertEqual(self.count(), 1)

    def test_transaction_rollsBack(self) -> None:
        """A block that raises is rolled back and the exception propagates."""

        def failing() -> None:
            with self.db.transaction() as conn:
                conn.execute("INSERT INTO meta VALUES ('a', 'b')")
                raise ZeroDivisionError()

        self.assertRaises(ZeroDivisionError, failing)
        self.assertFalse(self.db.connection.in_transaction)
        self.assertEqual(self.count(), 0)

    def test_transaction_nestedIsSavepoint(self) -> None:
        """
        [J1] A transaction inside another is a savepoint: its failure undoes
        only its own writes, and nothing commits before the outer block.
        """
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO meta VALUES ('outer', '1')")
            with self.assertRaises(ZeroDivisionError):
                with self.db.transaction() as inner:
                    inner.execute("INSERT INTO meta VALUES ('inner', '1')")
                    raise ZeroDivisionError()
            with self.db.transaction() as inner:
                inner.execute("INSERT INTO meta VALUES ('kept', '1')")
        rows = self.db.execute("SELECT key FROM meta ORDER BY key").fetchall()
        self.assertEqual(rows, [("kept",), ("outer",)])

    def test_transaction_outerFailureUndoesNested(self) -> None:
        """[J1] When the outer transaction fails, its savepoints go with it."""

        def failing() -> None:
            with self.db.transaction() as conn:
                with self.db.transaction() as inner:
                    inner.execute("INSERT INTO meta VALUES ('inner', '1')")
                conn.execute("INSERT INTO meta VALUES ('outer', '1')")
                raise ZeroDivisionError()

        self.assertRaises(ZeroDivisionError, failing)
        self.assertEqual(self.count(), 0)

    def test_transaction_foreignTransactionRefused(self) -> None:
        """A transaction opened behind fleetd's back is not silently joined."""
        self.db.execute("BEGIN")
        self.addCleanup(self.db.execute, "ROLLBACK")
        self.assertRaises(StoreError, self.db.transaction().__enter__)


class KeyTests(SynchronousTestCase):
    """The persistent master key and derived keys."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "fleetd.key"

    def test_loadOrCreateKey_creates(self) -> None:
        """A missing key file is created: 32 bytes, mode 0600, no temp left."""
        key = loadOrCreateKey(self.path)
        self.assertEqual(len(key), 32)
        self.assertEqual(mode(self.path), 0o600)
        self.assertEqual(os.listdir(self.path.parent), ["fleetd.key"])

    def test_loadOrCreateKey_reuses(self) -> None:
        """A second call returns the stored key unchanged."""
        self.assertEqual(loadOrCreateKey(self.path), loadOrCreateKey(self.path))

    def test_loadOrCreateKey_distinct(self) -> None:
        """Two new key files get different random keys."""
        other = Path(self.mktemp()) / "fleetd.key"
        self.assertNotEqual(loadOrCreateKey(self.path), loadOrCreateKey(other))

    def test_loadOrCreateKey_refusesReadable(self) -> None:
        """A key file readable by group or others is refused, naming the path."""
        loadOrCreateKey(self.path)
        os.chmod(self.path, 0o644)
        error = self.assertRaises(StoreError, loadOrCreateKey, self.path)
        self.assertIn(str(self.path), str(error))
        self.assertIn("0644", str(error))

    def test_loadOrCreateKey_refusesWrongSize(self) -> None:
        """A key file that is not exactly 32 bytes is refused."""
        self.path.parent.mkdir()
        for size in (0, 31, 33):
            self.path.write_bytes(b"k" * size)
            os.chmod(self.path, 0o600)
            error = self.assertRaises(StoreError, loadOrCreateKey, self.path)
            self.assertIn(str(self.path), str(error))

    def test_loadOrCreateKey_refusesSymlink(self) -> None:
        """A symlinked key file is refused rather than followed."""
        target = Path(self.mktemp())
        target.write_bytes(b"k" * 32)
        os.chmod(target, 0o600)
        self.path.parent.mkdir()
        self.path.symlink_to(target.resolve())
        self.assertRaises(StoreError, loadOrCreateKey, self.path)

    def test_deriveKey_separatesPurposes(self) -> None:
        """Derived keys are deterministic, 32 bytes, and differ by purpose."""
        master = b"m" * 32
        journal = deriveKey(master, JOURNAL_PURPOSE)
        self.assertEqual(journal, deriveKey(master, JOURNAL_PURPOSE))
        self.assertEqual(len(journal), 32)
        self.assertNotEqual(journal, deriveKey(master, "fleetd code digest v1"))
        self.assertNotEqual(journal, deriveKey(b"n" * 32, JOURNAL_PURPOSE))

    def test_deriveKey_refusesShortMaster(self) -> None:
        """A master key shorter than 32 bytes is a programming error."""
        self.assertRaises(ValueError, deriveKey, b"short", JOURNAL_PURPOSE)


class InlineRunnerTests(SynchronousTestCase):
    """L{InlineRunner} runs calls synchronously with the same contract."""

    def setUp(self) -> None:
        self.db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        self.addCleanup(self.db.close)
        self.runner: IRunner = InlineRunner(self.db)

    def test_run_result(self) -> None:
        """The call's result is already in the returned Deferred."""
        d = self.runner.run(lambda db: db.userVersion)
        self.assertEqual(self.successResultOf(d), LAST)

    def test_run_failure(self) -> None:
        """An exception becomes the returned Deferred's failure."""

        def boom(db: Database) -> None:
            raise ZeroDivisionError()

        self.failureResultOf(self.runner.run(boom), ZeroDivisionError)


class DatabaseRunnerTests(TestCase):
    """L{DatabaseRunner} runs calls on its own thread (real reactor)."""

    def setUp(self) -> None:
        self.db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        theReactor: IReactorFromThreads = reactor  # type: ignore[assignment]
        self.runner = DatabaseRunner(theReactor, self.db)
        self.runner.start()
        self.addCleanup(self.runner.stop)

    async def test_run_otherThread(self) -> None:
        """Work runs off the reactor thread, and results come back (§4)."""
        ident, version = await self.runner.run(
            lambda db: (threading.get_ident(), db.userVersion)
        )
        self.assertNotEqual(ident, threading.get_ident())
        self.assertEqual(version, LAST)

    async def test_run_serialOnOneThread(self) -> None:
        """Calls run one at a time, in order, all on the same thread."""

        def call(i: int) -> Callable[[Database], tuple[int, int]]:
            return lambda db: (i, threading.get_ident())

        calls = [self.runner.run(call(i)) for i in range(5)]
        results = [await d for d in calls]
        self.assertEqual([i for i, _ in results], list(range(5)))
        self.assertEqual(len({ident for _, ident in results}), 1)

    async def test_run_failure(self) -> None:
        """An exception on the database thread fails the Deferred."""

        def boom(db: Database) -> None:
            raise ZeroDivisionError()

        d: Deferred[None] = self.runner.run(boom)
        with self.assertRaises(ZeroDivisionError):
            await d

    def test_stop_closesDatabase(self) -> None:
        """Stopping joins the thread, closes the database and fails new calls."""
        self.runner.stop()
        self.runner.stop()
        self.assertRaises(sqlite3.ProgrammingError, self.db.execute, "SELECT 1")
        self.failureResultOf(self.runner.run(lambda db: None), StoreError)
        names = [t.name for t in threading.enumerate()]
        self.assertEqual([n for n in names if "fleetd-db" in n], [])
