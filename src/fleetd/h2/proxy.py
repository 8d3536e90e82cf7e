"""
One proxied gRPC call: a downstream stream (the agent's) mapped to an
upstream stream (tink-server's), per hop [A4].

Headers, metadata, data and trailers pass unchanged (HPACK is re-encoded
per hop, the values are not): ``te: trailers``, ``grpc-timeout``, ``-bin``
metadata and ``grpc-status-details-bin`` included; a Trailers-Only answer
stays one HEADERS frame. Credit is returned to a sender only once its
bytes were forwarded, so a slow reader on one side slows the sender on the
other (backpressure) instead of filling fleetd's memory. The upstream
stream is opened only once the request is whole (its first message, its
END_STREAM, or L{OPEN_AT} bytes), so a stream reset before that costs
tink-server nothing (CVE-2023-44487, issue 17). A tap, when given,
sees copies of the bytes both ways and the final status; it never changes
anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol as TypingProtocol

from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError

from fleetd.h2.client import Headers, UpstreamConnection
from fleetd.h2.grpcwire import GRPCStatus
from fleetd.h2.metrics import IProxyMetrics
from fleetd.h2.stream import StreamResponder
from fleetd.h2.upstream import UpstreamPool
from fleetd.logs import ThrottledLog


class ICallTap(TypingProtocol):
    """Sees one call's bytes (copies) and its end (the listener's observer)."""

    def request(self, data: bytes) -> None: ...

    def response(self, data: bytes) -> None: ...

    def finished(self, status: int | None) -> None:
        """The call ended with gRPC C{status}, or L{None} if it was reset."""


TapFactory = Callable[[str, int], ICallTap | None]

# Request bytes that open the upstream stream even before a whole message
# (within the default stream window, so the client is never stalled).
OPEN_AT = 16384


def _status(headers: Headers) -> int | None:
    for name, value in headers:
        if name == b"grpc-status":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class ProxyStream:
    """Both halves of one proxied call (an L{IFlowControlledHandler} and an
    L{IUpstreamStream})."""

    ownsFlowControl = True

    def __init__(
        self,
        responder: StreamResponder,
        pool: UpstreamPool,
        metrics: IProxyMetrics,
        log: ThrottledLog,
        tapFactory: TapFactory | None = None,
    ) -> None:
        self._responder = responder
        self._pool = pool
        self._metrics = metrics
        self.log = log
        self._tapFactory = tapFactory
        self._tap: ICallTap | None = None
        self._headers: Headers = []
        self._method = "other"
        self._pending = bytearray()  # request bytes not yet forwarded
        self._ended = False  # the client finished its request
        self._opened = False  # the pool was asked for a connection
        self._endSent = False
        self._upstream: UpstreamConnection | None = None
        self._sid = 0
        self._unacked = 0  # response bytes received, not yet sent on
        self._done = False

    # Downstream (IFlowControlledHandler)

    def headersReceived(self, headers: Headers) -> None:
        path = dict(headers).get(b":path", b"").decode("ascii", "replace")
        self._method = self._metrics.methodLabel(path)
        self._headers = headers
        self._metrics.active += 1
        if self._tapFactory is not None:
            self._tap = self._tapFactory(path, self._responder.connectionId)

    def dataReceived(self, data: bytes) -> None:
        if self._done:
            self._responder.acknowledge(len(data))
            return
        self._observe("request", data)
        self._pending += data
        if self._opened:
            self._push()
        else:
            self._open()

    def endReceived(self) -> None:
        self._ended = True
        if self._opened:
            self._push()
        else:
            self._open()

    def reset(self, errorCode: int) -> None:
        """The client reset the stream, or its connection went away."""
        if self._done:
            return
        upstream = self._upstream
        self._finish(None, dropped=True)
        if upstream is not None:
            upstream.reset(self._sid)
        else:
            self._pool.forget(self)

    def dataSent(self, size: int) -> None:
        self._unacked -= size
        if self._upstream is not None:
            self._upstream.ack(self._sid, size)

    # The pool (IWaitingStream)

    def attach(self, connection: UpstreamConnection) -> None:
        if self._done:
            return
        try:
            self._sid = connection.openStream(self, self._headers)
        except ProtocolError as e:
            self.log.warn("tink.upstream.stream-refused {error}", error=str(e))
            self._answer(GRPCStatus.UNAVAILABLE, "fleetd: tink-server is busy")
            return
        self._upstream = connection
        self._push()

    def unavailable(self, reason: str) -> None:
        self._answer(GRPCStatus.UNAVAILABLE, reason)

    # Upstream (IUpstreamStream)

    @property
    def blocked(self) -> bool:
        return bool(self._pending) or (self._ended and not self._endSent)

    def windowOpened(self) -> None:
        self._push()

    def responseHeaders(self, headers: Headers, ended: bool) -> None:
        self._responder.sendHeaders(headers, endStream=ended)
        if ended:
            self._finish(_status(headers))

    def responseData(self, data: bytes) -> None:
        if self._done:
            if self._upstream is not None:
                self._upstream.ack(self._sid, len(data))
            return
        self._observe("response", data)
        self._metrics.bytesDownstream.inc(len(data))
        self._unacked += len(data)
        self._responder.sendData(data)

    def responseTrailers(self, trailers: Headers) -> None:
        if not trailers:  # END_STREAM on DATA: no status, not gRPC
            self._responder.reset(ErrorCodes.INTERNAL_ERROR)
            self._finish(None, dropped=True)
            return
        self._responder.sendTrailers(trailers)
        self._finish(_status(trailers))

    def responseReset(self, errorCode: int, refused: bool, lost: bool) -> None:
        if lost:
            # The upstream connection failed under the call: UNAVAILABLE,
            # which clients retry (as trailers if headers went out).
            self._answer(GRPCStatus.UNAVAILABLE, "fleetd: tink-server connection lost")
            return
        # REFUSED_STREAM passes as is: the call was never processed, and
        # grpc clients retry it transparently.
        self._responder.reset(ErrorCodes.REFUSED_STREAM if refused else errorCode)
        self._finish(None, dropped=True)

    # Inside

    def _open(self) -> None:
        """Ask the pool for a connection once the request is whole."""
        pending = self._pending
        if self._done or not (
            self._ended
            or len(pending) >= OPEN_AT
            or (len(pending) >= 5 and len(pending) >= 5 + int.from_bytes(pending[1:5]))
        ):
            return
        self._opened = True
        self._pool.open(self)

    def _push(self) -> None:
        upstream = self._upstream
        if upstream is None or self._done:
            return
        while self._pending:
            size = min(upstream.window(self._sid), len(self._pending))
            if size <= 0:
                return
            chunk = bytes(self._pending[:size])
            del self._pending[:size]
            last = self._ended and not self._pending
            upstream.sendData(self._sid, chunk, end=last)
            self._endSent = self._endSent or last
            self._metrics.bytesUpstream.inc(size)
            self._responder.acknowledge(size)
        if self._ended and not self._endSent:
            self._endSent = True
            upstream.sendData(self._sid, b"", end=True)

    def _answer(self, status: GRPCStatus, message: str) -> None:
        self._responder.trailersOnly(status, message)
        self._finish(int(status))

    def _finish(self, status: int | None, dropped: bool = False) -> None:
        """The call is over; C{dropped}: response bytes still queued for
        the client will never be sent."""
        if self._done:
            return
        self._done = True
        self._metrics.active -= 1
        code = "reset" if status is None else str(status)
        self._metrics.rpcDone(self._method, code)
        # Credit for bytes that will never be forwarded goes back now, so
        # neither connection's window shrinks for good.
        if self._pending:
            self._responder.acknowledge(len(self._pending))
            self._pending.clear()
        if dropped and self._unacked > 0 and self._upstream is not None:
            self._upstream.ack(self._sid, self._unacked)
            self._unacked = 0
        self._observe("finished", status)

    def _observe(self, name: str, arg: object) -> None:
        """Hand the tap a copy; a tap that fails is a bug, never the call's."""
        if self._tap is None:
            return
        try:
            getattr(self._tap, name)(arg)
        except Exception:
            self._tap = None
            self.log.failure("tink.observe.failed {method}", method=self._method)
