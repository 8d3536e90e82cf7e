"""
The HTTP/2 (gRPC) listener of the tink proxy [A4]: connections whose streams
are proxied to tink-server (L{fleetd.h2.proxy}), or, without an upstream
(tests, and a listener built before its upstream), answered Trailers-Only
UNIMPLEMENTED.

The factory numbers connections (an agent restarting in HookOS opens a new
one), keeps them for a graceful stop (GOAWAY, drain, close), and shares one
rate-limited log among them all.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Factory

from fleetd.config import Limits, TinkSettings
from fleetd.h2.grpcwire import GRPCStatus
from fleetd.h2.guard import H2Limits, SourceStreams
from fleetd.h2.metrics import IProxyMetrics
from fleetd.h2.proxy import ProxyStream, TapFactory
from fleetd.h2.server import H2ServerProtocol
from fleetd.h2.stream import Headers, IStreamHandler, StreamResponder
from fleetd.h2.upstream import UpstreamPool
from fleetd.logs import ThrottledLog


class UnimplementedHandler:
    """Answer every call at once with Trailers-Only UNIMPLEMENTED ([A4]).

    The request body needs no waiting: the protocol returns flow-control
    credit for bytes still arriving and resets the unfinished request with
    NO_ERROR, so clients see the status immediately and never stall.
    """

    def __init__(self, responder: StreamResponder) -> None:
        self._responder = responder
        # The connection's log: the listener's shared, rate-limited one.
        self.log = responder.log

    def headersReceived(self, headers: Headers) -> None:
        path = dict(headers).get(b":path", b"").decode("ascii", "replace")
        self.log.info("tink.unimplemented {path}", path=path.split("?", 1)[0][:128])
        self._responder.trailersOnly(
            GRPCStatus.UNIMPLEMENTED, f"fleetd: {path} is not served yet"
        )

    def dataReceived(self, data: bytes) -> None:
        pass

    def endReceived(self) -> None:
        pass

    def reset(self, errorCode: int) -> None:
        pass


class TinkListenerFactory(Factory):
    """Build L{H2ServerProtocol}s with limits; C{handlerFactory} handles each
    stream (default: UNIMPLEMENTED)."""

    noisy = False

    def __init__(
        self,
        clock: IReactorTime,
        *,
        handlerFactory: Callable[[StreamResponder], IStreamHandler] | None = None,
        log: ThrottledLog | None = None,
        maxConcurrentStreams: int = TinkSettings.max_concurrent_streams,
        maxHeaderListSize: int = TinkSettings.max_header_list_size,
        maxMessageBytes: int = TinkSettings.max_message_bytes,
        idleTimeout: float = Limits.idle_timeout,
        streamTimeout: float = TinkSettings.stream_timeout,
        handshakeTimeout: float = TinkSettings.handshake_timeout,
        drainTimeout: float = TinkSettings.drain_timeout,
        limits: H2Limits | None = None,
        sourceStreamRate: float = TinkSettings.source_stream_rate,
        sourceStreamBurst: float = TinkSettings.source_stream_burst,
        countAbuse: Callable[[str], None] | None = None,
    ) -> None:
        """
        @param limits: each connection's abuse budgets (L{H2Limits}).
        @param sourceStreamRate: new streams per second one source (an IPv6
            /64 counts as one) may open across its connections, with
            C{sourceStreamBurst} at once (L{SourceStreams}).
        @param countAbuse: counts abuse by kind (L{IProxyMetrics.abuse}).
        """
        self.clock = clock
        self.sources = SourceStreams(
            clock, rate=sourceStreamRate, burst=sourceStreamBurst
        )
        self._countAbuse = countAbuse
        # One rate-limited log for every connection and stream of the listener.
        self.log = ThrottledLog(clock) if log is None else log
        self._drainTimeout = drainTimeout
        self._connections = 0
        self.protocols: set[H2ServerProtocol] = set()
        self._build = partial(
            H2ServerProtocol,
            handlerFactory or UnimplementedHandler,
            clock=clock,
            maxConcurrentStreams=maxConcurrentStreams,
            maxHeaderListSize=maxHeaderListSize,
            maxMessageBytes=maxMessageBytes,
            idleTimeout=idleTimeout,
            streamTimeout=streamTimeout,
            handshakeTimeout=handshakeTimeout,
            limits=limits,
        )

    def admits(self, source: str) -> bool:
        """Whether a connection from C{source} (a L{sourceKey}) may be
        accepted: not while it is penalised (L{SourceStreams.penalize});
        the connection limits ask this before any TLS work."""
        return self.sources.admits(source)

    def buildProtocol(self, addr: IAddress | None) -> H2ServerProtocol:
        protocol = self._build()
        protocol.log = self.log
        protocol.sources = self.sources
        protocol.countAbuse = self._countAbuse
        protocol.factory = self
        self._connections += 1
        protocol.connectionId = self._connections
        return protocol

    def opened(self, protocol: H2ServerProtocol) -> None:
        self.protocols.add(protocol)

    def closed(self, protocol: H2ServerProtocol) -> None:
        self.protocols.discard(protocol)

    def drain(self) -> Deferred[Any]:
        """fleetd stops: GOAWAY on every connection, let the calls in flight
        finish, close; connections still busy after C{drainTimeout} are
        aborted."""
        draining = [p.drain() for p in list(self.protocols)]
        timer = self.clock.callLater(self._drainTimeout, self._abortAll)
        d: Deferred[Any] = DeferredList(draining)

        def done(result: object) -> object:
            if timer.active():
                timer.cancel()
            return result

        return d.addBoth(done)

    def _abortAll(self) -> None:
        for protocol in list(self.protocols):
            self.log.warn("tink.drain.aborted {peer}", peer=protocol.peer())
            abort = getattr(protocol.transport, "abortConnection", None)
            if abort is not None:
                abort()


def proxyFactory(
    clock: IReactorTime,
    pool: UpstreamPool,
    metrics: IProxyMetrics,
    *,
    tapFactory: TapFactory | None = None,
    **limits: Any,
) -> TinkListenerFactory:
    """The tink listener's factory, proxying every call through C{pool}."""
    log = ThrottledLog(clock)

    def handler(responder: StreamResponder) -> IStreamHandler:
        return ProxyStream(responder, pool, metrics, log, tapFactory)

    return TinkListenerFactory(
        clock, handlerFactory=handler, log=log, countAbuse=metrics.abuse, **limits
    )
