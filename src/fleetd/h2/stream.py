"""
One HTTP/2 stream of the tink listener, seen from its handler.

L{IStreamHandler} is what a stream's handler implements (the proxy's
L{fleetd.h2.proxy.ProxyStream}, or the placeholder that answers
UNIMPLEMENTED); L{StreamResponder} is the sending half it is given:
headers, data sent as the peer's windows allow, trailers, resets.
L{IStreamConnection} is what a stream needs from its connection
(L{fleetd.h2.server.H2ServerProtocol} provides it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol as TypingProtocol
from typing import cast

from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError
from twisted.logger import Logger

from fleetd.h2.grpcwire import GRPCStatus, MessageSizeGuard, encodeGrpcMessage
from fleetd.h2.guard import ConnectionGuard
from fleetd.logs import ThrottledLog

Headers = list[tuple[bytes, bytes]]


class IStreamHandler(TypingProtocol):
    """One request stream; the later gRPC proxy implements this."""

    def headersReceived(self, headers: Headers) -> None:
        """The request headers (already checked to be a gRPC request)."""

    def dataReceived(self, data: bytes) -> None:
        """Request body bytes; flow-control credit is returned after this."""

    def endReceived(self) -> None:
        """The client half-closed the stream."""

    def reset(self, errorCode: int) -> None:
        """The stream was reset by the peer or the connection went away."""


class IFlowControlledHandler(IStreamHandler, TypingProtocol):
    """A handler that returns request credit itself (a proxy: only once the
    bytes were forwarded, L{StreamResponder.acknowledge}), and hears when
    response bytes leave (L{dataSent}), for backpressure on both hops."""

    ownsFlowControl: bool

    def dataSent(self, size: int) -> None:
        """C{size} bytes given to L{StreamResponder.sendData} left in frames."""


class IStreamConnection(TypingProtocol):
    """What a L{StreamResponder} needs from the connection it is on."""

    h2: H2Connection
    streams: dict[int, StreamResponder]  # the live streams, by id
    connectionId: int
    peerHost: str  # the client's address
    maxMessageBytes: int
    log: Logger | ThrottledLog
    guard: ConnectionGuard | None  # its C{paused} holds responses back

    def flush(self) -> None:
        """Write what h2 queued (at the end of the batch, if in one)."""

    def progress(self) -> None:
        """Response bytes moved: the idle and stream timeouts restart."""

    def streamEnded(self, stream: StreamResponder) -> None:
        """We sent END_STREAM on C{stream}."""

    def forget(self, stream: StreamResponder) -> None:
        """C{stream} is over (reset, or refused by h2): drop it."""

    def owe(self, delta: int, sent: bool) -> None:
        """Response bytes held for the client's window changed by
        C{delta}; C{sent}: some of a stream's held bytes left."""


class StreamResponder:
    """The sending half of one stream, handed to its L{IStreamHandler}.

    Calls after the stream has ended or been reset are ignored, so a handler
    finishing late (e.g. after an upstream answer) never has to check.

    @ivar handler: the stream's handler, set by the connection once built;
        L{None} again if it failed or the request was refused.
    @ivar sizes: the request's gRPC message sizes, checked as they arrive.
    @ivar requestEnded: the client sent END_STREAM.
    """

    def __init__(self, connection: IStreamConnection, streamId: int) -> None:
        self.streamId = streamId
        self._connection = connection
        self.handler: IStreamHandler | None = None
        self._headersSent = False
        self._outbound = bytearray()
        self._owed = 0  # of _outbound, what the connection was told it holds
        self._trailers: Headers | None = None
        self.sizes = MessageSizeGuard(connection.maxMessageBytes)
        self.requestEnded = False
        self.headersSent = False

    def acknowledge(self, size: int) -> None:
        """Return C{size} bytes of request credit (a handler that owns flow
        control calls this once it has forwarded them)."""
        if size > 0:
            self._conn.acknowledge_received_data(size, self.streamId)
            self._connection.flush()

    def sendHeaders(self, headers: Headers, endStream: bool = False) -> None:
        """Send the response headers, ending the stream if C{endStream}."""
        if self._live() and not self._headersSent:
            self._headersSent = self.headersSent = True
            self._send(self._conn.send_headers, headers, end_stream=endStream)
            if endStream:
                self._connection.streamEnded(self)

    def sendData(self, data: bytes) -> None:
        """Queue body bytes; they leave as the peer's windows allow."""
        if self._live() and self._trailers is None:
            self._outbound += data
            self.resumeSending()

    def sendTrailers(self, trailers: Headers) -> None:
        """End the stream with trailers once queued data has been sent."""
        if self._live() and self._trailers is None:
            self._trailers = trailers
            self.resumeSending()

    def trailersOnly(self, status: GRPCStatus, message: str = "") -> None:
        """Answer with a gRPC status alone (Trailers-Only if nothing was sent)."""
        trailers = [(b"grpc-status", b"%d" % status)]
        if message:
            trailers.append((b"grpc-message", encodeGrpcMessage(message)))
        if self._headersSent:
            self.sendTrailers(trailers)
        else:
            head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
            self.sendHeaders(head + trailers, endStream=True)

    def reset(self, errorCode: int = ErrorCodes.CANCEL) -> None:
        """Send RST_STREAM with C{errorCode} and forget the stream."""
        if self._live():
            self._send(self._conn.reset_stream, errorCode)
            self._connection.forget(self)

    def resumeSending(self) -> None:
        """Send what the windows allow, then the trailers once drained;
        nothing while the client does not read (the protocol resumes)."""
        guard = self._connection.guard
        sent = False
        while self._outbound and self._live() and not (guard and guard.paused):
            try:
                window = self._conn.local_flow_control_window(self.streamId)
            except ProtocolError:
                window = 0
            size = min(window, self._conn.max_outbound_frame_size)
            if size <= 0:
                break
            chunk = bytes(self._outbound[:size])
            del self._outbound[:size]
            sent = True
            self._send(self._conn.send_data, chunk)
            handler = self.handler
            if handler is not None and getattr(handler, "ownsFlowControl", False):
                cast(IFlowControlledHandler, handler).dataSent(len(chunk))
        if self._outbound or self._owed:
            self._account(sent)
            if self._outbound:
                return
        if self._trailers is not None and self._live() and not (guard and guard.paused):
            self._send(self._conn.send_headers, self._trailers, end_stream=True)
            self._connection.streamEnded(self)

    def _account(self, sent: bool) -> None:
        """Tell the connection what this stream now holds for the client's
        window (issue 26: it counts against the connection)."""
        if not self._live():
            return
        delta = len(self._outbound) - self._owed
        if delta or (sent and self._owed):
            self._owed = len(self._outbound)
            self._connection.owe(delta, sent)

    def release(self) -> None:
        """The stream is over: what it held will never be sent."""
        self._outbound.clear()
        self._trailers = None
        if self._owed:
            owed, self._owed = self._owed, 0
            self._connection.owe(-owed, False)

    windowOpened = resumeSending  # the connection's windows path (L{H2Hop})

    @property
    def blocked(self) -> bool:
        """Whether response bytes wait for a window."""
        return bool(self._outbound)

    @property
    def pending(self) -> bool:
        """Whether response bytes or trailers wait to be sent."""
        return bool(self._outbound) or self._trailers is not None

    @property
    def connectionId(self) -> int:
        """Which downstream connection this stream is on (a new one after
        an agent restarts)."""
        return self._connection.connectionId

    @property
    def peerHost(self) -> str:
        """The address of the client that opened this stream."""
        return self._connection.peerHost

    @property
    def log(self) -> Logger | ThrottledLog:
        """The connection's log (the listener's shared, rate-limited one)."""
        return self._connection.log

    @property
    def _conn(self) -> H2Connection:
        return self._connection.h2

    def _live(self) -> bool:
        return self._connection.streams.get(self.streamId) is self

    def _send(self, fn: Callable[..., object], *args: object, **kw: object) -> None:
        """Call C{fn(streamId, ...)} on h2 and flush; if h2 refuses (the
        stream or connection is already gone), forget the stream."""
        try:
            fn(self.streamId, *args, **kw)
        except ProtocolError as e:
            self._connection.log.debug("tink.h2.send-refused {error}", error=str(e))
            self._connection.forget(self)
        self._connection.progress()  # response bytes
        self._connection.flush()
