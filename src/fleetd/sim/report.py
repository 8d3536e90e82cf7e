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

from fleetd.sim.node import PHASES

BAR = 20


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

    @property
    def ok(self) -> bool:
        return self.state == self.expected and self.error is None

    def asJSON(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fault": self.fault,
            "state": self.state,
            "reason": self.reason,
            "phases": self.phases,
            "alerts": self.alerts,
        }


def progressLine(elapsed: float, phases: Sequence[str], total: int) -> str:
    """C{[  12.3s] ######----  tpm 1 · enroll 2 · … · done 3/8}."""
    counts = Counter(phases)
    done = counts.get("done", 0)
    filled = BAR * done // total if total else BAR
    parts = [f"{p} {counts[p]}" for p in ("waiting", *PHASES) if counts.get(p)]
    bar = "#" * filled + "-" * (BAR - filled)
    return f"[{elapsed:7.1f}s] {bar}  {' · '.join(parts) or '-'}  done {done}/{total}"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(
    outcomes: Sequence[Outcome], seconds: float, active: float | None
) -> dict[str, Any]:
    """Counts, the rack's wall time, the seconds until its last kubelet
    certificate (C{active}) and p50/p99 seconds per phase."""
    states = Counter(o.state for o in outcomes)
    perPhase: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        values = [o.phases[phase] for o in outcomes if phase in o.phases]
        if values:
            perPhase[phase] = {
                "p50": percentile(values, 0.5),
                "p99": percentile(values, 0.99),
            }
    return {
        "nodes": len(outcomes),
        "as_expected": sum(o.ok for o in outcomes),
        "unexpected": [o.name for o in outcomes if not o.ok],
        "states": dict(sorted(states.items())),
        "seconds": round(seconds, 3),
        "rack_active_seconds": None if active is None else round(active, 3),
        "phases": perPhase,
    }


def table(outcomes: Sequence[Outcome], total: dict[str, Any], out: IO[str]) -> None:
    """The per-node table and the summary, for a terminal."""
    head = ["node", "state", *PHASES, "alerts", "reason"]
    rows = [head]
    for o in outcomes:
        times = [f"{o.phases[p]:.1f}" if p in o.phases else "-" for p in PHASES]
        mark = "" if o.state == o.expected else f" (expected {o.expected})"
        why = o.reason or o.error or "-"
        alerts = ",".join(o.alerts) or "-"
        rows.append([o.name, o.state + mark, *times, alerts, why])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for row in rows:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
            timing = 2 <= i < 2 + len(PHASES)
            cells.append(cell.rjust(width) if timing else cell.ljust(width))
        out.write("  ".join(cells).rstrip() + "\n")
    out.write(
        f"\n{total['as_expected']}/{total['nodes']} nodes as expected"
        f" in {total['seconds']:.1f}s; states {total['states']}\n"
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
