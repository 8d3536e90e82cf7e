"""
What a fault is (docs/design.md, the rack simulator's faults): a change to
one node's path, the end fleetd must record of that node, and a check of
what fleetd recorded, read from fleetd (its journal, its metrics, its
alert rules), never from the sim's own beliefs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleetd.sim.luks import NONE, UNLOCKED
from fleetd.sim.node import Node, Step

# The node's path with the fault in it, from the clean path's steps.
Alter = Callable[[Node, list[Step]], list[Step]]
# What fleetd should have recorded of the node and did not (one line), or None.
Check = Callable[[Node], Awaitable[str | None]]


async def nothingMore(node: Node) -> str | None:
    """A fault whose end state says everything (no further check)."""
    return None


@dataclass(frozen=True)
class Fault:
    """
    One fault of the table.

    @ivar state: the device's final inventory status fleetd reports
        (C{refused} for a refusal), with a cluster; C{stateWithout}
        without one (a rack against C{--config}), when it differs.
    @ivar reason: the refusal's reason code, for a refused node.
    @ivar ownFleetd: only when the sim started fleetd itself (it must
        restart it or empty its vault).
    @ivar disk: with C{--disk-encryption}, how the node's disk ends
        (L{fleetd.sim.luks.DiskState}'s C{state}), with C{diskReason} for
        a refusal; by default C{unlocked}, or C{none} for a node refused
        before its install (L{expectedDisk}).
    """

    name: str
    state: str
    alter: Alter
    check: Check = nothingMore
    reason: str | None = None
    stateWithout: str | None = None
    ownFleetd: bool = False
    disk: str | None = None
    diskReason: str | None = None

    def expectedDisk(self) -> tuple[str, str | None]:
        """The disk's end state and refusal reason (C{--disk-encryption})."""
        if self.disk is not None:
            return self.disk, self.diskReason
        return (NONE, None) if self.state == "refused" else (UNLOCKED, None)

    def expected(self, cluster: bool) -> str:
        if cluster or self.stateWithout is None:
            return self.state
        return self.stateWithout
