"""
Re-anchoring the chain after a break (issue 19 item 5).

An owner who has looked at a break (C{fleetctl journal verify}) and
decided to go on from it appends one C{journal.reanchored} entry that
names the break: its seq, the problem, the digest found there and the
digest expected, with the owner's reason. The entry is chained, by the
ordinary append path, onto the last entry I{as stored} (not onto the
head, which may be the broken part), and the head is rewritten to it, so
fleetd can record changes again [J1]. Nothing is deleted or rewritten:
the break stays where it is and L{fleetd.store.verify} reports it as
acknowledged for as long as the journal exists; a later break, or any
change to this one, is a new break.

Refused when the chain verifies (nothing to acknowledge), without a
reason, or when the last entry holds no digest to chain onto (then only
a restore from a backup helps).
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.logger import Logger

from fleetd.store.append import GENESIS, Appender, ChainKey, prepare
from fleetd.store.db import Database
from fleetd.store.entries import JournalEntry
from fleetd.store.fields import MAX_STRING
from fleetd.store.verify import REANCHORED, verifyChain

log = Logger()


class ReanchorRefused(ValueError):
    """The re-anchor was refused (one line); nothing was appended."""


@dataclass(frozen=True)
class Reanchored:
    """The re-anchor entry appended, and the break it acknowledges."""

    entry: JournalEntry
    breakSeq: int
    problem: str
    found: str | None
    expected: str | None


def checkReason(reason: object) -> str:
    """
    An owner's reason for a re-anchor: printable text, 1 to 512 characters.

    @raise ReanchorRefused: there is none, or it is not such text.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ReanchorRefused("a re-anchor needs a reason (--reason)")
    if len(reason) > MAX_STRING or not reason.isprintable():
        raise ReanchorRefused(
            f"the reason must be one line of at most {MAX_STRING} characters"
        )
    return reason.strip()


def reanchor(
    db: Database,
    chain: ChainKey,
    appender: Appender,
    *,
    at: float,
    actor: str,
    reason: str,
) -> Reanchored:
    """
    Verify the chain and, if it is broken, append the re-anchor entry, all
    in one write transaction (runs on the database thread).

    @raise ReanchorRefused: the chain is intact, the reason is missing, or
        the last entry cannot be chained onto.
    """
    reason = checkReason(reason)
    with db.transaction() as conn:
        found = verifyChain(conn, chain)
        if found.ok or found.seq is None or found.problem is None:
            raise ReanchorRefused(
                "the journal chain is intact: there is no break to re-anchor"
            )
        last = conn.execute(
            "SELECT seq, digest FROM journal ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        base = (0, GENESIS)
        if last is not None:
            digest = _digest(last[1])
            if digest is None:
                raise ReanchorRefused(
                    f"the last entry (seq {last[0]}) holds no digest to chain"
                    " onto; restore from a backup (docs/operations.md)"
                )
            base = (last[0], digest)
        pending = prepare(
            REANCHORED,
            actor=actor,
            fields={
                "reason": reason,
                "break_seq": found.seq,
                "problem": found.problem,
                "found": found.found,
                "expected": found.expected,
            },
        )
        (entry,) = appender.appendMany(db, [pending], at=at, savepoint=False, base=base)
    log.warn(
        "journal.reanchored {seq} acknowledges the break at {breakSeq}: {problem}",
        seq=entry.seq,
        breakSeq=found.seq,
        problem=found.problem,
        actor=actor,
    )
    return Reanchored(entry, found.seq, found.problem, found.found, found.expected)


def _digest(text: object) -> bytes | None:
    try:
        digest = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        return None
    return digest if len(digest) == 32 else None
