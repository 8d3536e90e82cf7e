"""
Appending to the hash chain (design.md, State).

Entry C{n} carries C{digest_n = HMAC-SHA256(key, digest_(n-1) ||
canonical_json(seq, at, event, actor, device, run, fields))}, with 32 zero
bytes before the first entry; seqs run 1, 2, 3, ... without gaps.  The
single C{journal_head} row holds the last C{(seq, digest)}, authenticated by
C{HMAC(key, "head" || seq || digest)}, and changes in the same transaction
as the entry.  L{Appender} refuses to extend a journal whose head is not
authentic or does not match its last entry; L{fleetd.store.verify} checks
the whole chain with the same L{ChainKey}.
"""

from __future__ import annotations

import hmac
import math
import re
import sqlite3
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii
from types import MappingProxyType
from typing import NamedTuple

from fleetd.keyed import KeyedHMAC
from fleetd.store.db import Database, StoreError
from fleetd.store.entries import JournalEntry, JournalRefused, canonicalJSON
from fleetd.store.fields import MAX_NAME, FieldValue, checkFields, checkName

GENESIS = bytes(32)
"""The digest the first entry chains onto."""

SELECT_HEAD = "SELECT seq, digest, mac FROM journal_head WHERE id = 1"

_EVENT = re.compile(r"[a-z0-9][a-z0-9_.-]{0,127}")
_ACTOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_INSERT = (
    "INSERT INTO journal (seq, at, event, actor, device, run, fields, digest)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_LAST = "SELECT seq, digest FROM journal ORDER BY seq DESC LIMIT 1"
_UPSERT_HEAD = (
    "INSERT INTO journal_head (id, seq, digest, mac) VALUES (1, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET"
    " seq = excluded.seq, digest = excluded.digest, mac = excluded.mac"
)
_string = encode_basestring_ascii  # a str as JSON writes it with ensure_ascii


def _optional(value: str | None) -> str:
    return "null" if value is None else _string(value)


_WORDS: dict[object, str] = {True: "true", False: "false", None: "null"}


def fieldsJSON(fields: dict[str, FieldValue]) -> str:
    """
    L{canonicalJSON} of checked C{fields}, written out directly when every
    value is a string, a bool or None (a delivery's entry is): the same
    text, keys sorted; any other value goes through the encoder.
    """
    parts = []
    for name in sorted(fields):
        value = fields[name]
        if value.__class__ is str:
            parts.append(f"{_string(name)}:{_string(value)}")
        elif value is True or value is False or value is None:
            parts.append(f"{_string(name)}:{_WORDS[value]}")
        else:
            return canonicalJSON(fields)
    return "{" + ",".join(parts) + "}"


class PreparedEntry(NamedTuple):
    """
    An entry checked by L{prepare}, waiting for its seq. Immutable; a named
    tuple because one is made per journal entry (one per delivery).
    """

    event: str
    actor: str
    device: str | None
    run: str | None
    fields: dict[str, FieldValue]
    fieldsJSON: str
    at: float | None = None  # its own time, else the append's


def prepare(
    event: str,
    *,
    actor: str,
    device: str | None = None,
    run: str | None = None,
    fields: Mapping[str, FieldValue] | None = None,
    at: float | None = None,
) -> PreparedEntry:
    """
    Check an entry before it is appended. C{at}: the entry's own time,
    when it is not the time of the append.

    @raise JournalRefused: a name is malformed or a field may be a secret.
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
    return PreparedEntry(event, actor, device, run, checked, fieldsJSON(checked), at)


class ChainKey:
    """The chain's MACs under one key: entry digests and the head's MAC."""

    def __init__(self, key: bytes) -> None:
        self._mac = KeyedHMAC(key)

    def digest(self, previous: bytes, entry: JournalEntry) -> bytes:
        """Chain C{entry} (its C{digest} aside) onto the C{previous} digest."""
        body = entry.toJSON()
        del body["digest"]
        message = previous + canonicalJSON(body).encode("ascii")
        return self._mac.digest(message)

    def digestOf(
        self, previous: bytes, seq: int, at: float, pending: PreparedEntry
    ) -> bytes:
        """
        L{digest} of the entry C{pending} becomes at C{seq}, built from its
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

    def headMac(self, seq: int, digest: bytes) -> str:
        """The MAC of the head row C{(seq, digest)}, in hex."""
        message = b"head" + str(seq).encode("ascii") + digest
        return self._mac.digest(message).hex()


class Appender:
    """Appends prepared entries to the chain; runs on the database thread."""

    def __init__(self, chain: ChainKey) -> None:
        self._chain = chain
        # (database, its generation, seq, digest) of the head last written.
        self._written: tuple[Database, int, int, bytes] | None = None

    def appendMany(
        self,
        db: Database,
        entries: Sequence[PreparedEntry],
        *,
        at: float,
        savepoint: bool = True,
        base: tuple[int, bytes] | None = None,
    ) -> list[JournalEntry]:
        """
        See L{fleetd.store.journal.Journal.appendMany}.

        @param base: the (seq, digest) to chain onto instead of the
            authenticated head: only a re-anchor (L{fleetd.store.anchor})
            gives one, after verifying the chain in the same transaction.
        """
        at = float(at)
        if not entries:
            return []
        if not savepoint and db.connection.in_transaction:
            return self._appendIn(db, entries, at, base)
        with db.transaction():
            return self._appendIn(db, entries, at, base)

    def _appendIn(
        self,
        db: Database,
        entries: Sequence[PreparedEntry],
        at: float,
        base: tuple[int, bytes] | None,
    ) -> list[JournalEntry]:
        """
        L{appendMany} inside the caller's open transaction, without a
        savepoint of its own: an exception must roll the caller back.
        """
        if not math.isfinite(at):
            raise ValueError("journal time is not finite")
        conn = db.connection
        seq, previous = self._head(db) if base is None else base
        appended: list[JournalEntry] = []
        rows = []
        for pending in entries:
            seq += 1
            entryAt = at if pending.at is None else pending.at
            previous = self._chain.digestOf(previous, seq, entryAt, pending)
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
        conn.execute(
            _UPSERT_HEAD, (seq, previous.hex(), self._chain.headMac(seq, previous))
        )
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

    def _currentHead(self, conn: sqlite3.Connection) -> tuple[int, bytes]:
        """Return the authenticated (seq, digest) to chain the next entry to."""
        head = conn.execute(SELECT_HEAD).fetchone()
        last = conn.execute(_SELECT_LAST).fetchone()
        if head is None and last is None:
            return 0, GENESIS
        advice = "run 'fleetctl journal verify'"
        if head is None:
            raise StoreError(f"journal head is missing; {advice}")
        seq, digestHex, mac = head
        try:
            digest = bytes.fromhex(digestHex)
            authentic = hmac.compare_digest(self._chain.headMac(seq, digest), mac)
        except (TypeError, ValueError):
            authentic = False
        if not authentic:
            raise StoreError(f"journal head is not authentic; {advice}")
        if last is None or (last[0], last[1]) != (seq, digestHex):
            raise StoreError(f"journal head does not match the last entry; {advice}")
        return seq, digest
