"""
The faults C{fleetd-sim --faults NAME[:COUNT],...} can put into a rack
(docs/design.md, the rack simulator's faults): each module gives its
faults; L{FAULTS} names them all. A node gets at most one fault; the
rack's first nodes get them, in the order given, the rest run clean.
"""

from __future__ import annotations

from fleetd.sim.faults import boot, kube, tinkerbell, trust
from fleetd.sim.faults.model import Fault

FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (*trust.FAULTS, *boot.FAULTS, *kube.FAULTS, *tinkerbell.FAULTS)
}


class FaultSpecError(ValueError):
    """A C{--faults} value names no fault or a bad count (one line)."""


def parseFaults(spec: str | None) -> list[str]:
    """
    C{"cloned-tpm,pxe-first:2"} as one fault name per node, in order.

    @raise FaultSpecError: an unknown name or a count below 1.
    """
    names: list[str] = []
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition(":")
        if name not in FAULTS:
            known = ", ".join(sorted(FAULTS)) or "none yet"
            raise FaultSpecError(f"--faults: no fault {name!r} (known: {known})")
        try:
            times = int(count) if count else 1
        except ValueError:
            times = 0
        if times < 1:
            raise FaultSpecError(f"--faults: {part!r}: the count must be 1 or more")
        names += [name] * times
    return names
