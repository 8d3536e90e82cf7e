"""
What a person watches: a progress line on stderr whenever a node changes
phase (counts per phase and a bar), then a table per node and a summary;
and for C{--json} the one JSON object docs/design.md ("The rack
simulator's faults") gives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from fleetd.sim.luks import FAILED, NONE, REFUSED, SEALED, UNLOCKED, DiskState
from fleetd.sim.node import PHASES, TIMED

BAR = 20
ENDS = (UNLOCKED, REFUSED, FAILED, SEALED, NONE)  # a disk's, in the summary's order


@dataclass(frozen=True)
class Outcome:
    """A node's end, as fleetd recorded it (C{state}) and the sim saw it."""

    name: str
    fault: str | None
    state: str
    reason: str | None
    phases: dict[str, float]
    alerts: list[str]
    expected: str
    error: str | None
    # With --disk-encryption: its disk's end, and the (state, reason) expected.
    disk: DiskState | None = None
    expectedDisk: tuple[str, str | None] | None = None

    @property
    def diskOK(self) -> bool:
        if self.disk is None:
            return True
        return (self.disk.state, self.disk.reason) == self.expectedDisk

    @property
    def ok(self) -> bool:
        return self.state == self.expected and self.error is None and self.diskOK

    def asJSON(self) -> dict[str, Any]:
        shown = {
            "name": self.name,
            "fault": self.fault,
            "state": self.state,
            "reason": self.reason,
            "phases": self.phases,
            "alerts": self.alerts,
        }
        if self.disk is not None:
            shown["disk"] = self.disk.asJSON()
        return shown


def progressLine(elapsed: float, phases: Sequence[str], total: int) -> str:
    """C{[  12.3s] ######----  tpm 1 · enroll 2 · … · done 3/8}."""
    counts = Counter(phases)
    done = counts.get("done", 0)
    filled = BAR * done // total if total else BAR
    parts = [f"{p} {counts[p]}" for p in ("waiting", *TIMED) if counts.get(p)]
    bar = "#" * filled + "-" * (BAR - filled)
    return f"[{elapsed:7.1f}s] {bar}  {' · '.join(parts) or '-'}  done {done}/{total}"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def columns(outcomes: Sequence[Outcome]) -> list[str]:
    """The phases a table shows: the clean path's, and the disk's when a
    node was timed in them (C{--disk-encryption})."""
    return [p for p in TIMED if p in PHASES or any(p in o.phases for o in outcomes)]


def summary(
    outcomes: Sequence[Outcome], seconds: float, active: float | None
) -> dict[str, Any]:
    """Counts, the rack's wall time, the seconds until its last kubelet
    certificate (C{active}) and p50/p99 seconds per phase; with
    C{--disk-encryption}, C{disk}: the nodes by their disk's end and the
    refusals by reason."""
    states = Counter(o.state for o in outcomes)
    perPhase: dict[str, dict[str, float]] = {}
    for phase in TIMED:
        values = [o.phases[phase] for o in outcomes if phase in o.phases]
        if values:
            perPhase[phase] = {
                "p50": percentile(values, 0.5),
                "p99": percentile(values, 0.99),
            }
    total: dict[str, Any] = {
        "nodes": len(outcomes),
        "as_expected": sum(o.ok for o in outcomes),
        "unexpected": [o.name for o in outcomes if not o.ok],
        "states": dict(sorted(states.items())),
        "seconds": round(seconds, 3),
        "rack_active_seconds": None if active is None else round(active, 3),
        "phases": perPhase,
    }
    disks = [o.disk for o in outcomes if o.disk is not None]
    if disks:
        reasons = Counter(d.reason for d in disks if d.reason is not None)
        total["disk"] = {
            "states": {s: n for s in ENDS if (n := sum(d.state == s for d in disks))},
            "refused": dict(sorted(reasons.items())),
        }
    return total


def table(outcomes: Sequence[Outcome], total: dict[str, Any], out: IO[str]) -> None:
    """The per-node table and the summary, for a terminal."""
    phases = columns(outcomes)
    disk = "disk" in total
    head = ["node", "state", *phases, *(["disk"] if disk else []), "alerts", "reason"]
    rows = [head]
    for o in outcomes:
        times = [f"{o.phases[p]:.1f}" if p in o.phases else "-" for p in phases]
        mark = "" if o.state == o.expected else f" (expected {o.expected})"
        why = o.reason or o.error or "-"
        alerts = ",".join(o.alerts) or "-"
        rows.append([o.name, o.state + mark, *times, *diskCell(o, disk), alerts, why])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for row in rows:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
            timing = 2 <= i < 2 + len(phases)
            cells.append(cell.rjust(width) if timing else cell.ljust(width))
        out.write("  ".join(cells).rstrip() + "\n")
    out.write(
        f"\n{total['as_expected']}/{total['nodes']} nodes as expected"
        f" in {total['seconds']:.1f}s; states {total['states']}\n"
    )
    if disk:
        states = ", ".join(f"{n} {s}" for s, n in total["disk"]["states"].items())
        refused = ", ".join(f"{r} {n}" for r, n in total["disk"]["refused"].items())
        out.write(
            f"disks: {states}" + (f" (refused: {refused})" if refused else "") + "\n"
        )
    if total["rack_active_seconds"] is not None:
        out.write(
            f"every kubelet certificate approved after"
            f" {total['rack_active_seconds']:.1f}s\n"
        )
    for phase, p in total["phases"].items():
        out.write(f"  {phase:<10} p50 {p['p50']:6.2f}s  p99 {p['p99']:6.2f}s\n")
    if total["unexpected"]:
        out.write(f"unexpected: {' '.join(total['unexpected'])}\n")


def diskCell(o: Outcome, shown: bool) -> list[str]:
    """The disk column's cell (none when the rack has no encrypted disks)."""
    if not shown:
        return []
    if o.disk is None:
        return ["-"]
    mark = ""
    if not o.diskOK and o.expectedDisk is not None:
        mark = f" (expected {' '.join(w for w in o.expectedDisk if w)})"
    return [o.disk.shown() + mark]
