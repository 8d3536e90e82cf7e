"""
The upstream side of the tink proxy: one HTTP/2 client connection to
tink-server (h2c with prior knowledge, or TLS with ALPN h2).

L{UpstreamConnection} opens streams for L{IUpstreamStream}s, sends their
request bytes as the upstream windows allow, and reports response headers,
data, trailers and resets back. A graceful GOAWAY from tink-server (its
restart) lets streams at or below C{last_stream_id} finish and refuses the
others (they were never processed, so clients may retry them); the pool
then sends new streams to a fresh connection.

Flow control (issue 26): every downstream client shares this connection,
so one client that never reads must not hold back the others. The
connection's receive window is large (L{CONNECTION_WINDOW}) and credited
as soon as bytes arrive; a stream's own window (L{STREAM_WINDOW}) is
credited only once its bytes were forwarded downstream. A stream stalled
on its client's window thus holds at most L{STREAM_WINDOW} bytes in
fleetd, and tink-server stops sending on that stream alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol as TypingProtocol

from h2.config import H2Configuration
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    RemoteSettingsChanged,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from h2.exceptions import ProtocolError
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from fleetd.h2.conn import DrainingH2Connection, H2Hop, noDelay, writes
from fleetd.h2.metrics import IProxyMetrics
from fleetd.logs import ThrottledLog

Headers = list[tuple[bytes, bytes]]

# The connection's receive window, credited on arrival: it never fills.
CONNECTION_WINDOW = 16 << 20
# Each stream's receive window, credited once forwarded: what one stalled
# downstream stream may hold in fleetd (h2's default, and grpc-go's).
STREAM_WINDOW = 65535


class IUpstreamStream(TypingProtocol):
    """What an upstream stream reports to its proxy stream."""

    def responseHeaders(self, headers: Headers, ended: bool) -> None:
        """Response headers; C{ended}: a Trailers-Only response."""

    def responseData(self, data: bytes) -> None:
        """Response body bytes; credit goes back via L{UpstreamConnection.ack}."""

    def responseTrailers(self, trailers: Headers) -> None:
        """The trailers, which end the response."""

    def responseReset(self, errorCode: int, refused: bool, lost: bool) -> None:
        """The stream ended without a response end: reset by tink-server
        (C{refused}: never processed), or C{lost} with the connection."""

    @property
    def blocked(self) -> bool:
        """Whether request bytes wait for an upstream window."""

    def windowOpened(self) -> None:
        """Upstream windows opened: send more request bytes."""


class UpstreamConnection(H2Hop[IUpstreamStream]):
    """One client connection to tink-server; see the module docstring."""

    def __init__(
        self,
        log: ThrottledLog,
        onGone: Callable[[UpstreamConnection], None],
        metrics: IProxyMetrics,
        maxHeaderListSize: int = 65536,
    ) -> None:
        self.log = log
        self.metrics = metrics
        self._onGone = onGone
        self.closed: Deferred[None] = Deferred()
        self.streams: dict[int, IUpstreamStream] = {}
        self.usable = False  # until connected; never again after GOAWAY or loss
        self.h2: DrainingH2Connection = DrainingH2Connection(
            H2Configuration(
                client_side=True,
                header_encoding=None,
                # Request headers were validated when the client sent them;
                # tink-server is trusted like fleetd's own configuration, and
                # what it sends reaches the client as it would directly.
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
            )
        )
        self.h2.local_settings.max_header_list_size = maxHeaderListSize
        self.h2.local_settings.enable_push = 0
        self.h2.local_settings.initial_window_size = STREAM_WINDOW
        self.h2.decoder.max_header_list_size = maxHeaderListSize

    # Used by the pool and proxy streams

    def openStream(self, stream: IUpstreamStream, headers: Headers) -> int:
        """Send C{headers} on a new stream; raise L{ProtocolError} if
        this connection cannot take one now."""
        streamId = self.h2.get_next_available_stream_id()
        self.h2.send_headers(streamId, headers)
        self.streams[streamId] = stream
        self.flush()
        return streamId

    def window(self, streamId: int) -> int:
        """How many request bytes may go out on C{streamId} now."""
        try:
            window = self.h2.local_flow_control_window(streamId)
        except ProtocolError:
            return 0
        return min(window, self.h2.max_outbound_frame_size)

    def sendData(self, streamId: int, data: bytes, end: bool = False) -> None:
        """Send C{data} (at most L{window} bytes), ending the request if C{end}."""
        try:
            self.h2.send_data(streamId, data, end_stream=end)
        except ProtocolError as e:
            self.log.debug("tink.upstream.send-refused {error}", error=str(e))
        self.flush()

    def ack(self, streamId: int, size: int) -> None:
        """Give tink-server C{size} bytes of C{streamId}'s credit back (they
        were forwarded); the connection's was given back on arrival."""
        if size > 0:
            self.h2.acknowledgeStream(size, streamId)
            self.flush()

    def reset(self, streamId: int, errorCode: int = ErrorCodes.CANCEL) -> None:
        """The client gave up: reset the upstream stream."""
        if self.streams.pop(streamId, None) is None:
            return
        try:
            self.h2.reset_stream(streamId, errorCode)
        except ProtocolError:
            pass
        self.flush()
        self._maybeClose()

    def drain(self) -> None:
        """Open no new streams here; close once the open ones finished."""
        self.usable = False
        self._maybeClose()

    def abort(self) -> None:
        """Drop the connection now (it did not close in time)."""
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()
        elif self.transport is not None:
            self.transport.loseConnection()

    def activeStreams(self) -> int:
        return len(self.streams)

    # Protocol

    def connectionMade(self) -> None:
        # Twisted leaves Nagle on for client connections: a request's
        # HEADERS and DATA would wait for tink-server's delayed ACK.
        noDelay(self.transport)
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(
            CONNECTION_WINDOW - self.h2.inbound_flow_control_window
        )
        self.flush()
        self.usable = True

    def dataReceived(self, data: bytes) -> None:
        # One write per connection for everything the events below send.
        writes.run(self._received, data)

    def _received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as e:
            self.log.warn("tink.upstream.protocol-error {error}", error=str(e))
            self.metrics.upstreamErrors.labels("protocol").inc()
            self.flushNow()  # the GOAWAY h2 queued, before the close
            self._abandon(ErrorCodes.PROTOCOL_ERROR)
            if self.transport is not None:
                self.transport.loseConnection()
            return
        for event in events:
            self._dispatch(event)
        self.flush()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self.streams:
            self.metrics.upstreamErrors.labels("lost").inc()
            self.log.warn(
                "tink.upstream.lost {streams} streams in flight",
                streams=len(self.streams),
            )
        self._abandon(ErrorCodes.CANCEL)
        self.closed.callback(None)

    def _abandon(self, errorCode: int) -> None:
        self.usable = False
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.responseReset(errorCode, False, True)
        self._onGone(self)

    def _dispatch(self, event: Event) -> None:
        streamId = getattr(event, "stream_id", None) or 0
        stream = self.streams.get(streamId)
        if isinstance(event, ResponseReceived):
            if stream is not None:
                ended = event.stream_ended is not None
                if ended:
                    del self.streams[streamId]
                stream.responseHeaders(event.headers, ended)
        elif isinstance(event, DataReceived):
            # The connection's credit goes back at once, the stream's once
            # forwarded (padding and bytes for a stream gone: at once).
            self.h2.acknowledgeConnection(event.flow_controlled_length)
            if stream is None:
                self.ack(streamId, event.flow_controlled_length)
            else:
                self.ack(streamId, event.flow_controlled_length - len(event.data))
                stream.responseData(event.data)
        elif isinstance(event, TrailersReceived):
            if stream is not None:
                del self.streams[streamId]
                stream.responseTrailers(event.headers)
        elif isinstance(event, StreamEnded):
            # END_STREAM on DATA without trailers: not gRPC, but end it.
            if stream is not None:
                del self.streams[streamId]
                stream.responseTrailers([])
        elif isinstance(event, StreamReset):
            if stream is not None:
                del self.streams[streamId]
                code = event.error_code or 0
                stream.responseReset(code, code == ErrorCodes.REFUSED_STREAM, False)
        elif isinstance(event, WindowUpdated | RemoteSettingsChanged):
            self.windowsOpened(event)
        elif isinstance(event, ConnectionTerminated):
            self._goAway(event)
        self._maybeClose()

    def _goAway(self, event: ConnectionTerminated) -> None:
        """tink-server stops: refuse what it never processed, keep the rest
        (or nothing, if it closed with an error)."""
        self.usable = False
        self._onGone(self)
        self.metrics.upstreamErrors.labels("goaway").inc()
        last = event.last_stream_id or 0
        graceful = event.error_code == ErrorCodes.NO_ERROR
        self.log.info(
            "tink.upstream.goaway {errorCode} {lastStreamId}",
            errorCode=int(event.error_code or 0),
            lastStreamId=last,
        )
        for streamId in sorted(self.streams):
            if streamId > last or not graceful:
                stream = self.streams.pop(streamId)
                refused = streamId > last
                stream.responseReset(
                    ErrorCodes.REFUSED_STREAM if refused else ErrorCodes.CANCEL,
                    refused,
                    not refused,
                )

    def _maybeClose(self) -> None:
        if not self.usable and not self.streams and self.transport is not None:
            if self.h2.state_machine.state.name != "CLOSED":
                try:
                    self.h2.close_connection()
                except ProtocolError:
                    pass
                self.flushNow()
            self.transport.loseConnection()
