"""
Faults of the trust part of the table (docs/design.md §9): none built yet.
"""

from __future__ import annotations

from fleetd.sim.faults.model import Fault

FAULTS: tuple[Fault, ...] = ()
