"""
The rules of EK bindings [T1], over the database (no I/O of its own).

A binding ties a chassis serial to an EK digest. It is approved only on
live (not withdrawn) evidence of kind C{receiving-scan} or
C{supplier-record} naming both; other kinds are recorded but never
approve. Evidence I{conflicts} when one EK digest is claimed for two
serials or one serial for two EK digests (any kind counts: a console or
a node naming another serial is exactly the warning an owner needs).
Conflicts block approval, and suspend an approved binding until the
wrong evidence is withdrawn; a binding whose evidence was withdrawn is
suspended too.

Contract for attestation (plain functions, usable inside the caller's
transaction, reading only):

  - L{approvedSerialFor}C{(conn, ek)}: the chassis serial of the
    approved, non-conflicting binding for that EK digest, or L{None}.
  - L{bindingRefusal}C{(conn, ek)}: why not, as one line
    C{"ek-binding-not-approved: <what is missing, for a person>"}: the
    reason code, a colon and a space, then a sentence naming the serial
    or a short EK prefix and what an owner can do. Split on the first
    C{": "} to get the code (L{REFUSAL_CODE}).
  - L{serialsForEK}C{(conn, ek)}: the serials the EK's binding or
    evidence names, to say which device a refusal concerns (never trust).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from fleetd.trust.model import (
    INDEPENDENT,
    BindingView,
    EvidenceKind,
    EvidenceRecord,
    TrustError,
    validateEKDigest,
)

REFUSAL_CODE = "ek-binding-not-approved"

# Reason codes of a refused approval (fleetctl binding approve).
EVIDENCE_MISSING = "evidence-missing"
EVIDENCE_INSUFFICIENT = "evidence-insufficient"
CONFLICTING_EVIDENCE = "conflicting-evidence"
NOT_IN_INVENTORY = "serial-not-in-inventory"

_COLUMNS = (
    "id, serial, ek_sha256, kind, ref, recorded_at, recorded_by,"
    " withdrawn_at, withdrawn_by, withdrawn_reason"
)
_LIVE = "withdrawn_at IS NULL"
_INDEPENDENT = tuple(sorted(k.value for k in INDEPENDENT))


def short(digest: str) -> str:
    """An EK digest shortened for a sentence (the journal keeps it whole)."""
    return digest[:16] + "..."


def _record(row: Sequence[object]) -> EvidenceRecord:
    (id_, serial, ek, kind, ref, at, by, wAt, wBy, wReason) = row
    return EvidenceRecord(
        id=int(id_),  # type: ignore[call-overload]
        serial=str(serial),
        ek_sha256=str(ek),
        kind=EvidenceKind(str(kind)),
        ref=None if ref is None else str(ref),
        recorded_at=float(at),  # type: ignore[arg-type]
        recorded_by=str(by),
        withdrawn_at=None if wAt is None else float(wAt),  # type: ignore[arg-type]
        withdrawn_by=None if wBy is None else str(wBy),
        withdrawn_reason=None if wReason is None else str(wReason),
    )


def evidenceFor(
    conn: sqlite3.Connection,
    *,
    serial: str | None = None,
    ek: str | None = None,
    live: bool = True,
) -> list[EvidenceRecord]:
    """Evidence naming C{serial} (case-insensitively) and/or C{ek}, oldest first."""
    clauses, parameters = [], []
    if serial is not None:
        clauses.append("serial = ?")  # the column compares NOCASE
        parameters.append(serial)
    if ek is not None:
        clauses.append("ek_sha256 = ?")
        parameters.append(ek)
    if live:
        clauses.append(_LIVE)
    where = " AND ".join(clauses) or "1"  # constant fragments only
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM evidence WHERE {where} ORDER BY id",  # noqa: S608
        parameters,
    ).fetchall()
    return [_record(row) for row in rows]


def evidenceById(conn: sqlite3.Connection, id_: int) -> EvidenceRecord | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM evidence WHERE id = ?",  # noqa: S608
        (id_,),
    ).fetchone()
    return None if row is None else _record(row)


@dataclass(frozen=True)
class Conflict:
    """Live evidence that disagrees with the claim C{serial} <-> C{ek}."""

    serial: str
    ek: str
    otherEKs: tuple[str, ...]
    otherSerials: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.otherEKs or self.otherSerials)

    def describe(self) -> str:
        parts = []
        if self.otherEKs:
            shown = ", ".join(short(e) for e in self.otherEKs)
            parts.append(f"serial {self.serial} is also claimed for EK {shown}")
        if self.otherSerials:
            shown = ", ".join(self.otherSerials)
            parts.append(f"EK {short(self.ek)} is also claimed for serial(s) {shown}")
        return "; ".join(parts)


def conflictOf(conn: sqlite3.Connection, serial: str, ek: str) -> Conflict:
    """What live evidence says against C{serial} <-> C{ek} (maybe nothing)."""
    eks = conn.execute(
        f"SELECT DISTINCT ek_sha256 FROM evidence WHERE serial = ?"  # noqa: S608
        f" AND ek_sha256 != ? AND {_LIVE} ORDER BY ek_sha256",
        (serial, ek),
    ).fetchall()
    serials = conn.execute(
        f"SELECT DISTINCT serial FROM evidence WHERE ek_sha256 = ?"  # noqa: S608
        f" AND serial != ? AND {_LIVE} ORDER BY serial",
        (ek, serial),
    ).fetchall()
    return Conflict(serial, ek, tuple(e for (e,) in eks), tuple(s for (s,) in serials))


def _supporting(conn: sqlite3.Connection, serial: str, ek: str) -> int | None:
    """The oldest live independent evidence naming both, if any."""
    row = conn.execute(
        f"SELECT id FROM evidence WHERE serial = ? AND ek_sha256 = ?"  # noqa: S608
        f" AND kind IN (?, ?) AND {_LIVE} ORDER BY id LIMIT 1",
        (serial, ek, *_INDEPENDENT),
    ).fetchone()
    return None if row is None else int(row[0])


_BINDING = (
    "SELECT serial, ek_sha256, device, evidence, approved_at, approved_by"
    " FROM ek_bindings"
)


def _view(conn: sqlite3.Connection, row: Sequence[object]) -> BindingView:
    serial, ek, device, evidenceId, at, by = (str(v) for v in row)
    problem = None
    if _supporting(conn, serial, ek) is None:
        problem = (
            f"no live receiving-scan or supplier-record names serial {serial}"
            f" and EK {short(ek)} any more (withdrawn)"
        )
    else:
        conflict = conflictOf(conn, serial, ek)
        if conflict:
            problem = f"conflicting evidence: {conflict.describe()}"
    return BindingView(
        serial=serial,
        ek_sha256=ek,
        device=device,
        evidence=int(evidenceId),
        approved_at=float(at),
        approved_by=by,
        state="approved" if problem is None else "suspended",
        problem=problem,
    )


def bindings(conn: sqlite3.Connection) -> list[BindingView]:
    """Every approved binding with its state now, ordered by serial."""
    rows = conn.execute(f"{_BINDING} ORDER BY serial").fetchall()
    return [_view(conn, row) for row in rows]


def bindingForSerial(conn: sqlite3.Connection, serial: str) -> BindingView | None:
    row = conn.execute(f"{_BINDING} WHERE serial = ?", (serial,)).fetchone()
    return None if row is None else _view(conn, row)


def _bindingForEK(conn: sqlite3.Connection, ek: str) -> BindingView | None:
    row = conn.execute(f"{_BINDING} WHERE ek_sha256 = ?", (ek,)).fetchone()
    return None if row is None else _view(conn, row)


def _digest(ekSha256: str) -> str | None:
    try:
        return validateEKDigest(ekSha256)
    except TrustError:
        return None


def approvedSerialFor(db: sqlite3.Connection, ekSha256: str) -> str | None:
    """
    The chassis serial bound to EK digest C{ekSha256} by an approved
    binding that holds now (its evidence stands, nothing conflicts), or
    L{None}. Reads only; fine inside the caller's transaction.
    """
    ek = _digest(ekSha256)
    if ek is None:
        return None
    view = _bindingForEK(db, ek)
    if view is None or view.state != "approved":
        return None
    return view.serial


def serialsForEK(db: sqlite3.Connection, ekSha256: str) -> list[str]:
    """
    Every serial that C{ekSha256}'s binding (whatever its state) or its
    live evidence names, for naming the device a refusal concerns (issue
    27): never for trust. Reads only.
    """
    ek = _digest(ekSha256)
    if ek is None:
        return []
    serials = {c.serial for c in evidenceFor(db, ek=ek)}
    view = _bindingForEK(db, ek)
    if view is not None:
        serials.add(view.serial)
    return sorted(serials, key=str.lower)


def bindingRefusal(db: sqlite3.Connection, ekSha256: str) -> str:
    """
    Why C{ekSha256} has no usable binding: C{"ek-binding-not-approved:
    <sentence>"} (see the module docstring).
    """
    ek = _digest(ekSha256)
    if ek is None:
        return f"{REFUSAL_CODE}: the EK digest is malformed"
    view = _bindingForEK(db, ek)
    if view is not None:
        if view.state == "approved":
            return f"{REFUSAL_CODE}: (none: EK {short(ek)} is bound to {view.serial})"
        return (
            f"{REFUSAL_CODE}: the binding of serial {view.serial} to EK"
            f" {short(ek)} is suspended: {view.problem}"
        )
    claims = evidenceFor(db, ek=ek)
    if not claims:
        return (
            f"{REFUSAL_CODE}: no evidence names EK {short(ek)}; an owner records"
            " a receiving-scan or supplier-record and approves the binding"
        )
    serials = sorted({c.serial for c in claims}, key=str.lower)
    if not any(c.kind.independent for c in claims):
        kinds = ", ".join(sorted({c.kind.value for c in claims}))
        return (
            f"{REFUSAL_CODE}: only {kinds} evidence names EK {short(ek)}"
            f" (serial {', '.join(serials)}), and that can never approve a"
            " binding; a receiving-scan or supplier-record is missing"
        )
    return (
        f"{REFUSAL_CODE}: evidence names EK {short(ek)} for serial"
        f" {', '.join(serials)}, but no owner approved the binding"
        f" (fleetctl binding approve SERIAL)"
    )


@dataclass(frozen=True)
class Decision:
    """
    What C{binding approve} may do: approve C{ek} on evidence
    C{evidenceId}, or refuse with C{code} and C{reason}.
    """

    ek: str | None = None
    evidenceId: int | None = None
    code: str | None = None
    reason: str = ""
    conflict: Conflict | None = None


def _kinds(records: Sequence[EvidenceRecord]) -> str:
    return ", ".join(sorted({r.kind.value for r in records}))


def decide(conn: sqlite3.Connection, serial: str, ek: str | None) -> Decision:
    """
    Decide an approval of C{serial} (optionally pinned to EK digest
    C{ek}) from the live evidence [T1]. Reads only.
    """
    claims = evidenceFor(conn, serial=serial)
    wanted = [c for c in claims if ek is None or c.ek_sha256 == ek]
    strong = [c for c in wanted if c.kind.independent]
    naming = f"serial {serial}" + ("" if ek is None else f" and EK {short(ek)}")
    if not strong:
        missing = f"a receiving-scan or supplier-record naming {naming} is missing"
        if not wanted:
            return Decision(
                code=EVIDENCE_MISSING,
                reason=f"no evidence names {naming}: {missing}",
            )
        return Decision(
            code=EVIDENCE_INSUFFICIENT,
            reason=f"only {_kinds(wanted)} evidence names {naming}; those kinds"
            f" are recorded but can never approve a binding: {missing}",
        )
    chosen = strong[0]
    conflict = conflictOf(conn, serial, chosen.ek_sha256)
    if conflict:
        return Decision(
            code=CONFLICTING_EVIDENCE,
            reason=f"{conflict.describe()}; withdraw the wrong evidence"
            " (fleetctl evidence withdraw ID) before approving",
            conflict=conflict,
        )
    return Decision(ek=chosen.ek_sha256, evidenceId=chosen.id)


def storeBinding(
    conn: sqlite3.Connection,
    *,
    serial: str,
    ek: str,
    device: str,
    evidenceId: int,
    at: float,
    actor: str,
) -> list[tuple[str, str]]:
    """
    Store the approved binding, replacing any binding of the same serial
    or EK (their evidence was withdrawn, or approval would have refused);
    return the replaced C{(serial, ek)} pairs.
    """
    replaced = conn.execute(
        "SELECT serial, ek_sha256 FROM ek_bindings WHERE serial = ? OR ek_sha256 = ?",
        (serial, ek),
    ).fetchall()
    conn.execute(
        "DELETE FROM ek_bindings WHERE serial = ? OR ek_sha256 = ?", (serial, ek)
    )
    conn.execute(
        "INSERT INTO ek_bindings"
        " (serial, ek_sha256, device, evidence, approved_at, approved_by)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (serial, ek, device, evidenceId, at, actor),
    )
    return [(str(s), str(e)) for s, e in replaced]
