"""
How often a refused Seal or Unseal is journaled [E1].

Anyone who reaches the kms listener can send any uuid, so a flood of
refusals must not become a flood of journal entries: one entry per source
(an IPv4 address, an IPv6 /64: L{fleetd.sources.sourceKey}) and reason
every L{REFUSAL_EVERY} seconds; the next entry of that key says how many
were only counted (C{not_journaled}). Every refusal is counted.

Many sources (an IPv6 /48 holds 65,536 /64s) could still write an entry
each: at most L{JOURNALED} entries are written per period across all
sources, the rest only counted; and at most twice L{KEYS} keys are held,
the oldest dropped (a dropped key's next refusal is journaled again).
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

REFUSAL_EVERY = 10.0
# Past twice this many keys, only the newest this many are kept.
KEYS = 4096
# Entries per period across every source.
JOURNALED = 100


class SourceThrottle:
    """Which refusals to journal, by source and reason."""

    def __init__(self, clock: IReactorTime, every: float = REFUSAL_EVERY) -> None:
        self._clock = clock
        self._every = every
        # (source, reason) -> (last journaled at, skipped since)
        self._keys: dict[tuple[str, str], tuple[float, int]] = {}
        self._period = (-every, 0)  # (start, entries journaled in it)

    def __len__(self) -> int:
        return len(self._keys)

    def admit(self, source: str, reason: str) -> int | None:
        """L{None} when this refusal is only counted, else how many of its
        key were not journaled since its last entry (0 for none)."""
        now = self._clock.seconds()
        key = (source, reason)
        last, skipped = self._keys.get(key, (None, 0))
        if last is not None and now - last < self._every:
            self._keys[key] = (last, skipped + 1)
            return None
        start, journaled = self._period
        if now - start >= self._every:
            start, journaled = now, 0
        if journaled >= JOURNALED:  # the period's budget is spent: counted
            self._hold(key, (now if last is None else last, skipped + 1))
            return None
        self._period = (start, journaled + 1)
        self._hold(key, (now, 0))
        return skipped

    def _hold(self, key: tuple[str, str], value: tuple[float, int]) -> None:
        self._keys[key] = value
        if len(self._keys) > 2 * KEYS:
            newest = sorted(self._keys.items(), key=lambda kv: kv[1][0])[-KEYS:]
            self._keys = dict(newest)
