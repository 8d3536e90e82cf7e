"""
The start-up load as a service: read the runs (and the boot states that
need them) once, then tell everyone fleetd can serve.

L{LoadService} starts the load when it starts and drives
L{fleetd.readiness.Readiness}: loaded once the load finished (ready once
every listener passed its TLS self-check too), C{failed} with a one-line
reason when it raised (the boot listener keeps answering 503 "starting";
a human must look); L{Readiness} tells the service manager. On success the
start-up heap is frozen; on failure the collector runs again.
L{LoadService.whenReady} fires once the load settled either way (txacme's
C{AcmeIssuingService.when_certs_valid}).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.heap import ICollector, freezeStartup, resume
from fleetd.readiness import Readiness


class LoadService(Service):
    """Load once at start; on stop, wait for the load and stop what it fed."""

    log = Logger()

    def __init__(
        self,
        load: Callable[[], Coroutine[Any, Any, None]],
        readiness: Readiness,
        *,
        collector: ICollector | None = None,
        started: Callable[[], object] = lambda: None,
        stop: Callable[[], Deferred[None]] | None = None,
    ) -> None:
        """
        @param load: the load, called once when the service starts.
        @param collector: paused for start-up by the daemon; frozen once
            loaded, resumed if the load failed (L{fleetd.heap}).
        @param started: called as the service starts, before the load
            (the daemon's "started" announcement comes first).
        @param stop: stops what the load fed (called when this service
            stops, while the load may still run).
        """
        self._load = load
        self.readiness = readiness
        self._collector = collector
        self._started = started
        self._stop = stop
        self._loading: Deferred[None] | None = None
        self._settled = False
        self._waiting: list[Deferred[None]] = []

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._started()
        self._loading = Deferred.fromCoroutine(self._load())
        self._loading.addCallbacks(self._loaded, self._failed)
        self._loading.addBoth(self._settle)

    def whenReady(self) -> Deferred[None]:
        """
        Fire once the start-up load finished, loaded or failed (at once if
        it already has); L{Readiness} says which.
        """
        if self._settled:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiting.append(d)
        return d

    def _loaded(self, _: None) -> None:
        if self._collector is not None:
            freezeStartup(self._collector)
        # /healthz 200, fleetd_ready 1 and READY=1 once the listeners pass.
        self.readiness.loaded()

    def _failed(self, f: Failure) -> None:
        self.log.failure("runs.load.failed", failure=f)
        if self._collector is not None:
            resume(self._collector)
        error = " ".join(f"{type(f.value).__name__}: {f.getErrorMessage()}".split())
        reason = f"loading the runs failed: {error}"[:200]  # one line
        self.readiness.failed(reason)

    def _settle(self, _: object) -> None:
        self._settled = True
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(None)

    def stopService(self) -> Deferred[Any]:
        super().stopService()  # type: ignore[no-untyped-call]
        pending: list[Deferred[Any]] = []
        if self._loading is not None:
            loading, self._loading = self._loading, None
            pending.append(loading)
        if self._stop is not None:
            pending.append(self._stop())
        return DeferredList(pending, consumeErrors=True)
