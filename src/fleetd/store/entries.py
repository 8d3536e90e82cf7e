"""
Journal entries and the public way to read them.

What an entry is (L{JournalEntry}, and L{Entry} for one still to append),
the canonical JSON the chain is computed over, the row decoding, and the
queries every other package uses instead of SQL of its own: the C{journal}
table's columns are this module's business (and the chain's, see
L{fleetd.store.append} and L{fleetd.store.verify}).

Every query takes the L{Database} and runs on the database thread.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from fleetd.store.db import Database, StoreError
from fleetd.store.fields import FieldValue

MAX_QUERY = 10_000

SELECT_ENTRIES = (
    "SELECT seq, at, event, actor, device, run, fields, digest FROM journal"
)
"""The columns L{entryFromRow} takes, in order (for the chain's own reads)."""


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


@dataclass(frozen=True)
class Entry:
    """
    A journal entry to append together with a change (see
    L{fleetd.store.journal.Recorder.add}).
    """

    event: str
    actor: str
    device: str | None = None
    run: str | None = None
    fields: Mapping[str, FieldValue] | None = None


class JournalRefused(ValueError):
    """The journal will not take an entry as given (a bad name, a field that
    may be a secret): the change it belongs to does not happen."""


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def canonicalJSON(value: object) -> str:
    """The one JSON encoding the chain is computed over."""
    return _CANONICAL.encode(value)


def entryFromRow(row: Sequence[Any]) -> JournalEntry:
    """
    Rebuild an entry from a row of L{SELECT_ENTRIES}, checking every
    column's type.

    @raise ValueError: the row is malformed (or C{TypeError}).
    """
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


def _checkLimit(limit: int) -> None:
    if not 0 < limit <= MAX_QUERY:
        raise ValueError(f"journal query limit must be 1 to {MAX_QUERY}")


def query(
    db: Database,
    *,
    device: str | None = None,
    run: str | None = None,
    since_seq: int = 0,
    before_seq: int | None = None,
    newest_first: bool = False,
    limit: int = 1000,
) -> list[JournalEntry]:
    """
    Up to C{limit} entries after C{since_seq} (and before C{before_seq}),
    ascending: the first C{limit} of them; with C{newest_first}, the last
    C{limit} of them, descending.
    """
    _checkLimit(limit)
    clauses = ["seq > ?"]
    parameters: list[object] = [since_seq]
    if before_seq is not None:
        clauses.append("seq < ?")
        parameters.append(before_seq)
    if device is not None:
        clauses.append("device = ?")
        parameters.append(device)
    if run is not None:
        clauses.append("run = ?")
        parameters.append(run)
    where = " AND ".join(clauses)  # constant fragments only
    order = "DESC" if newest_first else "ASC"
    sql = f"{SELECT_ENTRIES} WHERE {where} ORDER BY seq {order} LIMIT ?"
    rows = db.execute(sql, (*parameters, limit)).fetchall()
    entries = []
    for row in rows:
        try:
            entries.append(entryFromRow(row))
        except (TypeError, ValueError) as e:
            raise StoreError(f"journal entry {row[0]} is malformed") from e
    return entries


def latest(db: Database, *, device: str, limit: int) -> list[JournalEntry]:
    """The last C{limit} entries about C{device}, oldest first."""
    _checkLimit(limit)
    rows = db.execute(
        f"{SELECT_ENTRIES} WHERE device = ? ORDER BY seq DESC LIMIT ?",
        (device, limit),
    ).fetchall()
    try:
        return [entryFromRow(row) for row in reversed(rows)]
    except (TypeError, ValueError) as e:
        raise StoreError("a journal entry is malformed") from e


def lastAmong(
    db: Database, *, devices: Sequence[str], events: Collection[str]
) -> dict[str, JournalEntry]:
    """
    Each of C{devices}' last entry whose event is one of C{events} (a
    device without one is left out): one walk back through the device's
    own entries each (index C{journal_by_device}).
    """
    if not events:
        return {}
    marks = ", ".join("?" * len(events))  # placeholders only
    sql = (
        f"{SELECT_ENTRIES} WHERE device = ? AND event IN ({marks})"
        " ORDER BY seq DESC LIMIT 1"
    )
    found = {}
    for device in dict.fromkeys(devices):
        row = db.execute(sql, (device, *events)).fetchone()
        if row is None:
            continue
        try:
            found[device] = entryFromRow(row)
        except (TypeError, ValueError) as e:
            raise StoreError(f"journal entry {row[0]} is malformed") from e
    return found


def countAfter(db: Database, seq: int) -> int:
    """How many entries come after C{seq}."""
    (count,) = db.execute(
        "SELECT count(*) FROM journal WHERE seq > ?", (seq,)
    ).fetchone()
    return int(count)


def hasEvent(db: Database, *, run: str, event: str) -> bool:
    """Whether C{run} has an entry C{event}."""
    row = db.execute(
        "SELECT 1 FROM journal WHERE run = ? AND event = ? LIMIT 1", (run, event)
    ).fetchone()
    return row is not None


def lastEvent(db: Database, *, run: str, events: Collection[str]) -> str | None:
    """The event of C{run}'s last entry among C{events}, if any."""
    if not events:
        return None
    marks = ", ".join("?" * len(events))  # placeholders only
    row = db.execute(
        f"SELECT event FROM journal WHERE run = ? AND event IN ({marks})"  # noqa: S608
        " ORDER BY seq DESC LIMIT 1",
        (run, *events),
    ).fetchone()
    return None if row is None else str(row[0])


def fieldsOf(db: Database, *, run: str, event: str) -> list[dict[str, Any]]:
    """
    The fields of each of C{run}'s C{event} entries, in no set order;
    entries whose fields are not a JSON object are left out.
    """
    found = []
    for (text,) in db.execute(
        "SELECT fields FROM journal WHERE run = ? AND event = ?", (run, event)
    ):
        try:
            fields = json.loads(text)
        except ValueError:
            continue
        if isinstance(fields, dict):
            found.append(fields)
    return found
