"""
L{fleetd.periodic.PeriodicAfter}: a job every so many seconds on a given
clock, begun once the start-up load settles; the census and the chain's
verification run on it (tests.test_census, tests.test_alerts).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from fleetd.periodic import MAX_RETRY, BackedOffStart, PeriodicAfter


class PeriodicAfterTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.runs: list[float] = []
        self.begin: list[Callable[[], None]] = []

    def work(self) -> None:
        self.runs.append(self.clock.seconds())

    def periodic(self, after: bool = True) -> PeriodicAfter:
        job = PeriodicAfter(
            self.clock, self.work, after=self.begin.append if after else None
        )
        self.addCleanup(job.stop)
        return job

    def test_withoutAfter_runsNowAndEveryInterval(self) -> None:
        """Without C{after} the job runs at start, then every interval on
        the clock it was given."""
        job = self.periodic(after=False)
        job.start(60.0)
        self.assertEqual(self.runs, [0.0])
        self.clock.advance(59.0)
        self.assertEqual(self.runs, [0.0])
        self.clock.advance(1.0)
        self.clock.advance(60.0)
        self.assertEqual(self.runs, [0.0, 60.0, 120.0])
        self.assertIsNotNone(job.loop)

    def test_after_waitsForItsCall(self) -> None:
        """With C{after} nothing runs, and no timer is armed, until C{after}
        calls back; then the job runs at once and every interval."""
        job = self.periodic()
        job.start(10.0)
        self.clock.advance(100.0)
        self.assertEqual((self.runs, self.clock.getDelayedCalls()), ([], []))
        self.assertIsNone(job.loop)
        self.begin[0]()
        self.clock.advance(10.0)
        self.assertEqual(self.runs, [100.0, 110.0])

    def test_secondBegin_ignored(self) -> None:
        """A second begin (a second start, or C{after} calling back twice)
        neither runs the job again nor arms a second timer."""
        job = self.periodic()
        job.start(10.0)
        job.start(10.0)
        self.begin[0]()
        self.begin[1]()
        self.begin[0]()
        self.assertEqual(self.runs, [0.0])
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(10.0)
        self.assertEqual(self.runs, [0.0, 10.0])

    def test_stop_stops(self) -> None:
        """L{PeriodicAfter.stop} cancels the timer: the job runs no more."""
        job = self.periodic(after=False)
        job.start(10.0)
        job.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIsNone(job.loop)
        self.clock.advance(100.0)
        self.assertEqual(self.runs, [0.0])

    def test_stoppedBeforeAfterCalls_neverRuns(self) -> None:
        """Stopped before C{after} calls back: its call arms no timer."""
        job = self.periodic()
        job.start(10.0)
        job.stop()
        self.begin[0]()
        self.assertEqual((self.runs, self.clock.getDelayedCalls()), ([], []))

    def test_restart_beginsAgain(self) -> None:
        """Stopped and started again, the job begins again."""
        job = self.periodic(after=False)
        job.start(10.0)
        job.stop()
        self.clock.advance(5.0)
        job.start(10.0)
        self.assertEqual(self.runs, [0.0, 5.0])

    def test_failure_givenToFailed(self) -> None:
        """A job that raises ends the loop; C{failed} gets the failure."""
        failures: list[Failure] = []

        def broken() -> None:
            raise ValueError("no")

        job = PeriodicAfter(self.clock, broken, failed=failures.append)
        job.start(10.0)
        self.assertEqual([f.getErrorMessage() for f in failures], ["no"])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class BackedOffStartTests(SynchronousTestCase):
    """A start tried until it works, backing off on the clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.tries = 0
        self.works = False
        self.told: list[float] = []

        async def start() -> None:
            self.tries += 1
            if not self.works:
                raise RuntimeError("database down")

        def failed(f: Failure, delay: float) -> None:
            self.assertTrue(f.check(RuntimeError))
            self.told.append(delay)

        self.starting = BackedOffStart(self.clock, start, failed)

    def test_failures_retriedDoublingToTheMost_thenWorks(self) -> None:
        self.starting.begin()
        for _ in range(8):
            self.clock.advance(self.told[-1])
        self.assertEqual(self.told, [1, 2, 4, 8, 16, 32, 60, 60, 60])
        self.assertEqual(self.told[-1], MAX_RETRY)
        self.works = True
        self.clock.advance(MAX_RETRY)
        self.assertEqual((self.tries, len(self.told)), (10, 9))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_noMoreTries_failureNotTold(self) -> None:
        self.starting.begin()
        self.assertEqual(self.starting.stop(), self.starting.starting)
        self.clock.advance(100)
        self.assertEqual((self.tries, self.told), (1, [1]))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_beginAgain_fromTheFirstDelay(self) -> None:
        self.starting.begin()
        self.clock.advance(1)
        self.starting.stop()
        self.starting.begin()
        self.assertEqual(self.told, [1, 2, 1])
