"""
The persistent SQLite database under C{paths.state}, and its migrations.

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

from fleetd.kube import schema as _kube

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) STRICT;
        CREATE TABLE journal (
            seq INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            event TEXT NOT NULL,
            actor TEXT NOT NULL,
            device TEXT,
            run TEXT,
            fields TEXT NOT NULL,
            digest TEXT NOT NULL
        ) STRICT;
        CREATE INDEX journal_by_device ON journal (device, seq);
        CREATE INDEX journal_by_run ON journal (run, seq);
        CREATE TABLE journal_head (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            seq INTEGER NOT NULL,
            digest TEXT NOT NULL,
            mac TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        2,
        # The embedded inventory (fleetd.inventory.sqlite).  Serials are
        # unique case-insensitively, as NetBox looks them up (iexact).
        """
        CREATE TABLE devices (
            name TEXT PRIMARY KEY,
            serial TEXT NOT NULL COLLATE NOCASE UNIQUE,
            uuid TEXT NOT NULL UNIQUE,
            class TEXT NOT NULL,
            cluster TEXT,
            status TEXT NOT NULL,
            desired_action TEXT
        ) STRICT;
        CREATE TABLE device_macs (
            mac TEXT PRIMARY KEY,
            device TEXT NOT NULL REFERENCES devices (name) ON DELETE CASCADE,
            position INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX device_macs_by_device ON device_macs (device, position);
        CREATE TABLE served_records (
            run TEXT PRIMARY KEY,
            device TEXT NOT NULL REFERENCES devices (name),
            served_at REAL NOT NULL,
            peer TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        3,
        # Provision runs (fleetd.runs.store): keyed digests of codes, never
        # the codes; the configurations themselves live in the vault.
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            device TEXT NOT NULL,
            digest TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL,
            desired_action TEXT,
            superseded_by TEXT,
            missing_noted INTEGER NOT NULL DEFAULT 0,
            refetch_noted INTEGER NOT NULL DEFAULT 0
        ) STRICT;
        CREATE INDEX runs_by_device ON runs (device, created_at);
        """,
    ),
    (
        4,
        # Alert series that must survive a restart [V6]: when a device's
        # node first and last asked for a lost or consumed configuration.
        """
        CREATE TABLE alerts (
            device TEXT NOT NULL,
            kind TEXT NOT NULL,
            first_at REAL NOT NULL,
            last_at REAL NOT NULL,
            PRIMARY KEY (device, kind)
        ) STRICT;
        CREATE INDEX runs_current ON runs (superseded_by, device);
        """,
    ),
    (
        5,
        # Machine trust (fleetd.trust): evidence tying chassis serials to EK
        # digests, and the owner's approved EK bindings [T1].  Evidence is
        # withdrawn, never deleted; serials compare case-insensitively.
        """
        CREATE TABLE evidence (
            id INTEGER PRIMARY KEY,
            serial TEXT NOT NULL COLLATE NOCASE,
            ek_sha256 TEXT NOT NULL,
            kind TEXT NOT NULL,
            ref TEXT,
            recorded_at REAL NOT NULL,
            recorded_by TEXT NOT NULL,
            withdrawn_at REAL,
            withdrawn_by TEXT,
            withdrawn_reason TEXT
        ) STRICT;
        CREATE INDEX evidence_by_serial ON evidence (serial, id);
        CREATE INDEX evidence_by_ek ON evidence (ek_sha256, id);
        CREATE TABLE ek_bindings (
            serial TEXT PRIMARY KEY COLLATE NOCASE,
            ek_sha256 TEXT NOT NULL UNIQUE,
            device TEXT NOT NULL,
            evidence INTEGER NOT NULL REFERENCES evidence (id),
            approved_at REAL NOT NULL,
            approved_by TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        6,
        # Disk reports (fleetd.trust.disks) [D1]: each device's latest
        # report, and one row per disk serial for the fleet-wide check.
        """
        CREATE TABLE disk_reports (
            device TEXT PRIMARY KEY,
            serial TEXT NOT NULL,
            reported_at REAL NOT NULL,
            verdict TEXT NOT NULL,
            target TEXT,
            disks TEXT NOT NULL
        ) STRICT;
        CREATE TABLE disk_serials (
            serial TEXT NOT NULL COLLATE NOCASE,
            device TEXT NOT NULL
                REFERENCES disk_reports (device) ON DELETE CASCADE,
            name TEXT NOT NULL,
            PRIMARY KEY (device, name)
        ) STRICT;
        CREATE INDEX disk_serials_by_serial ON disk_serials (serial, device);
        """,
    ),
    (
        7,
        # LDevID records [T4] (fleetd.pki.records): every certificate fleetd
        # issued, each node's current one, and legacy cut-overs.
        """
        CREATE TABLE ldevids (
            cert_serial TEXT PRIMARY KEY,
            chassis TEXT NOT NULL COLLATE NOCASE,
            device TEXT NOT NULL,
            issuer TEXT NOT NULL,
            not_after REAL NOT NULL,
            issued_at REAL NOT NULL,
            how TEXT NOT NULL CHECK (how IN ('attest', 'renew')),
            ek_sha256 TEXT,
            current INTEGER NOT NULL CHECK (current IN (0, 1))
        ) STRICT;
        CREATE UNIQUE INDEX ldevids_current ON ldevids (chassis) WHERE current = 1;
        CREATE TABLE ldevid_cutovers (
            chassis TEXT PRIMARY KEY COLLATE NOCASE,
            at REAL NOT NULL,
            from_issuer TEXT NOT NULL,
            from_serial TEXT NOT NULL
        ) STRICT;
        """,
    ),
    # Kubernetes credentials (fleetd.kube.store): tokens, kubelet
    # certificates, the cluster-wide token and its requests.
    (9, _kube.MIGRATION_9),
    (10, _kube.MIGRATION_10),
    (
        11,
        # The NetBox inventory (fleetd.netbox): the durable outbox of status
        # changes and releases, written in the transaction of the change
        # it carries [J1]; the journal mirror's progress; what NetBox has
        # no field for (desired actions); the last device list NetBox gave
        # (so a start while NetBox is down still knows the fleet).
        """
        CREATE TABLE netbox_outbox (
            id INTEGER PRIMARY KEY,
            device TEXT NOT NULL,
            status TEXT NOT NULL,
            run TEXT UNIQUE,
            served_at REAL,
            peer TEXT,
            digest TEXT,
            created_at REAL NOT NULL,
            state TEXT NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            outcome TEXT
        ) STRICT;
        CREATE INDEX netbox_outbox_by_state ON netbox_outbox (state, id);
        CREATE INDEX netbox_outbox_by_device ON netbox_outbox (device, id);
        CREATE TABLE netbox_mirror (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            seq INTEGER NOT NULL,
            doubt INTEGER
        ) STRICT;
        CREATE TABLE netbox_local (
            device TEXT PRIMARY KEY,
            desired_action TEXT
        ) STRICT;
        CREATE TABLE netbox_devices (
            name TEXT PRIMARY KEY,
            device TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        12,
        # Disk claims [D1] (fleetd.trust.disks): the order in which devices
        # first reported each serial they still report; the first keeps it.
        # Reports stored before are ordered by their report time, and their
        # refusal lines stop naming the other device (the journal does).
        """
        ALTER TABLE disk_serials ADD COLUMN claim INTEGER NOT NULL DEFAULT 0;
        UPDATE disk_serials SET claim = (
            SELECT r.n FROM (
                SELECT device, ROW_NUMBER() OVER (ORDER BY reported_at, device) AS n
                FROM disk_reports
            ) AS r WHERE r.device = disk_serials.device
        );
        UPDATE disk_reports SET verdict = 'duplicate-disk-serial: a serial of this'
            || ' report is also reported by another device; refused until the'
            || ' owner decides (fleetctl disks forget)'
        WHERE verdict LIKE 'duplicate-disk-serial:%also reported by%';
        """,
    ),
    # New migrations go here as (N, "..."), with a number reserved for
    # the subsystem, in ascending order: never edit or renumber one that
    # has shipped.
)
"""Schema migrations in order; C{PRAGMA user_version} records the last one."""


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
