"""
How often a refusal on the device listener is journaled [J1].

Anyone can reach 8444 and send a device's public claim (EK certificate,
public areas, bound serial), so a flood of refusals must not become a
flood of journal entries, each mirrored to NetBox. A refusal is journaled
at most once per reason every L{ANONYMOUS_EVERY} seconds when it names no
device, and once per device and reason every L{NAMED_EVERY} seconds when
it does; the next entry of that key carries how many were not
(C{not_journaled}).

A refusal named only by what the caller claims (the serial or uuid it
reports, the serials the evidence of an EK it presents names; issue 27,
L{fleetd.attest.naming}) costs a token of one budget shared by all such
refusals too (L{CLAIMED_BURST} at once, one more every L{ANONYMOUS_EVERY}
seconds): anyone can claim every serial of the inventory, so naming must
not multiply what a stranger can make fleetd journal. With the budget
spent, such a refusal is throttled, and journaled, as one naming no device,
exactly as before.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

ANONYMOUS_EVERY = 10.0
NAMED_EVERY = 10.0
# Refusals named by a claim journaled at once (a rack refused together),
# then one more every ANONYMOUS_EVERY seconds.
CLAIMED_BURST = 64.0
# Past this many keys, the ones with nothing left to tell are pruned.
KEYS = 4096


class JournalThrottle:
    """Which refusals to journal, by device (or none) and reason."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        # (device or None, reason) -> (last journaled at, skipped since)
        self._keys: dict[tuple[str | None, str], tuple[float, int]] = {}
        self._claims = (CLAIMED_BURST, clock.seconds())  # (tokens, as of)

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

    def admitClaimed(self, device: str, reason: str) -> tuple[str | None, int] | None:
        """
        L{admit} for a refusal that names C{device} only by a claim: the
        device to journal it under (L{None} once the shared budget is
        spent) and its skipped count, or L{None} when it is only counted.
        """
        now = self._clock.seconds()
        last, skipped = self._keys.get((device, reason), (None, 0))
        if last is not None and now - last < NAMED_EVERY:
            self._keys[(device, reason)] = (last, skipped + 1)
            return None  # its own key is throttled: no token spent
        tokens, at = self._claims
        tokens = min(CLAIMED_BURST, tokens + max(0.0, now - at) / ANONYMOUS_EVERY)
        if tokens < 1:
            self._claims = (tokens, now)
            named = None
        else:
            self._claims = (tokens - 1, now)
            named = device
        admitted = self.admit(named, reason)
        return None if admitted is None else (named, admitted)
