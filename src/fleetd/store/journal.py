"""
The journal: append-only, durable, hash-chained (design.md, State).

L{Journal} is its database-thread face: it holds the chain key and binds
the parts, each in a module of its own: the entries and the public query
API (L{fleetd.store.entries}), the chain append (L{fleetd.store.append}),
and verification (L{fleetd.store.verify}). L{Recorder} and L{AsyncJournal}
are the reactor side: entries appended in a change's own transaction [J1],
and work handed to the database thread through a runner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.store.anchor import Reanchored
from fleetd.store.anchor import reanchor as reanchorChain
from fleetd.store.append import Appender, ChainKey, PreparedEntry
from fleetd.store.append import prepare as prepareEntry
from fleetd.store.db import Database
from fleetd.store.entries import Entry, JournalEntry, lastAmong
from fleetd.store.entries import latest as latestEntries
from fleetd.store.entries import query as queryEntries
from fleetd.store.fields import FieldValue
from fleetd.store.runner import IRunner
from fleetd.store.verify import JournalVerification, verifyChain

_T = TypeVar("_T")


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
        self._chain = ChainKey(key)
        self._appender = Appender(self._chain)

    def _digest(self, previous: bytes, entry: JournalEntry) -> bytes:
        """Chain C{entry} (its C{digest} aside) onto the C{previous} digest."""
        return self._chain.digest(previous, entry)

    def _digestOf(
        self, previous: bytes, seq: int, at: float, pending: PreparedEntry
    ) -> bytes:
        """The append path's L{_digest}, built from C{pending}'s parts."""
        return self._chain.digestOf(previous, seq, at, pending)

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
    ) -> PreparedEntry:
        """
        Check an entry before it is appended (see L{appendMany}). C{at}:
        the entry's own time, when it is not the time of the append.

        @raise ValueError: a name is malformed or a field may be a secret.
        """
        return prepareEntry(
            event, actor=actor, device=device, run=run, fields=fields, at=at
        )

    def appendMany(
        self,
        db: Database,
        entries: Sequence[PreparedEntry],
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
        return self._appender.appendMany(db, entries, at=at, savepoint=savepoint)

    def query(
        self,
        db: Database,
        *,
        device: str | None = None,
        run: str | None = None,
        since_seq: int = 0,
        before_seq: int | None = None,
        newest_first: bool = False,
        limit: int = 1000,
    ) -> list[JournalEntry]:
        """See L{fleetd.store.entries.query}."""
        return queryEntries(
            db,
            device=device,
            run=run,
            since_seq=since_seq,
            before_seq=before_seq,
            newest_first=newest_first,
            limit=limit,
        )

    def latest(self, db: Database, *, device: str, limit: int) -> list[JournalEntry]:
        """See L{fleetd.store.entries.latest}."""
        return latestEntries(db, device=device, limit=limit)

    def verify(self, db: Database) -> JournalVerification:
        """Check the whole chain and the head, in one read snapshot."""
        with db.transaction(write=False) as conn:
            result = verifyChain(conn, self._chain)
        if result.ok:
            self.log.info("journal.verified {entries}", entries=result.entries)
        else:
            self.log.error(
                "journal.verify_failed {problem}",
                problem=result.problem,
                seq=result.seq,
            )
        return result

    def reanchor(
        self, db: Database, *, at: float, actor: str, reason: str
    ) -> Reanchored:
        """
        Acknowledge the chain's first break with a re-anchor entry (see
        L{fleetd.store.anchor}).

        @raise ReanchorRefused: the chain is intact, or no reason was given.
        """
        return reanchorChain(
            db, self._chain, self._appender, at=at, actor=actor, reason=reason
        )


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
        self._pending: list[PreparedEntry] = []
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

    def lastAmong(
        self, *, devices: Sequence[str], events: Sequence[str]
    ) -> Deferred[dict[str, JournalEntry]]:
        """See L{fleetd.store.entries.lastAmong}: one trip to the database."""
        wanted, among = list(devices), tuple(events)
        return self._runner.run(lambda db: lastAmong(db, devices=wanted, events=among))

    def query(
        self,
        *,
        device: str | None = None,
        run: str | None = None,
        since_seq: int = 0,
        before_seq: int | None = None,
        newest_first: bool = False,
        limit: int = 1000,
    ) -> Deferred[list[JournalEntry]]:
        """See L{Journal.query}."""
        return self._runner.run(
            lambda db: self._journal.query(
                db,
                device=device,
                run=run,
                since_seq=since_seq,
                before_seq=before_seq,
                newest_first=newest_first,
                limit=limit,
            )
        )

    def verify(self) -> Deferred[JournalVerification]:
        """See L{Journal.verify}."""
        return self._runner.run(self._journal.verify)

    def reanchor(self, *, actor: str, reason: str) -> Deferred[Reanchored]:
        """See L{Journal.reanchor}; stamped with the clock's current time."""
        at = self._clock.seconds()
        return self._runner.run(
            lambda db: self._journal.reanchor(db, at=at, actor=actor, reason=reason)
        )
