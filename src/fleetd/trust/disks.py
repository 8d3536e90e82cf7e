"""
Disk identity [D1]: check a node's disk report and name its target disk.

The check trusts the serial each disk reports. A report is refused when
a non-removable disk has no serial (C{disk-serial-missing}: it could be
neither wiped nor installed safely; a removable one without a serial, a
BMC's virtual media say, is listed but never a target and never
compared), when two of its disks share a serial, or when another device
reported one of its serials first (C{duplicate-disk-serial}: clones,
some USB bridges, or a node claiming another's disk), and when no disk
qualifies as the target (C{no-target-disk}). Otherwise the target is the
smallest non-removable disk of at least L{MIN_TARGET_BYTES} (ties by
name), named by its serial.

Each serial a device reports is a claim, ordered (C{disk_serials.claim})
from the report that first held it as long as the device's later reports
keep holding it. The first claim wins: a later reporter cannot take away
another's target (and so its META code); it is refused until the owner
decides (C{fleetctl disks forget}). The line the node gets never names
another device; the journal entry does (C{first_reported_by}).

Each device's latest report replaces its earlier one, refused or not,
and is stored with its journal entry, C{disks.reported} or
C{disks.refused}, in one transaction [J1].

Contract for the install-plan lookup (plain functions over the caller's
connection, reading only):

  - L{targetDiskFor}C{(conn, device)}: the target disk's serial once a
    clean report exists and no other device claimed that serial first,
    else L{None};
  - L{diskRefusal}C{(conn, device)}: why not, one line C{"<code>: <why>"}
    with a code from L{REASONS} (C{disks-not-reported} when there is no
    report yet).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.nodes import NodeIdentity
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner
from fleetd.trust.disk_report import Disk
from fleetd.trust.model import TrustError, validateRef

MIN_TARGET_BYTES = 10 * 1024**3

OK = "ok"
DUPLICATE = "duplicate-disk-serial"
MISSING = "disk-serial-missing"
NO_TARGET = "no-target-disk"
NOT_REPORTED = "disks-not-reported"
REASONS = (DUPLICATE, MISSING, NO_TARGET, NOT_REPORTED)


@dataclass(frozen=True)
class DiskVerdict:
    """The outcome of one report: a target disk, or a refusal line."""

    device: str
    target: Disk | None
    code: str | None = None
    reason: str = ""  # for the node: names no other device
    detail: str = ""  # for the journal: the reason naming them
    firstReportedBy: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        return f"{self.code}: {self.reason}" if self.code else OK

    def toJSON(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "target": None if self.target is None else self.target.toJSON(),
            "refused": self.code,
            "reason": self.reason or None,
        }


@dataclass(frozen=True)
class DiskReportView:
    """A device's latest stored report (for C{fleetctl status})."""

    device: str
    reported_at: float
    verdict: str
    target: str | None
    disks: list[dict[str, Any]]

    def toJSON(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "reported_at": self.reported_at,
            "verdict": self.verdict,
            "target": self.target,
            "disks": self.disks,
        }


def _claims(conn: sqlite3.Connection, device: str) -> dict[str, int]:
    """C{device}'s claims: lower-cased serial -> claim order."""
    rows = conn.execute(
        "SELECT serial, claim FROM disk_serials WHERE device = ?", (device,)
    ).fetchall()
    return {str(serial).lower(): int(claim) for serial, claim in rows}


def _firstBy(
    conn: sqlite3.Connection, device: str, serial: str, claim: int | None
) -> list[str]:
    """
    The other devices that claimed C{serial} before C{device}'s C{claim}
    (L{None}: a claim it would make now, after every other).
    """
    if claim is None:
        rows = conn.execute(
            "SELECT DISTINCT device FROM disk_serials WHERE serial = ?"
            " AND device != ? ORDER BY device",
            (serial, device),
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT DISTINCT device FROM disk_serials WHERE serial = ?"
            " AND device != ? AND (claim < ? OR (claim = ? AND device < ?))"
            " ORDER BY device",
            (serial, device, claim, claim, device),
        ).fetchall()
    return [str(d) for (d,) in rows]


def choose(disks: Sequence[Disk], minBytes: int = MIN_TARGET_BYTES) -> Disk | None:
    """The target: the smallest non-removable disk of C{minBytes} or more."""
    candidates = [d for d in disks if not d.removable and d.size >= minBytes]
    return min(candidates, key=lambda d: (d.size, d.name), default=None)


def judge(
    conn: sqlite3.Connection,
    device: str,
    disks: Sequence[Disk],
    minBytes: int = MIN_TARGET_BYTES,
) -> DiskVerdict:
    """Check C{device}'s report against itself and the fleet's records."""
    missing = [d.name for d in disks if d.serial is None and not d.removable]
    if missing:
        return DiskVerdict(
            device,
            None,
            MISSING,
            f"disk {', '.join(missing)} of {device} exposes no serial in sysfs;"
            " fleetd wipes and installs only disks it can tell apart",
        )
    seen: dict[str, str] = {}
    problems: list[str] = []  # for the node
    named: list[str] = []  # for the journal
    first: list[str] = []
    claims = _claims(conn, device)
    for d in disks:
        if d.serial is None:  # removable: never a target, never compared
            continue
        key = d.serial.lower()
        if key in seen:
            line = f"{seen[key]} and {d.name} both report serial {d.serial}"
            problems.append(line)
            named.append(line)
            continue
        seen[key] = d.name
        others = _firstBy(conn, device, d.serial, claims.get(key))
        if others:
            problems.append(
                f"serial {d.serial} of {d.name} was reported first by another device"
            )
            named.append(
                f"serial {d.serial} of {d.name} was reported first by"
                f" {', '.join(others)}"
            )
            first.extend(o for o in others if o not in first)
    if problems:
        if first:
            problems.append("refused until the owner decides (fleetctl disks forget)")
        return DiskVerdict(
            device,
            None,
            DUPLICATE,
            "; ".join(problems),
            "; ".join(named),
            tuple(first),
        )
    target = choose(disks, minBytes)
    if target is None:
        return DiskVerdict(
            device,
            None,
            NO_TARGET,
            f"no non-removable disk of {minBytes} bytes or more among"
            f" {len(disks)} reported",
        )
    return DiskVerdict(device, target)


def store(
    conn: sqlite3.Connection,
    identity: NodeIdentity,
    disks: Sequence[Disk],
    verdict: DiskVerdict,
    at: float,
) -> None:
    """
    Replace C{identity.device}'s report with this one; a serial it still
    reports keeps its claim, a new one is claimed after every other.
    """
    device = identity.device
    claims = _claims(conn, device)
    (last,) = conn.execute(
        "SELECT COALESCE(MAX(claim), 0) FROM disk_serials"
    ).fetchone()
    conn.execute("DELETE FROM disk_reports WHERE device = ?", (device,))
    conn.execute(
        "INSERT INTO disk_reports (device, serial, reported_at, verdict, target,"
        " disks) VALUES (?, ?, ?, ?, ?, ?)",
        (
            device,
            identity.serial,
            at,
            verdict.line,
            None if verdict.target is None else verdict.target.serial,
            json.dumps([d.toJSON() for d in disks], sort_keys=True),
        ),
    )
    conn.executemany(
        "INSERT INTO disk_serials (serial, device, name, claim) VALUES (?, ?, ?, ?)",
        [
            (d.serial, device, d.name, claims.get(d.serial.lower(), int(last) + 1))
            for d in disks
            if d.serial is not None
        ],
    )


def targetDiskFor(db: sqlite3.Connection, device: str) -> str | None:
    """
    The serial of C{device}'s target disk, from its latest report, if that
    report was clean and no other device claimed the serial first.
    """
    row = db.execute(
        "SELECT verdict, target FROM disk_reports WHERE device = ?", (device,)
    ).fetchone()
    if row is None or row[0] != OK or row[1] is None:
        return None
    target = str(row[1])
    if _firstBy(db, device, target, _claims(db, device).get(target.lower())):
        return None
    return target


def diskRefusal(db: sqlite3.Connection, device: str) -> str:
    """Why C{device} has no target disk, as C{"<code>: <why>"}."""
    row = db.execute(
        "SELECT verdict, target FROM disk_reports WHERE device = ?", (device,)
    ).fetchone()
    if row is None:
        return (
            f"{NOT_REPORTED}: {device} has not reported its disks (fleetd-agent disks)"
        )
    verdict, target = str(row[0]), str(row[1])
    if verdict != OK:
        return verdict
    if _firstBy(db, device, target, _claims(db, device).get(target.lower())):
        return (
            f"{DUPLICATE}: target disk serial {target} was reported first by"
            " another device; refused until the owner decides (fleetctl disks"
            " forget)"
        )
    return f"{OK}: target disk {target}"


def lastReport(db: sqlite3.Connection, device: str) -> DiskReportView | None:
    row = db.execute(
        "SELECT reported_at, verdict, target, disks FROM disk_reports WHERE device = ?",
        (device,),
    ).fetchone()
    if row is None:
        return None
    at, verdict, target, disks = row
    return DiskReportView(
        device, float(at), str(verdict), target, list(json.loads(disks))
    )


class DiskService:
    """Disk reports from nodes, journaled with their verdicts [D1] [J1]."""

    log = Logger()

    def __init__(
        self,
        runner: IRunner,
        journal: AsyncJournal,
        clock: IReactorTime,
        minBytes: int = MIN_TARGET_BYTES,
    ) -> None:
        self._runner = runner
        self._journal = journal
        self._clock = clock
        self._minBytes = minBytes

    async def report(
        self, identity: NodeIdentity, disks: Sequence[Disk]
    ) -> DiskVerdict:
        """Judge, store and journal one report; fire with the verdict."""
        at = self._clock.seconds()
        actor = f"node:{identity.device}"

        def work(db: Database, record: Recorder) -> DiskVerdict:
            conn = db.connection
            verdict = judge(conn, identity.device, disks, self._minBytes)
            store(conn, identity, disks, verdict, at)
            if verdict.target is not None:
                record(
                    "disks.reported",
                    actor=actor,
                    device=identity.device,
                    fields={
                        "disks": len(disks),
                        "target": verdict.target.serial,
                        "target_name": verdict.target.name,
                        "target_size": verdict.target.size,
                    },
                )
            else:
                fields: dict[str, str | int | None] = {
                    "disks": len(disks),
                    "reason": verdict.code,
                    "detail": (verdict.detail or verdict.reason)[:500],
                }
                if verdict.firstReportedBy:
                    fields["first_reported_by"] = ", ".join(verdict.firstReportedBy)[
                        :500
                    ]
                record(
                    "disks.refused",
                    actor=actor,
                    device=identity.device,
                    fields=fields,
                )
            return verdict

        verdict = await self._journal.change(work)
        if verdict.code is not None:
            self.log.warn(
                "disks.refused {device} {code}",
                device=identity.device,
                code=verdict.code,
            )
        return verdict

    async def forget(self, device: str, *, actor: str, reason: str) -> DiskReportView:
        """
        Drop C{device}'s report (a retired machine whose disks moved on),
        journaled as C{disks.forgotten}; its serials stop counting as
        duplicates and it has no target until it reports again.

        @raise TrustError: no such report (C{"not-found"}) or no reason.
        """
        why = validateRef(reason)
        if why is None:
            raise TrustError("reason: say why the report is forgotten")

        def work(db: Database, record: Recorder) -> DiskReportView:
            conn = db.connection
            old = lastReport(conn, device)
            if old is None:
                raise TrustError(f"no disk report from {device}", "not-found")
            conn.execute("DELETE FROM disk_reports WHERE device = ?", (device,))
            record(
                "disks.forgotten",
                actor=actor,
                device=device,
                fields={"disks": len(old.disks), "target": old.target, "reason": why},
            )
            return old

        return await self._journal.change(work)

    async def lastReport(self, device: str) -> DiskReportView | None:
        def read(db: Database) -> DiskReportView | None:
            with db.transaction(write=False) as conn:
                return lastReport(conn, device)

        return await self._runner.run(read)
