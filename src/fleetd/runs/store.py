"""
Persistent run records (schema migration 3 in fleetd.store.db).

A run row holds the keyed digest of its code, never the code, and survives
reboots; the rendered configuration and the served-config record live in
the vault (tmpfs) and do not.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fleetd.runs.issued import PREFIX_HEX, IssuedDigests
from fleetd.store.db import Database


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One provision run as stored (one per current run, kept: slots)."""

    id: str
    device: str
    digest: str
    created_at: float
    desired_action: str | None = None
    superseded_by: str | None = None
    missing_noted: bool = False
    refetch_noted: bool = False

    def toJSON(self) -> dict[str, Any]:
        return {
            "run": self.id,
            "device": self.device,
            "created_at": self.created_at,
            "desired_action": self.desired_action,
            "superseded_by": self.superseded_by,
        }


def _record(row: sqlite3.Row | tuple[Any, ...]) -> RunRecord:
    return RunRecord(
        id=row[0],
        device=row[1],
        digest=row[2],
        created_at=row[3],
        desired_action=row[4],
        superseded_by=row[5],
        missing_noted=bool(row[6]),
        refetch_noted=bool(row[7]),
    )


_SELECT = (
    "SELECT id, device, digest, created_at, desired_action, superseded_by,"
    " missing_noted, refetch_noted FROM runs"
)
_NOTE = {
    "missing_noted": "UPDATE runs SET missing_noted = 1 WHERE id = ?",
    "refetch_noted": "UPDATE runs SET refetch_noted = 1 WHERE id = ?",
}


def insertRuns(db: Database, runs: list[RunRecord]) -> list[RunRecord]:
    """
    Store new runs in one transaction; each supersedes its device's earlier
    runs. Returns the ids of the superseded runs' records, updated.
    """
    superseded: list[RunRecord] = []
    with db.transaction() as conn:
        for run in runs:
            rows = conn.execute(
                _SELECT + " WHERE device = ? AND superseded_by IS NULL",
                (run.device,),
            ).fetchall()
            conn.execute(
                "UPDATE runs SET superseded_by = ? WHERE device = ? "
                "AND superseded_by IS NULL",
                (run.id, run.device),
            )
            superseded.extend(replace(_record(r), superseded_by=run.id) for r in rows)
            conn.execute(
                "INSERT INTO runs (id, device, digest, created_at, desired_action)"
                " VALUES (?, ?, ?, ?, ?)",
                (run.id, run.device, run.digest, run.created_at, run.desired_action),
            )
    return superseded


def endRuns(db: Database, device: str, by: str) -> list[RunRecord]:
    """
    Supersede C{device}'s current run without a successor (C{by} says
    why, e.g. its retirement); the records as updated.
    """
    with db.transaction() as conn:
        rows = conn.execute(
            _SELECT + " WHERE device = ? AND superseded_by IS NULL", (device,)
        ).fetchall()
        conn.execute(
            "UPDATE runs SET superseded_by = ? WHERE device = ?"
            " AND superseded_by IS NULL",
            (by, device),
        )
    return [replace(_record(r), superseded_by=by) for r in rows]


def loadRuns(db: Database) -> list[RunRecord]:
    """
    Every device's current run (none superseded), oldest first: superseded
    history stays in the database (see L{retiredRun}).
    """
    with db.transaction(write=False) as conn:
        # Row by row: at 50,000 runs a list of every row first would be one
        # more transient copy of the table in the heap.
        rows = conn.execute(
            _SELECT + " WHERE superseded_by IS NULL ORDER BY created_at, id"
        )
        return [_record(r) for r in rows]


def issuedDigests(db: Database) -> IssuedDigests:
    """The digest of every run in the database, superseded or not."""
    with db.transaction(write=False) as conn:
        prefixes = conn.execute("SELECT substr(digest, 1, ?) FROM runs", (PREFIX_HEX,))
        return IssuedDigests(row[0] for row in prefixes)


def retiredRun(db: Database, digest: str) -> RunRecord | None:
    """The superseded run whose code has C{digest}, if any."""
    row = db.execute(
        _SELECT + " WHERE digest = ? AND superseded_by IS NOT NULL", (digest,)
    ).fetchone()
    return None if row is None else _record(row)


def latestRun(db: Database, device: str) -> RunRecord | None:
    """C{device}'s newest run, superseded or not."""
    row = db.execute(
        _SELECT + " WHERE device = ? ORDER BY created_at DESC, id DESC LIMIT 1",
        (device,),
    ).fetchone()
    return None if row is None else _record(row)


def latestRuns(db: Database, devices: Sequence[str]) -> dict[str, RunRecord]:
    """L{latestRun} of each of C{devices} that has a run, in bulk."""
    found: dict[str, RunRecord] = {}
    for i in range(0, len(devices), _CHUNK):
        chunk = devices[i : i + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = db.execute(
            f"{_SELECT} WHERE device IN ({marks}) ORDER BY created_at, id",
            tuple(chunk),
        )
        found.update((row[1], _record(row)) for row in rows)  # the newest last
    return found


def noteRun(db: Database, run: str, note: str) -> None:
    """Set one of the 'journaled the first such request' flags of C{run}."""
    if note not in _NOTE:
        raise ValueError(f"unknown note {note!r}")
    db.execute(_NOTE[note], (run,))


def isSuperseded(db: Database, run: str) -> bool:
    """Whether a newer run of C{run}'s device committed (maybe in this batch)."""
    row = db.execute("SELECT superseded_by FROM runs WHERE id = ?", (run,)).fetchone()
    return row is not None and row[0] is not None


_CHUNK = 500  # host parameters per IN (...) list, well under SQLite's limit


def supersededAmong(db: Database, runs: Sequence[str]) -> set[str]:
    """Which of C{runs} a newer run superseded (L{isSuperseded}, in bulk)."""
    found: set[str] = set()
    for i in range(0, len(runs), _CHUNK):
        chunk = runs[i : i + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        found.update(
            row[0]
            for row in db.execute(
                f"SELECT id FROM runs WHERE superseded_by IS NOT NULL"  # noqa: S608
                f" AND id IN ({marks})",
                tuple(chunk),
            )
        )
    return found
