"""
A periodic job that begins once the start-up load settles: the census of
the inventory and the journal chain's verification are two. L{PeriodicAfter}
runs the job every C{interval} seconds on the given clock, the first time
as soon as it begins; it begins when C{after} calls back (fleetd passes
L{fleetd.readiness.Readiness.whenSettled}), or at once without C{after}.
L{BackedOffStart} tries a start until it works, backing off.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure

After = Callable[[Callable[[], None]], None]
"""Called with a function that begins the job, when the job may begin."""


class PeriodicAfter:
    """
    C{work} every C{interval} seconds on C{clock}, begun by L{start} (once
    C{after} calls back) and ended by L{stop}. A second begin is ignored,
    and one that arrives after L{stop} arms no timer.
    """

    def __init__(
        self,
        clock: IReactorTime,
        work: Callable[[], object],
        *,
        after: After | None = None,
        failed: Callable[[Failure], None] | None = None,
    ) -> None:
        """
        @param after: called at start with a function that begins the job;
            L{None} begins it at once.
        @param failed: called if the loop ends with a failure (C{work}
            raised or its Deferred failed); the job then runs no more.
        """
        self._clock = clock
        self._work = work
        self._after = after
        self._failed = failed
        self._interval = 0.0
        self._started = False
        self.loop: LoopingCall | None = None
        """The running loop; L{None} before the job began and after L{stop}."""

    def start(self, interval: float) -> None:
        """Begin the job, every C{interval} seconds, once C{after} allows."""
        self._started, self._interval = True, interval
        if self._after is None:
            self._begin()
        else:
            self._after(self._begin)

    def _begin(self) -> None:
        if not self._started or self.loop is not None:
            return  # stopped before the load settled, or already begun
        self.loop = LoopingCall(self._work)
        self.loop.clock = self._clock
        d = self.loop.start(self._interval, now=True)
        if self._failed is not None:
            d.addErrback(self._failed)

    def stop(self) -> None:
        """End the job; a begin still to come arms no timer."""
        self._started = False
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        self.loop = None


FIRST_RETRY = 1.0
MAX_RETRY = 60.0


class BackedOffStart:
    """
    A start that is tried until it works: C{start} (a coroutine function)
    runs at L{begin}; when it fails, C{failed} hears the failure and the
    delay before the next try, which begins at L{FIRST_RETRY} seconds and
    doubles to L{MAX_RETRY}, on C{clock}. After L{stop} nothing is tried
    and a failure is not told. The Kubernetes service and Tinkerbell's
    objects start this way (the database or the API may be down).
    """

    def __init__(
        self,
        clock: IReactorTime,
        start: Callable[[], Coroutine[Any, Any, None]],
        failed: Callable[[Failure, float], None],
    ) -> None:
        self._clock = clock
        self._start = start
        self._failedWith = failed
        self._delay = FIRST_RETRY
        self._retry: IDelayedCall | None = None
        self._stopped = False
        self.starting: Deferred[None] | None = None  # the try in flight

    def begin(self) -> None:
        self._stopped, self._delay = False, FIRST_RETRY
        self._attempt()

    def _attempt(self) -> None:
        self._retry = None
        self.starting = Deferred.fromCoroutine(self._start())
        self.starting.addErrback(self._failed)

    def _failed(self, f: Failure) -> None:
        if self._stopped:
            return
        self._failedWith(f, self._delay)
        self._retry = self._clock.callLater(self._delay, self._attempt)
        self._delay = min(self._delay * 2, MAX_RETRY)

    def stop(self) -> Deferred[None] | None:
        """No more tries; the try in flight, if any, to wait for."""
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        return self.starting
