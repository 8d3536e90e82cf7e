"""
The append-only, durable, hash-chained journal (DESIGN.md section 4).

Entry C{n} carries C{digest_n = HMAC-SHA256(key, digest_(n-1) ||
canonical_json(seq, at, event, actor, device, run, fields))}, with 32 zero
bytes before the first entry; seqs run 1, 2, 3, ... without gaps.  The
single C{journal_head} row holds the last C{(seq, digest)}, authenticated by
C{HMAC(key, "head" || seq || digest)}, and changes in the same transaction
as the entry.  L{Journal.verify} therefore detects an edited entry (any
column), a deleted entry (first, middle or last: the head catches a
truncated tail), an inserted or reordered entry, and a forged or missing
head.  L{Journal.append} refuses to extend a journal whose head is not
authentic or does not match its last entry.

What this does not defend against:
  - anyone holding the key (the key file, or fleetd's memory): they can
    rewrite the chain and the head consistently;
  - replay of an older copy of the whole database file, or deletion of
    every entry together with the head, which looks like a fresh install:
    only an off-host copy (the NetBox mirror) shows that;
  - reading: entries are authenticated, not encrypted, hence the secret
    guard in L{Journal.append}, which refuses secret-looking field names,
    long strings and PEM blocks.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import math
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from types import MappingProxyType
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.keyed import KeyedHMAC
from fleetd.store.db import Database, StoreError
from fleetd.store.fields import (
    MAX_NAME,
    FieldValue,
    checkFields,
    checkName,
)
from fleetd.store.runner import IRunner

MAX_QUERY = 10_000

_T = TypeVar("_T")

_EVENT = re.compile(r"[a-z0-9][a-z0-9_.-]{0,127}")
_ACTOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_GENESIS = bytes(32)
_SELECT = "SELECT seq, at, event, actor, device, run, fields, digest FROM journal"
_INSERT = (
    "INSERT INTO journal (seq, at, event, actor, device, run, fields, digest)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_HEAD = "SELECT seq, digest, mac FROM journal_head WHERE id = 1"
_SELECT_LAST = "SELECT seq, digest FROM journal ORDER BY seq DESC LIMIT 1"
_string = encode_basestring_ascii  # a str as JSON writes it with ensure_ascii


def _optional(value: str | None) -> str:
    return "null" if value is None else _string(value)


_UPSERT_HEAD = (
    "INSERT INTO journal_head (id, seq, digest, mac) VALUES (1, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET"
    " seq = excluded.seq, digest = excluded.digest, mac = excluded.mac"
)


@dataclass(frozen=True)
class JournalEntry:
    """One journal entry, as appended or read back."""

    seq: int
    at: float
    event: str
    actor: str
    device: str | None
    run: str | None
    fields: Mapping[str, FieldValue]
    digest: str

    def toJSON(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (for C{fleetctl journal})."""
        result = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        result["fields"] = dict(self.fields)
        return result


class JournalRefused(ValueError):
    """The journal will not take an entry as given (a bad name, a field that
    may be a secret): the change it belongs to does not happen."""


@dataclass(frozen=True)
class _Pending:
    """An entry checked by L{Journal.prepare}, waiting for its seq."""

    event: str
    actor: str
    device: str | None
    run: str | None
    fields: dict[str, FieldValue]
    fieldsJSON: str
    at: float | None = None  # its own time, else the append's


@dataclass(frozen=True)
class JournalVerification:
    """
    The outcome of L{Journal.verify}.

    @ivar entries: how many entries, from the first, were found intact.
    @ivar problem: what is wrong, if anything.
    @ivar seq: the seq of the first bad or missing entry, if known.
    """

    ok: bool
    entries: int
    problem: str | None = None
    seq: int | None = None


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def canonicalJSON(value: object) -> str:
    """The one JSON encoding the chain is computed over."""
    return _CANONICAL.encode(value)


def _entryFromRow(row: Sequence[Any]) -> JournalEntry:
    """Rebuild an entry from a row, checking every column's type."""
    seq, at, event, actor, device, run, fieldsText, digest = row
    fields = json.loads(fieldsText)
    if not (
        type(seq) is int
        and type(at) is float
        and isinstance(event, str)
        and isinstance(actor, str)
        and (device is None or isinstance(device, str))
        and (run is None or isinstance(run, str))
        and isinstance(fields, dict)
        and fieldsText == canonicalJSON(fields)
        and isinstance(digest, str)
        and len(bytes.fromhex(digest)) == 32
    ):
        raise ValueError("malformed journal row")
    return JournalEntry(
        seq, at, event, actor, device, run, MappingProxyType(fields), digest
    )


class Journal:
    """
    The journal's rules; every method takes the L{Database} and runs on
    the database thread (see L{AsyncJournal} for the reactor side).
    """

    log = Logger()

    def __init__(self, key: bytes) -> None:
        """
        @param key: the chain key, e.g. C{deriveKey(master, JOURNAL_PURPOSE)}.
        """
        if len(key) < 32:
            raise ValueError("journal key must be at least 32 bytes")
        self._key = key
        self._mac = KeyedHMAC(key)
        # (database, its generation, seq, digest) of the head last written.
        self._written: tuple[Database, int, int, bytes] | None = None

    def _digest(self, previous: bytes, entry: JournalEntry) -> bytes:
        """Chain C{entry} (its C{digest} aside) onto the C{previous} digest."""
        body = entry.toJSON()
        del body["digest"]
        message = previous + canonicalJSON(body).encode("ascii")
        return self._mac.digest(message)

    def _headMac(self, seq: int, digest: bytes) -> str:
        message = b"head" + str(seq).encode("ascii") + digest
        return self._mac.digest(message).hex()

    def append(
        self,
        db: Database,
        event: str,
        *,
        at: float,
        actor: str,
        device: str | None = None,
        run: str | None = None,
        fields: Mapping[str, FieldValue] | None = None,
    ) -> JournalEntry:
        """
        Durably append one entry (one transaction with the head).

        @raise ValueError: a name is malformed or a field may be a secret.
        @raise StoreError: the journal head is missing, forged or stale.
        """
        pending = self.prepare(
            event, actor=actor, device=device, run=run, fields=fields
        )
        (entry,) = self.appendMany(db, [pending], at=at)
        return entry

    def prepare(
        self,
        event: str,
        *,
        actor: str,
        device: str | None = None,
        run: str | None = None,
        fields: Mapping[str, FieldValue] | None = None,
        at: float | None = None,
    ) -> _Pending:
        """
        Check an entry before it is appended (see L{appendMany}). C{at}:
        the entry's own time, when it is not the time of the append.

        @raise ValueError: a name is malformed or a field may be a secret.
        """
        if not isinstance(event, str) or _EVENT.fullmatch(event) is None:
            raise JournalRefused(f"bad journal event name {str(event)[:MAX_NAME]!r}")
        if not isinstance(actor, str) or _ACTOR.fullmatch(actor) is None:
            raise JournalRefused(f"bad journal actor {str(actor)[:MAX_NAME]!r}")
        try:
            checkName("device", device)
            checkName("run", run)
            checked = checkFields(fields)
        except JournalRefused:
            raise
        except ValueError as e:
            raise JournalRefused(str(e)) from e
        if at is not None:
            at = float(at)
            if not math.isfinite(at):
                raise JournalRefused("journal time is not finite")
        return _Pending(event, actor, device, run, checked, canonicalJSON(checked), at)

    def appendMany(
        self,
        db: Database,
        entries: Sequence[_Pending],
        *,
        at: float,
        savepoint: bool = True,
    ) -> list[JournalEntry]:
        """
        Durably append prepared entries, in order, in one transaction with
        the head: the head is read and written once, however many entries.

        @param savepoint: C{False} when the caller's open transaction
            already makes this all-or-nothing: an exception from here must
            then roll the caller's transaction (or savepoint) back, as
            L{AsyncJournal.change} does.
        @raise StoreError: the journal head is missing, forged or stale.
        """
        at = float(at)
        if not entries:
            return []
        if not savepoint and db.connection.in_transaction:
            return self._appendIn(db, entries, at)
        with db.transaction():
            return self._appendIn(db, entries, at)

    def _appendIn(
        self, db: Database, entries: Sequence[_Pending], at: float
    ) -> list[JournalEntry]:
        """
        L{appendMany} inside the caller's open transaction, without a
        savepoint of its own: an exception must roll the caller back.
        """
        if not math.isfinite(at):
            raise ValueError("journal time is not finite")
        conn = db.connection
        seq, previous = self._head(db)
        appended: list[JournalEntry] = []
        rows = []
        for pending in entries:
            seq += 1
            entryAt = at if pending.at is None else pending.at
            previous = self._digestOf(previous, seq, entryAt, pending)
            entry = JournalEntry(
                seq,
                entryAt,
                pending.event,
                pending.actor,
                pending.device,
                pending.run,
                MappingProxyType(pending.fields),
                previous.hex(),
            )
            appended.append(entry)
            rows.append(
                (
                    seq,
                    entryAt,
                    pending.event,
                    pending.actor,
                    pending.device,
                    pending.run,
                    pending.fieldsJSON,
                    entry.digest,
                )
            )
        conn.executemany(_INSERT, rows)
        conn.execute(_UPSERT_HEAD, (seq, previous.hex(), self._headMac(seq, previous)))
        self._written = (db, db.generation, seq, previous)
        return appended

    def _head(self, db: Database) -> tuple[int, bytes]:
        """
        The (seq, digest) to chain onto: as this journal last wrote it when
        that was in the same write transaction, with nothing rolled back
        since (so nobody else can have changed it, and the group commit's
        later changes need not read and authenticate it again); otherwise
        read and checked.
        """
        written = self._written
        if (
            written is not None
            and written[0] is db
            and written[1] == db.generation
            and db.connection.in_transaction
        ):
            return written[2], written[3]
        return self._currentHead(db.connection)

    def _digestOf(
        self, previous: bytes, seq: int, at: float, pending: _Pending
    ) -> bytes:
        """
        L{_digest} of the entry C{pending} becomes at C{seq}, built from its
        parts: the same canonical JSON (keys sorted), without the dict.
        C{at} is a finite float, which JSON writes as C{repr} does.
        """
        body = (
            f'{{"actor":{_string(pending.actor)},"at":{at!r},'
            f'"device":{_optional(pending.device)},"event":{_string(pending.event)},'
            f'"fields":{pending.fieldsJSON},"run":{_optional(pending.run)},'
            f'"seq":{seq}}}'
        )
        return self._mac.digest(previous + body.encode("ascii"))

    def _currentHead(self, conn: sqlite3.Connection) -> tuple[int, bytes]:
        """Return the authenticated (seq, digest) to chain the next entry to."""
        head = conn.execute(_SELECT_HEAD).fetchone()
        last = conn.execute(_SELECT_LAST).fetchone()
        if head is None and last is None:
            return 0, _GENESIS
        advice = "run 'fleetctl journal verify'"
        if head is None:
            raise StoreError(f"journal head is missing; {advice}")
        seq, digestHex, mac = head
        try:
            digest = bytes.fromhex(digestHex)
            authentic = hmac.compare_digest(self._headMac(seq, digest), mac)
        except (TypeError, ValueError):
            authentic = False
        if not authentic:
            raise StoreError(f"journal head is not authentic; {advice}")
        if last is None or (last[0], last[1]) != (seq, digestHex):
            raise StoreError(f"journal head does not match the last entry; {advice}")
        return seq, digest

    def query(
        self,
        db: Database,
        *,
        device: str | None = None,
        run: str | None = None,
        since_seq: int = 0,
        limit: int = 1000,
    ) -> list[JournalEntry]:
        """Return up to C{limit} entries after C{since_seq}, ascending."""
        if not 0 < limit <= MAX_QUERY:
            raise ValueError(f"journal query limit must be 1 to {MAX_QUERY}")
        clauses = ["seq > ?"]
        parameters: list[object] = [since_seq]
        if device is not None:
            clauses.append("device = ?")
            parameters.append(device)
        if run is not None:
            clauses.append("run = ?")
            parameters.append(run)
        where = " AND ".join(clauses)  # constant fragments only
        sql = f"{_SELECT} WHERE {where} ORDER BY seq LIMIT ?"
        rows = db.execute(sql, (*parameters, limit)).fetchall()
        entries = []
        for row in rows:
            try:
                entries.append(_entryFromRow(row))
            except (TypeError, ValueError) as e:
                raise StoreError(f"journal entry {row[0]} is malformed") from e
        return entries

    def latest(self, db: Database, *, device: str, limit: int) -> list[JournalEntry]:
        """The last C{limit} entries about C{device}, oldest first."""
        if not 0 < limit <= MAX_QUERY:
            raise ValueError(f"journal query limit must be 1 to {MAX_QUERY}")
        rows = db.execute(
            f"{_SELECT} WHERE device = ? ORDER BY seq DESC LIMIT ?", (device, limit)
        ).fetchall()
        try:
            return [_entryFromRow(row) for row in reversed(rows)]
        except (TypeError, ValueError) as e:
            raise StoreError("a journal entry is malformed") from e

    def verify(self, db: Database) -> JournalVerification:
        """Check the whole chain and the head, in one read snapshot."""
        with db.transaction(write=False) as conn:
            result = self._verify(conn)
        if result.ok:
            self.log.info("journal.verified {entries}", entries=result.entries)
        else:
            self.log.error(
                "journal.verify_failed {problem}",
                problem=result.problem,
                seq=result.seq,
            )
        return result

    def _verify(self, conn: sqlite3.Connection) -> JournalVerification:
        previous, count = _GENESIS, 0
        for row in conn.execute(f"{_SELECT} ORDER BY seq"):
            expected = count + 1
            seq = row[0]
            if seq != expected:
                if isinstance(seq, int) and seq > expected:
                    return _bad(count, f"entry {expected} is missing", expected)
                return _bad(count, f"entry {seq} is out of sequence", expected)
            try:
                entry = _entryFromRow(row)
            except (TypeError, ValueError):
                return _bad(count, f"entry {seq} is malformed", seq)
            digest = self._digest(previous, entry)
            if not hmac.compare_digest(digest.hex(), entry.digest):
                return _bad(
                    count, f"entry {seq} fails its digest (edited or moved)", seq
                )
            previous, count = digest, expected
        return self._verifyHead(conn, count, previous)

    def _verifyHead(
        self, conn: sqlite3.Connection, count: int, last: bytes
    ) -> JournalVerification:
        head = conn.execute(_SELECT_HEAD).fetchone()
        if head is None:
            if count == 0:
                return JournalVerification(ok=True, entries=0)
            return _bad(count, "journal head is missing", None)
        seq, digestHex, mac = head
        try:
            authentic = type(seq) is int and hmac.compare_digest(
                self._headMac(seq, bytes.fromhex(digestHex)), mac
            )
        except (TypeError, ValueError):
            authentic = False
        if not authentic:
            return _bad(count, "journal head is not authentic", None)
        if seq > count:
            return _bad(count, f"entries after {count} are missing", count + 1)
        if seq < count:
            return _bad(count, f"entries after {seq} are not in the head", seq + 1)
        if not hmac.compare_digest(digestHex, last.hex()):
            return _bad(count, f"journal head does not match entry {count}", count)
        return JournalVerification(ok=True, entries=count)


def _bad(entries: int, problem: str, seq: int | None) -> JournalVerification:
    return JournalVerification(ok=False, entries=entries, problem=problem, seq=seq)


@dataclass(frozen=True)
class Entry:
    """A journal entry to append together with a change (see L{Recorder.add})."""

    event: str
    actor: str
    device: str | None = None
    run: str | None = None
    fields: Mapping[str, FieldValue] | None = None


class Recorder:
    """
    Journal entries for one change, appended in the change's own
    transaction [J1]: handed to the function given to L{AsyncJournal.change}.
    Each entry is checked when it is recorded (a bad one raises at once);
    all of them are appended together, with one read and one write of the
    head, when the change's work is done (L{flush}).
    """

    def __init__(self, journal: Journal, db: Database, at: float) -> None:
        self._journal = journal
        self._db = db
        self._at = at
        self._pending: list[_Pending] = []
        self.entries: list[JournalEntry] = []

    def __call__(
        self,
        event: str,
        *,
        actor: str,
        device: str | None = None,
        run: str | None = None,
        fields: Mapping[str, FieldValue] | None = None,
        at: float | None = None,
    ) -> None:
        """
        Record one entry; raise (and so roll the change back) if refused.
        C{at}: the entry's own time (default: when the change was asked for).
        """
        self._pending.append(
            self._journal.prepare(
                event, actor=actor, device=device, run=run, fields=fields, at=at
            )
        )

    def add(self, entry: Entry) -> None:
        """Record a prepared L{Entry}."""
        self(
            entry.event,
            actor=entry.actor,
            device=entry.device,
            run=entry.run,
            fields=entry.fields,
        )

    def flush(self) -> list[JournalEntry]:
        """Append what was recorded (still inside the change's transaction)."""
        pending, self._pending = self._pending, []
        if not pending:
            return []
        # Inside the change's own transaction: its failure rolls all back.
        appended = self._journal.appendMany(
            self._db, pending, at=self._at, savepoint=False
        )
        self.entries.extend(appended)
        return appended


class AsyncJournal:
    """The journal for reactor-side callers: work goes through a runner."""

    def __init__(self, runner: IRunner, journal: Journal, clock: IReactorTime) -> None:
        self._runner = runner
        self._journal = journal
        self._clock = clock

    def append(
        self,
        event: str,
        *,
        actor: str,
        device: str | None = None,
        run: str | None = None,
        fields: Mapping[str, FieldValue] | None = None,
    ) -> Deferred[JournalEntry]:
        """Append an entry stamped with the clock's current time."""
        at = self._clock.seconds()
        snapshot = None if fields is None else dict(fields)
        return self._runner.run(
            lambda db: self._journal.append(
                db, event, at=at, actor=actor, device=device, run=run, fields=snapshot
            )
        )

    def change(self, work: Callable[[Database, Recorder], _T]) -> Deferred[_T]:
        """
        Run C{work(db, record)} in one transaction on the database thread:
        its writes and every entry it passes to C{record} commit together or
        not at all [J1]. The caller changes its in-memory state only once
        the returned Deferred fires with C{work}'s result.
        """
        at = self._clock.seconds()
        journal = self._journal

        def inTransaction(db: Database) -> _T:
            with db.transaction():
                record = Recorder(journal, db, at)
                result = work(db, record)
                record.flush()
                return result

        return self._runner.run(inTransaction)

    def latest(self, *, device: str, limit: int = 10) -> Deferred[list[JournalEntry]]:
        """The last C{limit} entries about C{device}, oldest first."""
        return self._runner.run(
            lambda db: self._journal.latest(db, device=device, limit=limit)
        )

    def query(
        self,
        *,
        device: str | None = None,
        run: str | None = None,
        since_seq: int = 0,
        limit: int = 1000,
    ) -> Deferred[list[JournalEntry]]:
        """See L{Journal.query}."""
        return self._runner.run(
            lambda db: self._journal.query(
                db, device=device, run=run, since_seq=since_seq, limit=limit
            )
        )

    def verify(self) -> Deferred[JournalVerification]:
        """See L{Journal.verify}."""
        return self._runner.run(self._journal.verify)
