"""
How often a refusal on the device listener is journaled [J1].

Anyone can reach 8444 and send a device's public claim (EK certificate,
public areas, bound serial), so a flood of refusals must not become a
flood of journal entries, each mirrored to NetBox. A refusal is journaled
at most once per reason every L{ANONYMOUS_EVERY} seconds when it names no
device, and once per device and reason every L{NAMED_EVERY} seconds when
it does; the next entry of that key carries how many were not
(C{not_journaled}).
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

ANONYMOUS_EVERY = 10.0
NAMED_EVERY = 10.0
# Past this many keys, the ones with nothing left to tell are pruned.
KEYS = 4096


class JournalThrottle:
    """Which refusals to journal, by device (or none) and reason."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        # (device or None, reason) -> (last journaled at, skipped since)
        self._keys: dict[tuple[str | None, str], tuple[float, int]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def admit(self, device: str | None, reason: str) -> int | None:
        """
        L{None} when this refusal is only counted, else how many of its
        key were not journaled since its last entry (0 for none).
        """
        now = self._clock.seconds()
        key = (device, reason)
        every = ANONYMOUS_EVERY if device is None else NAMED_EVERY
        last, skipped = self._keys.get(key, (None, 0))
        if last is not None and now - last < every:
            self._keys[key] = (last, skipped + 1)
            return None
        self._keys[key] = (now, 0)
        if len(self._keys) > KEYS:
            horizon = now - max(ANONYMOUS_EVERY, NAMED_EVERY)
            for old, (at, count) in list(self._keys.items()):
                if at <= horizon and not count:
                    del self._keys[old]
        return skipped
