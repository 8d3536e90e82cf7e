"""
Verifying the whole hash chain and its head (design.md, State).

L{verifyChain} detects an edited entry (any column), a deleted entry
(first, middle or last: the head catches a truncated tail), an inserted or
reordered entry, and a forged or missing head.

A break an owner acknowledged (C{fleetctl journal reanchor}, see
L{fleetd.store.anchor}) stays in the chain: the re-anchor entry names the
break's seq and the digests found and expected there, and is chained from
the entry stored before it. The walk checks every entry from the first;
at a break it looks for a re-anchor after it that names exactly that
break (same seq, same digests), and goes on from that re-anchor. So the
entries before a break are still checked, a changed or new break is not
acknowledged, and every acknowledged break is reported. The entries from
an acknowledged break up to its re-anchor are vouched for by nothing.

What this does not defend against:
  - anyone holding the key (the key file, or fleetd's memory): they can
    rewrite the chain and the head consistently;
  - replay of an older copy of the whole database file, or deletion of
    every entry together with the head, which looks like a fresh install:
    only an off-host copy (the NetBox mirror) shows that;
  - reading: entries are authenticated, not encrypted, hence the secret
    guard in L{fleetd.store.append.prepare}, which refuses secret-looking
    field names, long strings and PEM blocks.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from fleetd.store.append import GENESIS, SELECT_HEAD, ChainKey
from fleetd.store.entries import SELECT_ENTRIES, entryFromRow

REANCHORED = "journal.reanchored"
"""The event of a re-anchor entry (L{fleetd.store.anchor})."""

DIGEST_CHARS = 64


@dataclass(frozen=True)
class Acknowledged:
    """A break an owner acknowledged: the re-anchor at C{seq} names C{breakSeq}."""

    seq: int
    breakSeq: int


@dataclass(frozen=True)
class JournalVerification:
    """
    The outcome of L{verifyChain}.

    @ivar entries: the seq up to which the walk found the chain intact.
    @ivar problem: what is wrong, if anything.
    @ivar seq: the seq of the first bad or missing entry (for a bad head:
        the entry the head should name).
    @ivar found: the digest found at the break (L{None}: nothing found).
    @ivar expected: the digest the chain expects there (L{None}: unknown).
    @ivar acknowledged: the re-anchors met, oldest first.
    """

    ok: bool
    entries: int
    problem: str | None = None
    seq: int | None = None
    found: str | None = None
    expected: str | None = None
    acknowledged: tuple[Acknowledged, ...] = ()

    @property
    def anchoredAt(self) -> int | None:
        """The seq of the last re-anchor, if any."""
        return self.acknowledged[-1].seq if self.acknowledged else None

    def toJSON(self) -> dict[str, Any]:
        """The admin API's (and C{fleetctl journal verify --json}'s) form."""
        return {
            "ok": self.ok,
            "entries": self.entries,
            "problem": self.problem,
            "seq": self.seq,
            "found": self.found,
            "expected": self.expected,
            "anchored_at": self.anchoredAt,
            "acknowledged": [
                {"seq": a.seq, "break_seq": a.breakSeq} for a in self.acknowledged
            ],
        }


@dataclass(frozen=True)
class _Break:
    entries: int
    problem: str
    seq: int
    found: str | None = None
    expected: str | None = None


def verifyChain(conn: sqlite3.Connection, chain: ChainKey) -> JournalVerification:
    """Check the whole chain and the head (the caller holds a read snapshot)."""
    acknowledged: list[Acknowledged] = []
    start, previous = 1, GENESIS
    while True:
        outcome = _walk(conn, chain, start, previous, acknowledged)
        if not isinstance(outcome, _Break):
            count, last = outcome
            return _verifyHead(conn, chain, count, last, tuple(acknowledged))
        while True:
            anchor = _anchorFor(conn, outcome)
            if anchor is None:
                return _verdict(outcome, acknowledged)
            before = GENESIS if anchor == 1 else _storedDigest(conn, anchor - 1)
            if before is not None:
                break
            outcome = _Break(
                outcome.entries,
                f"re-anchor {anchor} cannot be checked: entry {anchor - 1} is gone",
                anchor,
                _text(_column(conn, anchor)),
            )
        start, previous = anchor, before


def _walk(
    conn: sqlite3.Connection,
    chain: ChainKey,
    start: int,
    previous: bytes,
    acknowledged: list[Acknowledged],
) -> tuple[int, bytes] | _Break:
    """Check entries from C{start} on; the last (seq, digest), or the break."""
    count = start - 1
    for row in conn.execute(f"{SELECT_ENTRIES} WHERE seq >= ? ORDER BY seq", (start,)):
        expected = count + 1
        seq, found = row[0], _text(row[7])
        if seq != expected:
            if isinstance(seq, int) and seq > expected:
                return _Break(count, f"entry {expected} is missing", expected, found)
            return _Break(count, f"entry {seq} is out of sequence", expected, found)
        try:
            entry = entryFromRow(row)
        except (TypeError, ValueError):
            return _Break(count, f"entry {seq} is malformed", seq, found)
        digest = chain.digest(previous, entry)
        if not hmac.compare_digest(digest.hex(), entry.digest):
            problem = f"entry {seq} fails its digest (edited or moved)"
            return _Break(count, problem, seq, found, digest.hex())
        if entry.event == REANCHORED:
            breakSeq = entry.fields.get("break_seq")
            if type(breakSeq) is int:
                acknowledged.append(Acknowledged(seq, breakSeq))
        previous, count = digest, expected
    return count, previous


def _anchorFor(conn: sqlite3.Connection, found: _Break) -> int | None:
    """The seq of the first re-anchor after C{found} that names exactly it."""
    rows = conn.execute(
        "SELECT seq, fields FROM journal WHERE event = ? AND seq > ? ORDER BY seq",
        (REANCHORED, found.seq),
    )
    for seq, text in rows:
        try:
            fields = json.loads(text)
        except (TypeError, ValueError):
            continue
        if (
            isinstance(fields, dict)
            and type(seq) is int
            and fields.get("break_seq") == found.seq
            and fields.get("found") == found.found
            and fields.get("expected") == found.expected
        ):
            return seq
    return None


def _column(conn: sqlite3.Connection, seq: int) -> object:
    row = conn.execute("SELECT digest FROM journal WHERE seq = ?", (seq,)).fetchone()
    return None if row is None else row[0]


def _storedDigest(conn: sqlite3.Connection, seq: int) -> bytes | None:
    """The digest stored with entry C{seq}, if it is there and is one."""
    text = _column(conn, seq)
    try:
        digest = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        return None
    return digest if len(digest) == 32 else None


def _text(value: object) -> str | None:
    """A stored digest as an entry may quote it (bounded, printable)."""
    if not isinstance(value, str) or not value.isprintable():
        return None
    return value[:DIGEST_CHARS]


def _verifyHead(
    conn: sqlite3.Connection,
    chain: ChainKey,
    count: int,
    last: bytes,
    acknowledged: tuple[Acknowledged, ...],
) -> JournalVerification:
    head = conn.execute(SELECT_HEAD).fetchone()
    lastHex = None if count == 0 else last.hex()
    problem: _Break | None = None
    if head is None:
        if count == 0:
            return JournalVerification(ok=True, entries=0, acknowledged=acknowledged)
        problem = _Break(count, "journal head is missing", count, None, lastHex)
        return _verdict(problem, acknowledged)
    seq, digestHex, mac = head
    try:
        authentic = type(seq) is int and hmac.compare_digest(
            chain.headMac(seq, bytes.fromhex(digestHex)), mac
        )
    except (TypeError, ValueError):
        authentic = False
    if not authentic:
        problem = _Break(
            count, "journal head is not authentic", count, _text(digestHex), lastHex
        )
    elif seq > count:
        problem = _Break(count, f"entries after {count} are missing", count + 1)
    elif seq < count:
        problem = _Break(
            count,
            f"entries after {seq} are not in the head",
            seq + 1,
            _text(_column(conn, seq + 1)),
        )
    elif not hmac.compare_digest(digestHex, last.hex()):
        problem = _Break(
            count,
            f"journal head does not match entry {count}",
            count,
            _text(digestHex),
            lastHex,
        )
    if problem is not None:
        return _verdict(problem, acknowledged)
    return JournalVerification(ok=True, entries=count, acknowledged=acknowledged)


def _verdict(
    found: _Break, acknowledged: list[Acknowledged] | tuple[Acknowledged, ...]
) -> JournalVerification:
    return JournalVerification(
        ok=False,
        entries=found.entries,
        problem=found.problem,
        seq=found.seq,
        found=found.found,
        expected=found.expected,
        acknowledged=tuple(acknowledged),
    )
