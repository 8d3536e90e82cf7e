"""
Token-bucket rate limits per source address and overall, for cheap 429s.

A L{RateLimiter} keeps one bucket per source key and one global bucket.
Buckets refill continuously from C{clock.seconds()} deltas, so there are
no timers to arm or cancel, and every call is O(1).  Memory is bounded:
beyond C{maxSources} keys the least recently seen source is forgotten
(it then starts again with a full bucket; the global bucket still bounds
the total).  Use L{fleetd.sources.sourceKey} to turn a peer address into
a key, so that one IPv6 host cannot spread its requests over its whole /64.
L{PollPacer} is RFC 8628's C{slow_down} rule for one device code's polls.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from twisted.internet.interfaces import IReactorTime

__all__ = ["PollPacer", "RateLimiter"]


class _Bucket:
    """C{tokens} as of time C{at}; never more than the bucket's burst."""

    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at

    def refill(self, now: float, rate: float, burst: float) -> None:
        elapsed = now - self.at
        if elapsed > 0:  # a clock that steps back refills nothing
            self.tokens = min(burst, self.tokens + elapsed * rate)
            self.at = now

    def wait(self, cost: float, rate: float) -> float:
        """Seconds until C{cost} tokens are there (after L{refill})."""
        missing = cost - self.tokens
        return 0.0 if missing <= 0 else missing / rate


class RateLimiter:
    """
    Per-source and global token buckets.

    A request of C{cost} is allowed when both its source's bucket and the
    global bucket hold C{cost} tokens; then both pay.  A refused request
    pays nothing, so a flood from one source cannot drain the global
    bucket for everyone else beyond that source's own allowance.

    @param rate: tokens per second a source regains.
    @param burst: a source's bucket size (what it may spend at once).
    @param globalRate: tokens per second the global bucket regains.
    @param globalBurst: the global bucket size.
    @param maxSources: how many sources are remembered at most.
    """

    def __init__(
        self,
        clock: IReactorTime,
        *,
        rate: float,
        burst: float,
        globalRate: float,
        globalBurst: float,
        maxSources: int = 65536,
    ) -> None:
        for name, value in (
            ("rate", rate),
            ("burst", burst),
            ("globalRate", globalRate),
            ("globalBurst", globalBurst),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, not {value!r}")
        if maxSources < 1:
            raise ValueError("maxSources must be at least 1")
        self._clock = clock
        self.rate = rate
        self.burst = burst
        self.globalRate = globalRate
        self.globalBurst = globalBurst
        self.maxSources = maxSources
        self._global = _Bucket(globalBurst, clock.seconds())
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        """How many sources are remembered now."""
        return len(self._sources)

    def _bucket(self, source: str, now: float) -> _Bucket:
        """The refilled bucket of C{source}, now the most recently seen."""
        bucket = self._sources.get(source)
        if bucket is None:
            bucket = self._sources[source] = _Bucket(self.burst, now)
            if len(self._sources) > self.maxSources:
                self._sources.popitem(last=False)
        else:
            self._sources.move_to_end(source)
            bucket.refill(now, self.rate, self.burst)
        self._global.refill(now, self.globalRate, self.globalBurst)
        return bucket

    def peek(self, source: str, cost: float = 1.0) -> bool:
        """Whether L{allow} would allow C{cost} now; nothing is spent."""
        bucket = self._bucket(source, self._clock.seconds())
        return bucket.tokens >= cost and self._global.tokens >= cost

    def peekFailing(self, source: str, cost: float = 1.0) -> bool:
        """
        Like L{peek}, but the global bucket only binds a source that spent
        tokens recently: a node that never failed is not refused because
        others exhausted the global budget.
        """
        bucket = self._bucket(source, self._clock.seconds())
        if bucket.tokens < cost:
            return False
        return bucket.tokens >= self.burst or self._global.tokens >= cost

    def charge(self, source: str, cost: float = 1.0) -> None:
        """
        Record a failure that already happened: C{source} pays what it has,
        and the global bucket what it has (neither goes below zero).
        """
        bucket = self._bucket(source, self._clock.seconds())
        bucket.tokens = max(0.0, bucket.tokens - cost)
        self._global.tokens = max(0.0, self._global.tokens - cost)

    def allow(self, source: str, cost: float = 1.0) -> bool:
        """Whether C{source} may spend C{cost} now; if so, it is spent."""
        bucket = self._bucket(source, self._clock.seconds())
        if bucket.tokens < cost or self._global.tokens < cost:
            return False
        bucket.tokens -= cost
        self._global.tokens -= cost
        return True

    def retryAfter(self, source: str, cost: float = 1.0) -> int:
        """
        Whole seconds (at least 1) until C{source} may spend C{cost}, for a
        C{Retry-After} header.
        """
        bucket = self._bucket(source, self._clock.seconds())
        wait = max(
            bucket.wait(cost, self.rate), self._global.wait(cost, self.globalRate)
        )
        return max(1, math.ceil(wait))


class PollPacer:
    """
    The RFC 8628 C{slow_down} rule for one device code's polls.

    A window opens with a poll at least C{interval} (less a little slack
    for network jitter) after the previous window opened, and admits
    C{perWindow} polls: golang.org/x/oauth2 sends every unsuccessful poll
    twice back to back (its auth-style probe, Basic header first, then form
    parameters).  The first poll over that grows the interval by C{step}
    seconds for good ("for this and all subsequent requests"); later polls
    in the same window are also too fast, without growing it again, so the
    interval kept here never exceeds the one a client following the RFC
    computes (it adds 5 s per C{slow_down} it sees, and sees one per pair).
    """

    __slots__ = ("_polls", "_slow", "_start", "interval", "perWindow", "step")

    def __init__(self, interval: int, *, step: int = 5, perWindow: int = 2) -> None:
        self.interval = interval
        self.step = step
        self.perWindow = perWindow
        self._start: float | None = None
        self._polls = 0
        self._slow = False

    def tooFast(self, now: float) -> bool:
        """Count one poll at C{now}; whether to answer it C{slow_down}."""
        slack = min(1.0, self.interval / 5)
        if self._start is None or now - self._start >= self.interval - slack:
            self._start, self._polls, self._slow = now, 1, False
            return False
        self._polls += 1
        if not self._slow and self._polls > self.perWindow:
            self.interval += self.step
            self._slow = True
        return self._slow
