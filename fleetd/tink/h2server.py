"""HTTP/2 server side of the tink listener, written on the ``h2`` package.

L{H2ServerProtocol} owns one server-side L{H2Connection}, turns its events
into calls on one L{IStreamHandler} per stream and gives each handler a
L{StreamResponder} that sends headers, flow-controlled data and trailers.
Until the gRPC proxy lands, L{TinkListenerFactory} answers every call with a
Trailers-Only UNIMPLEMENTED response ([A4]).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import ParamSpec, TypeVar
from typing import Protocol as TypingProtocol

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes, Settings
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

Headers = list[tuple[bytes, bytes]]
_P = ParamSpec("_P")
_R = TypeVar("_R")


class GRPCStatus(enum.IntEnum):
    """gRPC status codes (grpc/grpc ``doc/statuscodes.md``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def encodeGrpcMessage(message: str) -> bytes:
    """Percent-encode C{message} for ``grpc-message`` (gRPC PROTOCOL-HTTP2).

    UTF-8 bytes outside printable ASCII, and ``%`` itself, become ``%XX``.
    """
    return b"".join(
        bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
        for b in message.encode("utf-8")
    )


class MessageSizeGuard:
    """Follow gRPC length-prefixed message boundaries in a request body.

    Frame boundaries are unrelated to message boundaries, so the 5-byte
    prefixes (flag, 4-byte big-endian length) are tracked across calls.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._prefix = bytearray()
        self._remaining = 0

    def feed(self, data: bytes) -> int | None:
        """Return the first declared length over the limit, else L{None}."""
        offset, end = 0, len(data)
        while offset < end:
            if self._remaining:
                step = min(self._remaining, end - offset)
                self._remaining -= step
                offset += step
                continue
            need = 5 - len(self._prefix)
            self._prefix += data[offset : offset + need]
            offset += need
            if len(self._prefix) == 5:
                length = int.from_bytes(self._prefix[1:], "big")
                self._prefix.clear()
                if length > self._limit:
                    return length
                self._remaining = length
        return None


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


class _Stream:
    """Per-stream state kept by L{H2ServerProtocol}."""

    def __init__(self, streamId: int, maxMessageBytes: int) -> None:
        self.streamId = streamId
        self.handler: IStreamHandler | None = None
        self.headersSent = False
        self.outbound = bytearray()
        self.trailers: Headers | None = None
        self.guard = MessageSizeGuard(maxMessageBytes)


class StreamResponder:
    """The sending half of one stream, handed to its L{IStreamHandler}.

    Calls after the stream has ended or been reset are ignored.
    """

    def __init__(self, protocol: H2ServerProtocol, streamId: int) -> None:
        self._protocol = protocol
        self.streamId = streamId

    def sendHeaders(self, headers: Headers, endStream: bool = False) -> None:
        """Send the response headers, ending the stream if C{endStream}."""
        self._protocol._sendHeaders(self.streamId, headers, endStream)

    def sendData(self, data: bytes) -> None:
        """Queue body bytes; they leave as the peer's windows allow."""
        self._protocol._sendData(self.streamId, data)

    def sendTrailers(self, trailers: Headers) -> None:
        """End the stream with trailers once queued data has been sent."""
        self._protocol._sendTrailers(self.streamId, trailers)

    def trailersOnly(self, status: GRPCStatus, message: str = "") -> None:
        """Answer with a gRPC status alone (Trailers-Only if nothing was sent)."""
        trailers = [(b"grpc-status", b"%d" % status)]
        if message:
            trailers.append((b"grpc-message", encodeGrpcMessage(message)))
        if self._protocol._headersSent(self.streamId):
            self.sendTrailers(trailers)
        else:
            head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
            self.sendHeaders(head + trailers, endStream=True)

    def reset(self, errorCode: int = ErrorCodes.CANCEL) -> None:
        """Send RST_STREAM with C{errorCode}."""
        self._protocol._resetStream(self.streamId, errorCode)


class H2ServerProtocol(Protocol):
    """An HTTP/2 server connection dispatching streams to handlers."""

    log = Logger()

    def __init__(
        self,
        handlerFactory: Callable[[StreamResponder], IStreamHandler],
        *,
        clock: IReactorTime,
        maxConcurrentStreams: int = 100,
        maxHeaderListSize: int = 16384,
        maxMessageBytes: int = 4 * 1024 * 1024,
        idleTimeout: float = 30.0,
    ) -> None:
        self._handlerFactory = handlerFactory
        self._clock = clock
        self._maxMessageBytes = maxMessageBytes
        self._idleTimeout = idleTimeout
        self._idleCall: IDelayedCall | None = None
        self._streams: dict[int, _Stream] = {}
        self._closing = False
        config = H2Configuration(
            client_side=False, header_encoding=None, validate_inbound_headers=True
        )
        self._conn = H2Connection(config=config)
        # Replaced before initiate_connection so the limits hold from the
        # first frame instead of after the client ACKs a second SETTINGS.
        self._conn.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: maxConcurrentStreams,
                SettingCodes.MAX_HEADER_LIST_SIZE: maxHeaderListSize,
            },
        )
        self._conn.decoder.max_header_list_size = maxHeaderListSize

    # Twisted side

    def connectionMade(self) -> None:
        self._conn.initiate_connection()
        self._flush()
        self._updateIdleTimer()

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            events = self._conn.receive_data(data)
        except ProtocolError as e:
            self.log.warn(
                "tink.h2.protocol-error {error}", error=str(e), peer=self._peer()
            )
            self._close()
            return
        for event in events:
            if self._closing:
                break
            self._dispatch(event)
        self._flush()
        self._updateIdleTimer()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._closing = True
        self._cancelIdleTimer()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            self._callHandler(stream, "reset", ErrorCodes.CANCEL)

    # h2 events

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, RequestReceived):
            self._requestReceived(event.stream_id, event.headers)  # type: ignore[arg-type]
        elif isinstance(event, DataReceived):
            self._dataReceived(event)
        elif isinstance(event, StreamEnded):
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                self._callHandler(stream, "endReceived")
        elif isinstance(event, StreamReset):
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None:
                self._callHandler(stream, "reset", event.error_code or 0)
        elif isinstance(event, WindowUpdated | RemoteSettingsChanged):
            for stream in list(self._streams.values()):
                self._flushStream(stream)
        elif isinstance(event, ConnectionTerminated):
            self.log.info(
                "tink.h2.goaway-received {errorCode}",
                errorCode=event.error_code,
                peer=self._peer(),
            )
            self._close()
        # PING is ACKed by h2 itself; other events need nothing.

    def _requestReceived(self, streamId: int, headers: Headers) -> None:
        stream = self._streams[streamId] = _Stream(streamId, self._maxMessageBytes)
        fields = dict(headers)
        method = fields.get(b":method", b"")
        contentType = fields.get(b"content-type", b"")
        if method != b"POST" or not contentType.startswith(b"application/grpc"):
            self.log.warn(
                "tink.h2.not-grpc {method} {contentType}",
                method=method.decode("ascii", "replace"),
                contentType=contentType.decode("ascii", "replace"),
                peer=self._peer(),
            )
            status, code, text = (
                (b"405", GRPCStatus.INTERNAL, "method must be POST")
                if method != b"POST"
                else (b"415", GRPCStatus.INVALID_ARGUMENT, "content-type not gRPC")
            )
            self._sendHeaders(
                streamId,
                [
                    (b":status", status),
                    (b"content-type", b"application/grpc"),
                    (b"grpc-status", b"%d" % code),
                    (b"grpc-message", encodeGrpcMessage(text)),
                ],
                endStream=True,
            )
            return
        responder = StreamResponder(self, streamId)
        try:
            stream.handler = self._handlerFactory(responder)
        except Exception:
            self.log.failure("tink.h2.handler-failed", streamId=streamId)
            self._resetStream(streamId, ErrorCodes.INTERNAL_ERROR)
            return
        self._callHandler(stream, "headersReceived", headers)

    def _dataReceived(self, event: DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is not None:
            tooLarge = stream.guard.feed(event.data)
            if tooLarge is not None:
                self.log.warn(
                    "tink.h2.message-too-large {size} {limit}",
                    size=tooLarge,
                    limit=self._maxMessageBytes,
                    peer=self._peer(),
                )
                StreamResponder(self, stream.streamId).trailersOnly(
                    GRPCStatus.RESOURCE_EXHAUSTED,
                    f"grpc: received message larger than max "
                    f"({tooLarge} vs. {self._maxMessageBytes})",
                )
                self._callHandler(stream, "reset", ErrorCodes.CANCEL)
            else:
                self._callHandler(stream, "dataReceived", event.data)
        # Credit is returned even for streams already answered, so a client
        # still sending a body is never stalled.
        self._guarded(
            self._conn.acknowledge_received_data,
            event.flow_controlled_length,
            event.stream_id,
        )

    def _callHandler(self, stream: _Stream, name: str, *args: object) -> None:
        if stream.handler is None:
            return
        try:
            getattr(stream.handler, name)(*args)
        except Exception:
            self.log.failure(
                "tink.h2.handler-failed", streamId=stream.streamId, call=name
            )
            stream.handler = None
            self._resetStream(stream.streamId, ErrorCodes.INTERNAL_ERROR)

    # Sending, used by StreamResponder

    def _headersSent(self, streamId: int) -> bool:
        stream = self._streams.get(streamId)
        return stream is not None and stream.headersSent

    def _sendHeaders(self, streamId: int, headers: Headers, endStream: bool) -> None:
        stream = self._streams.get(streamId)
        if stream is None or stream.headersSent:
            return
        stream.headersSent = True
        if self._guarded(
            self._conn.send_headers, streamId, headers, end_stream=endStream
        ):
            if endStream:
                self._ended(stream)
            self._flush()

    def _sendData(self, streamId: int, data: bytes) -> None:
        stream = self._streams.get(streamId)
        if stream is None or stream.trailers is not None:
            return
        stream.outbound += data
        self._flushStream(stream)
        self._flush()

    def _sendTrailers(self, streamId: int, trailers: Headers) -> None:
        stream = self._streams.get(streamId)
        if stream is None or stream.trailers is not None:
            return
        stream.trailers = trailers
        self._flushStream(stream)
        self._flush()

    def _resetStream(self, streamId: int, errorCode: int) -> None:
        if self._streams.pop(streamId, None) is not None:
            self._guarded(self._conn.reset_stream, streamId, errorCode)
            self._flush()
            self._updateIdleTimer()

    def _flushStream(self, stream: _Stream) -> None:
        """Send what the windows allow, then any trailers once drained."""
        sid = stream.streamId
        while stream.outbound:
            window = self._guarded(self._conn.local_flow_control_window, sid)
            size = min(window or 0, self._conn.max_outbound_frame_size)
            if size <= 0:
                return
            chunk = bytes(stream.outbound[:size])
            del stream.outbound[:size]
            if not self._guarded(self._conn.send_data, sid, chunk):
                return
        if stream.trailers is not None and self._streams.get(sid) is stream:
            if self._guarded(
                self._conn.send_headers, sid, stream.trailers, end_stream=True
            ):
                self._ended(stream)

    def _ended(self, stream: _Stream) -> None:
        """We sent END_STREAM: forget the stream, resetting an unfinished body.

        A server that answers before the client's END_STREAM follows with
        RST_STREAM(NO_ERROR) (gRPC PROTOCOL-HTTP2), as grpc-go does.
        """
        self._streams.pop(stream.streamId, None)
        h2stream = self._conn.streams.get(stream.streamId)
        if h2stream is not None and not h2stream.closed:
            self._guarded(self._conn.reset_stream, stream.streamId, ErrorCodes.NO_ERROR)
        self._updateIdleTimer()

    def _guarded(
        self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
    ) -> _R | None:
        """Call into h2, turning a refused send on a dead stream into L{None}."""
        try:
            return fn(*args, **kwargs)
        except ProtocolError as e:
            self.log.debug("tink.h2.send-refused {error}", error=str(e))
            return None

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    # Lifecycle

    def _close(self) -> None:
        """Flush (h2 queues GOAWAY on its own errors) and drop the connection."""
        self._closing = True
        self._cancelIdleTimer()
        self._flush()
        if self.transport is not None:
            self.transport.loseConnection()

    def _idleTimedOut(self) -> None:
        self._idleCall = None
        self.log.info(
            "tink.h2.idle-timeout {timeout}",
            timeout=self._idleTimeout,
            peer=self._peer(),
        )
        self._guarded(self._conn.close_connection, ErrorCodes.NO_ERROR)
        self._close()

    def _updateIdleTimer(self) -> None:
        if self._streams or self._closing:
            self._cancelIdleTimer()
        elif self._idleCall is not None and self._idleCall.active():
            self._idleCall.reset(self._idleTimeout)
        else:
            self._idleCall = self._clock.callLater(
                self._idleTimeout, self._idleTimedOut
            )

    def _cancelIdleTimer(self) -> None:
        if self._idleCall is not None and self._idleCall.active():
            self._idleCall.cancel()
        self._idleCall = None

    def _peer(self) -> str:
        peer: IAddress | None = (
            self.transport.getPeer() if self.transport is not None else None
        )
        return str(peer)


class UnimplementedHandler:
    """Answer every call at once with Trailers-Only UNIMPLEMENTED ([A4]).

    The request body needs no waiting: the protocol returns flow-control
    credit for bytes still arriving and resets the unfinished request with
    NO_ERROR, so clients see the status immediately and never stall.
    """

    log = Logger()

    def __init__(self, responder: StreamResponder) -> None:
        self._responder = responder

    def headersReceived(self, headers: Headers) -> None:
        path = dict(headers).get(b":path", b"").decode("ascii", "replace")
        self.log.info("tink.unimplemented {path}", path=path)
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
    """Build L{H2ServerProtocol}s that answer UNIMPLEMENTED, with limits."""

    def __init__(
        self,
        clock: IReactorTime,
        *,
        maxConcurrentStreams: int = 100,
        maxHeaderListSize: int = 16384,
        maxMessageBytes: int = 4 * 1024 * 1024,
        idleTimeout: float = 30.0,
    ) -> None:
        self.clock = clock
        self.maxConcurrentStreams = maxConcurrentStreams
        self.maxHeaderListSize = maxHeaderListSize
        self.maxMessageBytes = maxMessageBytes
        self.idleTimeout = idleTimeout

    def buildProtocol(self, addr: IAddress) -> H2ServerProtocol:
        protocol = H2ServerProtocol(
            UnimplementedHandler,
            clock=self.clock,
            maxConcurrentStreams=self.maxConcurrentStreams,
            maxHeaderListSize=self.maxHeaderListSize,
            maxMessageBytes=self.maxMessageBytes,
            idleTimeout=self.idleTimeout,
        )
        protocol.factory = self
        return protocol
