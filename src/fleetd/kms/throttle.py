"""
How often a refused Seal or Unseal is journaled [E1].

Anyone who reaches the kms listener can send any uuid, so a flood of
refusals must not become a flood of journal entries: one entry per source
(an IPv4 address, an IPv6 /64: L{fleetd.sources.sourceKey}) and reason
every L{REFUSAL_EVERY} seconds; the next entry of that key says how many
were only counted (C{not_journaled}). Every refusal is counted.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

REFUSAL_EVERY = 10.0
# Past this many keys, the ones with nothing left to tell are pruned.
KEYS = 4096


class SourceThrottle:
    """Which refusals to journal, by source and reason."""

    def __init__(self, clock: IReactorTime, every: float = REFUSAL_EVERY) -> None:
        self._clock = clock
        self._every = every
        # (source, reason) -> (last journaled at, skipped since)
        self._keys: dict[tuple[str, str], tuple[float, int]] = {}

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
        self._keys[key] = (now, 0)
        if len(self._keys) > KEYS:
            horizon = now - self._every
            for old, (at, count) in list(self._keys.items()):
                if at <= horizon and not count:
                    del self._keys[old]
        return skipped
