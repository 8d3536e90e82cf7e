"""
Verifying the whole hash chain and its head (DESIGN.md section 4).

L{verifyChain} detects an edited entry (any column), a deleted entry
(first, middle or last: the head catches a truncated tail), an inserted or
reordered entry, and a forged or missing head.

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
import sqlite3
from dataclasses import dataclass

from fleetd.store.append import GENESIS, SELECT_HEAD, ChainKey
from fleetd.store.entries import SELECT_ENTRIES, entryFromRow


@dataclass(frozen=True)
class JournalVerification:
    """
    The outcome of L{verifyChain}.

    @ivar entries: how many entries, from the first, were found intact.
    @ivar problem: what is wrong, if anything.
    @ivar seq: the seq of the first bad or missing entry, if known.
    """

    ok: bool
    entries: int
    problem: str | None = None
    seq: int | None = None


def verifyChain(conn: sqlite3.Connection, chain: ChainKey) -> JournalVerification:
    """Check the whole chain and the head (the caller holds a read snapshot)."""
    previous, count = GENESIS, 0
    for row in conn.execute(f"{SELECT_ENTRIES} ORDER BY seq"):
        expected = count + 1
        seq = row[0]
        if seq != expected:
            if isinstance(seq, int) and seq > expected:
                return _bad(count, f"entry {expected} is missing", expected)
            return _bad(count, f"entry {seq} is out of sequence", expected)
        try:
            entry = entryFromRow(row)
        except (TypeError, ValueError):
            return _bad(count, f"entry {seq} is malformed", seq)
        digest = chain.digest(previous, entry)
        if not hmac.compare_digest(digest.hex(), entry.digest):
            return _bad(count, f"entry {seq} fails its digest (edited or moved)", seq)
        previous, count = digest, expected
    return _verifyHead(conn, chain, count, previous)


def _verifyHead(
    conn: sqlite3.Connection, chain: ChainKey, count: int, last: bytes
) -> JournalVerification:
    head = conn.execute(SELECT_HEAD).fetchone()
    if head is None:
        if count == 0:
            return JournalVerification(ok=True, entries=0)
        return _bad(count, "journal head is missing", None)
    seq, digestHex, mac = head
    try:
        authentic = type(seq) is int and hmac.compare_digest(
            chain.headMac(seq, bytes.fromhex(digestHex)), mac
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
