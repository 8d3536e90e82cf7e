"""
The persistent SQLite database under C{paths.state}; it runs the
migrations of L{fleetd.store.migrations}.

One L{Database} wraps one connection in WAL mode with C{synchronous=FULL},
so a committed transaction survives a power cut.  It is used from exactly
one thread at a time (see L{fleetd.store.runner}); transactions are
explicit (C{isolation_level=None}).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from twisted.logger import Logger

from fleetd.store.migrations import MIGRATIONS

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


class StoreError(Exception):
    """The persistent store cannot be used as asked; one-line message."""


def _checkMigrations(migrations: Sequence[tuple[int, str]]) -> None:
    # Subsystems own reserved numbers, so gaps are allowed while branches
    # merge; numbers must still be positive, unique and in order.
    numbers = [number for number, _ in migrations]
    if any(n < 1 for n in numbers) or numbers != sorted(set(numbers)):
        raise StoreError(f"migrations must be numbered 1, 2, ...; got {numbers}")


class Database:
    """One SQLite connection with explicit transactions."""

    log = Logger()

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        """Use L{Database.open}."""
        self.connection = connection
        self.path = path
        self._batching = False
        self._depth = 0
        # Changes whenever a transaction begins or anything is rolled back:
        # what was read or written under one generation is still there
        # while the generation stays the same (L{Journal}'s head cache).
        self.generation = 0

    @classmethod
    def open(
        cls, path: Path, migrations: Sequence[tuple[int, str]] = MIGRATIONS
    ) -> Database:
        """
        Open (creating if needed) the database at C{path} and migrate it.

        @raise StoreError: the file cannot be opened, a migration fails, or
            the database was written by a newer fleetd.
        """
        _checkMigrations(migrations)
        try:
            _prepareFile(path)
            connection = sqlite3.connect(
                os.fspath(path), isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open database {path}: {e}") from e
        db = cls(connection, path)
        try:
            db._configure()
            db._migrate(migrations)
        except BaseException:
            connection.close()
            raise
        return db

    def _configure(self) -> None:
        try:
            (mode,) = self.connection.execute("PRAGMA journal_mode=WAL").fetchone()
            self.connection.execute("PRAGMA synchronous=FULL")
            self.connection.execute("PRAGMA foreign_keys=ON")
            self.connection.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as e:
            raise StoreError(f"cannot configure database {self.path}: {e}") from e
        if mode != "wal":
            raise StoreError(f"database {self.path} refuses WAL mode ({mode})")

    @property
    def userVersion(self) -> int:
        """The number of the last migration applied."""
        (version,) = self.connection.execute("PRAGMA user_version").fetchone()
        return int(version)

    def _migrate(self, migrations: Sequence[tuple[int, str]]) -> None:
        current = self.userVersion
        known = max((number for number, _ in migrations), default=0)
        if current > known:
            raise StoreError(
                f"database {self.path} has schema version {current}; "
                f"this fleetd knows up to {known}"
            )
        # Numbered, not positional: each subsystem owns its migration numbers.
        for number, sql in sorted(migrations):
            if number <= current:
                continue
            # executescript() would commit an open transaction, so the
            # script carries its own; user_version changes inside it.
            script = f"BEGIN IMMEDIATE;\n{sql}\n;PRAGMA user_version = {number};"
            try:
                self.connection.executescript(script)
                self.connection.execute("COMMIT")
            except sqlite3.Error as e:
                if self.connection.in_transaction:
                    self.connection.execute("ROLLBACK")
                raise StoreError(
                    f"migration {number} of database {self.path} failed: {e}"
                ) from e
            self.log.info("store.migrated {version}", version=number)

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """
        Run the block in one transaction: commit on success, roll back on
        any exception.  C{write=False} takes a read snapshot instead of the
        write lock.

        Inside another transaction (or a group commit) the block is a
        savepoint of it: a failure undoes only the block's own writes, and
        nothing is durable before the outermost transaction commits.  This
        is how a state change and its journal entry share one commit [J1].
        """
        if self._batching or self._depth:
            # One name for every level: savepoints nest strictly here, and
            # SQLite's RELEASE / ROLLBACK TO act on the innermost savepoint
            # of that name. A constant statement is prepared once (the
            # sqlite3 module caches statements by their text).
            name = "fleetd"
            self._checkBatch()
            self.connection.execute(f"SAVEPOINT {name}")
            try:
                yield self.connection
                self.connection.execute(f"RELEASE {name}")
            except BaseException:
                # SQLite may already have rolled the whole batch back (full
                # disk, I/O error): then there is no savepoint to return to.
                self.generation += 1
                self._checkBatch()
                self.connection.execute(f"ROLLBACK TO {name}")
                self.connection.execute(f"RELEASE {name}")
                raise
            return
        if self.connection.in_transaction:
            raise StoreError("a transaction is open outside fleetd's control")
        self.connection.execute("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")
        self.generation += 1
        self._depth += 1
        try:
            yield self.connection
            self.connection.execute("COMMIT")
        except BaseException:
            self.generation += 1
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            raise
        finally:
            self._depth -= 1

    def _checkBatch(self) -> None:
        if not self.connection.in_transaction:
            raise StoreError("the group commit was rolled back by SQLite")

    @contextmanager
    def groupCommit(self) -> Iterator[None]:
        """
        Run several units of work in one write transaction with one commit
        (one fsync); each L{transaction} inside becomes a savepoint. Nothing
        inside is durable until the block ends without an exception.
        """
        if self.connection.in_transaction:
            raise StoreError("transactions do not nest")
        self.connection.execute("BEGIN IMMEDIATE")
        self.generation += 1
        self._batching = True
        try:
            yield
            self.connection.execute("COMMIT")
        except BaseException:
            self.generation += 1
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            raise
        finally:
            self._batching = False

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one statement outside or inside the current transaction."""
        return self.connection.execute(sql, parameters)

    def close(self) -> None:
        """Close the connection; later use raises L{sqlite3.ProgrammingError}."""
        self.connection.close()


def _prepareFile(path: Path) -> None:
    """Create the parent (0700) and the database file (0600) if missing."""
    if not path.parent.exists():
        path.parent.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        os.chmod(path.parent, DIRECTORY_MODE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
