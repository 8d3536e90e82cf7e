"""Tests for L{fleetd.ratelimit}: token buckets and poll pacing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.ratelimit import PollPacer, RateLimiter


def limiter(clock: Clock, **kwargs: float) -> RateLimiter:
    options: dict[str, float] = dict(
        rate=1.0, burst=3.0, globalRate=100.0, globalBurst=100.0
    )
    options.update(kwargs)
    maxSources = int(options.pop("maxSources", 65536))
    return RateLimiter(clock, maxSources=maxSources, **options)


class RateLimiterTests(SynchronousTestCase):
    def test_allow_burstThenRefused(self) -> None:
        """A source may spend its burst at once, then is refused."""
        limits = limiter(Clock())
        self.assertEqual([limits.allow("a") for _ in range(4)], [1, 1, 1, 0])

    def test_allow_refillsWithTime(self) -> None:
        """Tokens come back at C{rate} per second, up to the burst."""
        clock = Clock()
        limits = limiter(clock)
        for _ in range(3):
            limits.allow("a")
        clock.advance(1)
        self.assertTrue(limits.allow("a"))
        self.assertFalse(limits.allow("a"))
        clock.advance(100)
        self.assertEqual([limits.allow("a") for _ in range(4)], [1, 1, 1, 0])

    def test_allow_sourcesIndependent(self) -> None:
        """One source's spending does not touch another's bucket."""
        limits = limiter(Clock())
        for _ in range(5):
            limits.allow("a")
        self.assertTrue(limits.allow("b"))

    def test_allow_globalBucketCapsAll(self) -> None:
        """The global bucket refuses every source once it is empty."""
        clock = Clock()
        limits = limiter(clock, globalBurst=4, globalRate=1)
        allowed = sum(limits.allow(f"s{n}") for n in range(10))
        self.assertEqual(allowed, 4)
        clock.advance(1)
        self.assertTrue(limits.allow("fresh"))

    def test_allow_refusedCostsNothing(self) -> None:
        """A refused request spends neither bucket."""
        clock = Clock()
        limits = limiter(clock, burst=1, globalBurst=2, globalRate=0.001)
        self.assertTrue(limits.allow("a"))
        for _ in range(50):
            self.assertFalse(limits.allow("a"))
        self.assertTrue(limits.allow("b"))

    def test_allow_cost(self) -> None:
        """A request may cost more than one token."""
        limits = limiter(Clock())
        self.assertTrue(limits.allow("a", cost=2.5))
        self.assertFalse(limits.allow("a", cost=1))

    def test_peek_spendsNothing(self) -> None:
        """peek answers like allow would, without spending."""
        limits = limiter(Clock(), burst=1)
        self.assertTrue(limits.peek("a"))
        self.assertTrue(limits.peek("a"))
        self.assertTrue(limits.allow("a"))
        self.assertFalse(limits.peek("a"))

    def test_retryAfter_seconds(self) -> None:
        """retryAfter is the whole seconds until one token is back, at least 1."""
        clock = Clock()
        limits = limiter(clock, rate=0.25, burst=1)
        self.assertEqual(limits.retryAfter("a"), 1)
        limits.allow("a")
        self.assertEqual(limits.retryAfter("a"), 4)
        clock.advance(2.5)
        self.assertEqual(limits.retryAfter("a"), 2)

    def test_retryAfter_global(self) -> None:
        """retryAfter also waits for the global bucket."""
        limits = limiter(Clock(), globalBurst=1, globalRate=0.1)
        limits.allow("a")
        self.assertEqual(limits.retryAfter("b"), 10)

    def test_clockBackwards_noRefill(self) -> None:
        """A clock that steps back refills nothing (and breaks nothing)."""
        clock = Clock()
        clock.advance(1000)
        limits = limiter(clock, burst=1)
        limits.allow("a")
        clock.rightNow = 10.0
        self.assertFalse(limits.allow("a"))

    def test_noTimers(self) -> None:
        """The limiter arms no timers: there is nothing to cancel."""
        clock = Clock()
        limits = limiter(clock)
        for n in range(100):
            limits.allow(f"s{n % 7}")
            clock.advance(0.1)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_maxSources_evictsLeastRecentlySeen(self) -> None:
        """Beyond maxSources the least recently seen source is forgotten."""
        limits = limiter(Clock(), burst=1, maxSources=2)
        limits.allow("a")
        limits.allow("b")
        limits.allow("a")  # a is now the most recently seen
        limits.allow("c")  # evicts b
        self.assertEqual(len(limits), 2)
        self.assertFalse(limits.allow("a"))
        self.assertTrue(limits.allow("b"))  # forgotten, so a full bucket

    def test_badParameters_refused(self) -> None:
        """Rates and bursts must be positive and finite."""
        for bad in (0.0, -1.0, float("inf"), float("nan")):
            with self.assertRaises(ValueError):
                limiter(Clock(), rate=bad)
        with self.assertRaises(ValueError):
            limiter(Clock(), maxSources=0)

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.floats(min_value=0, max_value=5),
                st.sampled_from("abcd"),
                st.sampled_from([0.5, 1.0, 2.0]),
            ),
            max_size=200,
        ),
        st.floats(min_value=0.1, max_value=10),
        st.floats(min_value=1, max_value=10),
    )
    def test_property_neverMoreThanBurstPlusRate(
        self, steps: list[tuple[float, str, float]], rate: float, burst: float
    ) -> None:
        """
        Whatever the timing, a source never gets more than
        C{burst + rate * elapsed} tokens' worth of requests.
        """
        clock = Clock()
        limits = RateLimiter(
            clock, rate=rate, burst=burst, globalRate=1e9, globalBurst=1e9
        )
        spent: dict[str, float] = {}
        for dt, source, cost in steps:
            clock.advance(dt)
            if limits.allow(source, cost):
                spent[source] = spent.get(source, 0.0) + cost
            self.assertLessEqual(
                spent.get(source, 0.0), burst + rate * clock.seconds() + 1e-6
            )

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(st.integers(min_value=0, max_value=10_000), max_size=300),
        st.integers(min_value=1, max_value=50),
    )
    def test_property_memoryBounded(self, sources: list[int], bound: int) -> None:
        """However many sources ask, at most maxSources are remembered."""
        clock = Clock()
        limits = RateLimiter(
            clock, rate=1, burst=1, globalRate=1, globalBurst=1, maxSources=bound
        )
        for source in sources:
            limits.allow(str(source))
            limits.retryAfter(str(source))
            self.assertLessEqual(len(limits), bound)


class PollPacerTests(SynchronousTestCase):
    def test_onTime_neverSlowDown(self) -> None:
        """Polls every interval are never told to slow down."""
        pacer = PollPacer(5)
        self.assertEqual([pacer.tooFast(5.0 * n) for n in range(10)], [False] * 10)
        self.assertEqual(pacer.interval, 5)

    def test_probePairs_allowed(self) -> None:
        """
        Two polls back to back per interval (golang.org/x/oauth2's
        auth-style probe) are fine.
        """
        pacer = PollPacer(5)
        for n in range(5):
            self.assertFalse(pacer.tooFast(5.0 * n))
            self.assertFalse(pacer.tooFast(5.0 * n + 0.01))
        self.assertEqual(pacer.interval, 5)

    def test_tooFast_growsBy5OncePerWindow(self) -> None:
        """
        A third poll inside the interval is slow_down and adds 5 s for good;
        further polls in that window are slow_down too, without adding more.
        """
        pacer = PollPacer(5)
        self.assertEqual(
            [pacer.tooFast(t) for t in (0, 0.1, 0.2, 0.3, 1)],
            [False, False, True, True, True],
        )
        self.assertEqual(pacer.interval, 10)
        self.assertTrue(pacer.tooFast(6))  # 5 s no longer suffices
        self.assertFalse(pacer.tooFast(10))
        self.assertEqual(pacer.interval, 10)

    def test_jitter_slack(self) -> None:
        """A poll up to one second early (a fifth of small intervals) is on time."""
        pacer = PollPacer(5)
        self.assertFalse(pacer.tooFast(0))
        self.assertFalse(pacer.tooFast(4.0))
        small = PollPacer(1)
        self.assertFalse(small.tooFast(0))
        self.assertFalse(small.tooFast(0.8))


class PeekFailingTests(SynchronousTestCase):
    def test_globalBindsOnlyFailingSources(self) -> None:
        """
        Once others exhausted the global budget, a source that never failed
        still passes peekFailing; one that failed recently does not.
        """
        clock = Clock()
        limiter = RateLimiter(clock, rate=0.01, burst=3, globalRate=0.01, globalBurst=4)
        for i in range(4):
            self.assertTrue(limiter.allow(f"10.0.0.{i}"))
        self.assertFalse(limiter.peek("10.9.9.9"))  # the global bucket is empty
        self.assertTrue(limiter.peekFailing("10.9.9.9"))  # but it never failed
        self.assertFalse(limiter.peekFailing("10.0.0.1"))  # it did
        clock.advance(100)  # both refill
        self.assertTrue(limiter.peekFailing("10.0.0.1"))

    def test_charge_paysWhatIsThere(self) -> None:
        """charge records a failure even when the global bucket is empty."""
        clock = Clock()
        limiter = RateLimiter(clock, rate=0.01, burst=2, globalRate=0.01, globalBurst=1)
        limiter.charge("a")
        limiter.charge("b")  # the global bucket is already empty
        self.assertFalse(limiter.peekFailing("b"))
        limiter.charge("b")
        limiter.charge("b")
        self.assertFalse(limiter.peek("b"))
