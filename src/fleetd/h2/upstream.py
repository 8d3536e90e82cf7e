"""
Where the tink proxy's streams go: one live connection to tink-server at a
time, dialled on demand.

Streams wait while the connection is being made; if it cannot be made in
C{connectTimeout} seconds they are answered UNAVAILABLE (gRPC status 14),
which clients retry. After a GOAWAY or a lost connection the next stream
dials a fresh one; streams still running on the old one finish there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Protocol as TypingProtocol

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import (
    IDelayedCall,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from fleetd.config import TinkSettings
from fleetd.h2.client import UpstreamConnection
from fleetd.h2.metrics import IProxyMetrics
from fleetd.logs import ThrottledLog


class IWaitingStream(TypingProtocol):
    def attach(self, connection: UpstreamConnection) -> None:
        """Open your upstream stream on C{connection}."""

    def unavailable(self, reason: str) -> None:
        """No upstream connection could be made."""


class _ConnectionFactory(Factory):
    noisy = False

    def __init__(self, build: Callable[[], UpstreamConnection]) -> None:
        self._build = build

    def buildProtocol(self, addr: object) -> UpstreamConnection:
        return self._build()


class UpstreamPool:
    """One live upstream connection, dialled on demand."""

    def __init__(
        self,
        clock: IReactorTime,
        endpoint: Callable[[], IStreamClientEndpoint],
        *,
        log: ThrottledLog,
        metrics: IProxyMetrics,
        connectTimeout: float = TinkSettings.connect_timeout,
        maxHeaderListSize: int = 65536,
        closeGrace: float = 2.0,
    ) -> None:
        self._closeGrace = closeGrace
        self._clock = clock
        self._endpoint = endpoint
        self.log = log
        self.metrics = metrics
        self._connectTimeout = connectTimeout
        self._maxHeaderListSize = maxHeaderListSize
        self._current: UpstreamConnection | None = None
        self._all: set[UpstreamConnection] = set()
        self._waiting: list[IWaitingStream] = []
        self._dialling: Deferred[Any] | None = None
        self._timer: IDelayedCall | None = None

    def open(self, stream: IWaitingStream) -> None:
        """Give C{stream} a connection now, or once one is made."""
        current = self._current
        if current is not None and current.usable:
            stream.attach(current)
            return
        self._waiting.append(stream)
        if self._dialling is None:
            self._dial()

    def forget(self, stream: IWaitingStream) -> None:
        """C{stream} no longer wants a connection (the client gave up)."""
        if stream in self._waiting:
            self._waiting.remove(stream)

    def _dial(self) -> None:
        factory = _ConnectionFactory(
            lambda: UpstreamConnection(
                self.log, self._gone, self.metrics, self._maxHeaderListSize
            )
        )
        d: Deferred[Any] = self._endpoint().connect(factory)
        self._dialling = d
        self._timer = self._clock.callLater(self._connectTimeout, d.cancel)
        d.addCallbacks(self._connected, self._failed)

    def _stopTimer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _connected(self, connection: UpstreamConnection) -> None:
        self._stopTimer()
        self._dialling = None
        self._current = connection
        self._all.add(connection)
        connection.closed.addBoth(lambda _: self._all.discard(connection))
        waiting, self._waiting = self._waiting, []
        for stream in waiting:
            if connection.usable:
                stream.attach(connection)
            else:
                self.open(stream)

    def _failed(self, failure: Failure) -> None:
        self._stopTimer()
        self._dialling = None
        reason = failure.getErrorMessage() or repr(failure.type)
        self.metrics.upstreamErrors.labels("connect").inc()
        self.log.warn("tink.upstream.unreachable {reason}", reason=reason)
        waiting, self._waiting = self._waiting, []
        for stream in waiting:
            stream.unavailable("fleetd: tink-server is unreachable")

    def _gone(self, connection: UpstreamConnection) -> None:
        """C{connection} got GOAWAY or was lost: no new streams there."""
        if self._current is connection:
            self._current = None

    def close(self) -> Deferred[Any]:
        """fleetd stops (after the listener drained): close every upstream
        connection once its streams are done; cancel a dial."""
        self._stopTimer()
        if self._dialling is not None:
            self._dialling.cancel()
        closing = [c.closed for c in self._all if not c.closed.called]
        for connection in list(self._all):
            connection.drain()
        self._current = None
        # A TLS upstream may never answer our close_notify: cut it off.
        timer = self._clock.callLater(self._closeGrace, self._abortAll)
        d: Deferred[Any] = DeferredList(closing)

        def closed(result: object) -> object:
            if timer.active():
                timer.cancel()
            return result

        return d.addBoth(closed)

    def _abortAll(self) -> None:
        for connection in list(self._all):
            connection.abort()
