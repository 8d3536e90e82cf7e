"""
What the owner sees of each node's disk key beside its rows (issue 30, item 6): its
last unlock and its refused calls since fleetd started, kept in memory
(a rack's reboot writes nothing for them), and the devices by key state
behind C{fleetd_kms_keys{state}}.

The state and its time come from the database (L{fleetd.kms.store.lastKey});
L{KeyWatch.view} puts them together for C{fleetctl status NAME} and the
console's device page (C{disk_key} in the status report).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from fleetd.kms.reasons import DESTROYED, NONE, SEALED, KMSMetrics
from fleetd.kms.store import KeyRow


@dataclass
class Refusals:
    """A device's refused Seal and Unseal calls since fleetd started."""

    count: int
    reason: str
    at: float


class KeyWatch:
    """Last unlocks, refusals and key states, by device, in memory."""

    def __init__(self, metrics: KMSMetrics) -> None:
        self._metrics = metrics
        self._unlocked: dict[str, float] = {}
        self._refused: dict[str, Refusals] = {}
        self._states: dict[str, str] = {}
        self._counts: Counter[str] = Counter()

    def unlocked(self, device: str, at: float) -> None:
        """An Unseal of C{device} was answered at C{at}."""
        self._unlocked[device] = at

    def refused(self, device: str, reason: str, at: float) -> None:
        """A call of C{device} (found by its uuid) was refused."""
        seen = self._refused.get(device)
        if seen is None:
            self._refused[device] = Refusals(1, reason, at)
        else:
            seen.count, seen.reason, seen.at = seen.count + 1, reason, at

    def states(self, states: dict[str, str]) -> None:
        """Every device's key state, as the start-up read them."""
        self._states = dict(states)
        self._counts = Counter(self._states.values())
        self._gauge()

    def state(self, device: str, state: str) -> None:
        """C{device}'s key is now C{state} (sealed or destroyed)."""
        old = self._states.get(device)
        if old == state:
            return
        if old is not None:
            self._counts[old] -= 1
        self._states[device] = state
        self._counts[state] += 1
        self._gauge()

    def stateOf(self, device: str) -> str | None:
        return self._states.get(device)

    def _gauge(self) -> None:
        for state in (SEALED, DESTROYED):
            self._metrics.keys.labels(state).set(self._counts[state])

    def view(self, device: str, key: KeyRow | None) -> dict[str, Any]:
        """
        C{device}'s key as the status report carries it: its state and
        since when (and why, once destroyed), the run it was made for, its
        last unlock and its refusals since fleetd started.
        """
        if key is None:
            state, at, why, run = NONE, None, None, None
        elif key.live:
            state, at, why, run = SEALED, key.created_at, None, key.generation
        else:
            state, at, why = DESTROYED, key.destroyed_at, key.destroyed_why
            run = key.generation
        refused = self._refused.get(device)
        return {
            "state": state,
            "at": at,
            "why": why,
            "run": run or None,
            "last_unlock": self._unlocked.get(device),
            "refused": None
            if refused is None
            else {"count": refused.count, "reason": refused.reason, "at": refused.at},
        }
