"""HTTP/2 server side of the tink listener, written on the ``h2`` package.

L{H2ServerProtocol} owns one server-side L{H2Connection}, turns its events
into calls on one L{IStreamHandler} per stream and gives each handler a
L{StreamResponder} that sends headers, flow-controlled data and trailers.
gRPC wire details are in L{fleetd.h2.grpcwire}, the abuse reactions in
L{fleetd.h2.calm}, the stall deadlines in L{fleetd.h2.deadlines}; the
listener factory is in L{fleetd.h2.listener}.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    PingReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.config import Limits, TinkSettings
from fleetd.h2.conn import DrainingH2Connection, noDelay, writes
from fleetd.h2.deadlines import TimedProtocol
from fleetd.h2.frames import FrameMeter
from fleetd.h2.grpcwire import GRPCStatus, notGrpc
from fleetd.h2.guard import ConnectionGuard, H2Limits
from fleetd.h2.stream import Headers, IStreamHandler, StreamResponder
from fleetd.logs import ThrottledLog


class H2ServerProtocol(TimedProtocol):
    """
    An HTTP/2 server connection dispatching streams to handlers, within
    the abuse limits of L{fleetd.h2.calm.GuardedProtocol} and the stall
    deadlines of L{TimedProtocol}.

    @ivar log: where its lines go; the listener's factory gives every
        connection one shared L{ThrottledLog}, so a flood of connections or
        streams cannot flood the log.
    """

    log: Logger | ThrottledLog = Logger()
    connectionId = 0  # numbered by the listener's factory
    peerHost = ""  # the client's address, once connected

    def __init__(
        self,
        handlerFactory: Callable[[StreamResponder], IStreamHandler],
        *,
        clock: IReactorTime,
        maxConcurrentStreams: int = TinkSettings.max_concurrent_streams,
        maxHeaderListSize: int = TinkSettings.max_header_list_size,
        maxMessageBytes: int = TinkSettings.max_message_bytes,
        idleTimeout: float = Limits.idle_timeout,
        streamTimeout: float = TinkSettings.stream_timeout,
        handshakeTimeout: float = TinkSettings.handshake_timeout,
        limits: H2Limits | None = None,
    ) -> None:
        self.maxMessageBytes = maxMessageBytes
        self._limits = limits or H2Limits()
        self._closeGrace = self._limits.closeGrace
        self._handlerFactory = handlerFactory
        self._clock = clock
        self._idleTimeout = idleTimeout
        self._streamTimeout = streamTimeout
        self._handshakeTimeout = handshakeTimeout
        self._idleCall: IDelayedCall | None = None
        self._headerCall: IDelayedCall | None = None  # an open header block
        self._headerBlock = 0  # which block (L{FrameMeter.blocks}) it times
        self._windowCall: IDelayedCall | None = None  # answers held
        self._progressAt = 0.0  # when a frame last moved either way
        self.streams: dict[int, StreamResponder] = {}
        self._closing = False
        self._greeted = False  # the client's preface and SETTINGS arrived
        self._moved = False  # request bytes arrived in this batch
        self._lastAccepted: int | None = None  # set by drain(): GOAWAY sent
        self._drained: list[Deferred[None]] = []
        self.h2: H2Connection = DrainingH2Connection(
            H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_inbound_headers=True,
                # Only joins split cookie fields: a proxy forwards them as sent.
                normalize_inbound_headers=False,
                # What goes out was validated on the way in (the client's
                # headers here, tink-server's by the upstream connection):
                # checking again costs a third of a proxied call's CPU.
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        # Replaced before initiate_connection so the limits hold from the
        # first frame rather than once the client ACKs a second SETTINGS.
        self.h2.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: maxConcurrentStreams,
                SettingCodes.MAX_HEADER_LIST_SIZE: maxHeaderListSize,
            },
        )
        self.h2.decoder.max_header_list_size = maxHeaderListSize
        self.meter = FrameMeter(maxHeaderListSize)

    def connectionMade(self) -> None:
        opened = getattr(self.factory, "opened", None)
        if opened is not None:
            opened(self)
        noDelay(self.transport)
        peer = self.transport.getPeer() if self.transport is not None else None
        source = self.peerHost = str(getattr(peer, "host", ""))
        self.guard = ConnectionGuard(self._limits, self._clock, source, self.sources)
        # The source the per-source limits count (rate-limited as all lines).
        self.log.info("tink.connected {source}", source=source)
        self.h2.initiate_connection()
        self.flush()
        self.progress()

    def drain(self) -> Deferred[None]:
        """fleetd stops: send GOAWAY(NO_ERROR) naming the last stream taken,
        let those streams finish, then close. Fires once closed."""
        if self._closing or self.transport is None:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._drained.append(d)
        if self._lastAccepted is None:
            self._lastAccepted = self.h2.highest_inbound_stream_id
            assert isinstance(self.h2, DrainingH2Connection)
            self.h2.goAway(self._lastAccepted)
            self.flush()
            if not self.streams:
                self._close()
        return d

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        self._produce()
        # Every frame is counted before any is parsed (issue 26): past a
        # budget, the rest of what the client sent is dropped unparsed.
        cuts, frames, overBlock = self.meter.read(data)
        if overBlock:
            self._calm("header-block", size=self.meter.blockBytes)
            return
        if self.guard is not None and self.guard.frames(frames):
            self._calm("frame-budget", frames=frames)
            return
        # What the events below make any connection send (this one, and
        # upstream ones) leaves in one write per connection, at the end.
        if cuts:
            writes.run(partial(self._sliced, cuts), data)
        else:
            writes.run(self._received, data)
        self._headerDeadline()

    def _sliced(self, cuts: list[int], data: bytes) -> None:
        """Parse a read a few frames at a time (L{FrameMeter}): a flood
        closed for abuse costs the slices up to its close, not all it sent
        in one read."""
        start = 0
        for end in [*cuts, len(data)]:
            if self._closing:
                return
            self._received(data[start:end])
            start = end

    def _received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as e:
            # h2 has queued GOAWAY with the matching error code, except for
            # a bad preface: then send GOAWAY(PROTOCOL_ERROR) ourselves.
            self.log.warn(
                "tink.h2.protocol-error {error}", error=str(e), peer=self.peer()
            )
            pending = self.h2.data_to_send()
            if not pending:
                pending = GoAwayFrame(error_code=ErrorCodes.PROTOCOL_ERROR).serialize()
            if self.transport is not None:
                self.transport.write(pending)
            self._close()
            return
        self._moved = False
        for event in events:
            if self._closing:
                break
            self._dispatch(event)
        self.flush()
        if self._moved:
            self.progress()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._closing = True
        self._cancelIdleTimer()
        self._stopCutOff()
        closed = getattr(self.factory, "closed", None)
        if closed is not None:
            closed(self)
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self._call(stream, "reset", ErrorCodes.CANCEL)
        drained, self._drained = self._drained, []
        for d in drained:
            d.callback(None)

    def _dispatch(self, event: Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0))
        if isinstance(event, RequestReceived):
            self._moved = True  # progress: request bytes, not control frames
            self._requestReceived(event.stream_id, event.headers)
        elif isinstance(event, DataReceived):
            self._moved = self._moved or bool(event.data)
            credit = event.flow_controlled_length
            if stream is not None and stream.handler is not None:
                if getattr(stream.handler, "ownsFlowControl", False):
                    # Padding goes back now; the data once it was forwarded.
                    credit -= len(event.data)
                self._dataReceived(stream, event.data)
            # Credit goes back even for streams already answered, so a
            # client still sending a body is never stalled.
            if credit:
                self.h2.acknowledge_received_data(credit, event.stream_id)
        elif isinstance(event, StreamEnded) and stream is not None:
            self._moved = True
            stream.requestEnded = True
            self._call(stream, "endReceived")
            if stream.sizes.partial or not stream.sizes.messages:
                self._waste("incomplete")
        elif isinstance(event, StreamReset) and stream is not None:
            self.forget(stream)
            self._call(stream, "reset", event.error_code or 0)
            self._waste("reset")
        elif isinstance(event, PingReceived):
            self._controlFrame()
        elif isinstance(event, WindowUpdated | RemoteSettingsChanged):
            if isinstance(event, RemoteSettingsChanged):
                self._controlFrame()
            self._moved = self._moved or not self._greeted
            self._greeted = True
            self.windowsOpened(event)
        elif isinstance(event, ConnectionTerminated):
            self.log.info(
                "tink.h2.goaway-received {errorCode}",
                errorCode=event.error_code,
                peer=self.peer(),
            )
            self._close()
        # PING is ACKed by h2 itself; other events need nothing.

    def _requestReceived(self, streamId: int, headers: Headers) -> None:
        if self._lastAccepted is not None and streamId > self._lastAccepted:
            # After our GOAWAY: not processed, so the client may retry it.
            self.h2.reset_stream(streamId, ErrorCodes.REFUSED_STREAM)
            return
        if self.guard is not None and not self.guard.allowStream():
            # Over the source's rate: not processed, the client may retry.
            self.h2.reset_stream(streamId, ErrorCodes.REFUSED_STREAM)
            self._waste("source")
            return
        stream = self.streams[streamId] = StreamResponder(self, streamId)
        fields = dict(headers)
        method = fields.get(b":method", b"")
        contentType = fields.get(b"content-type", b"")
        refusal = notGrpc(method, contentType)
        if refusal is not None:
            self.log.warn(
                "tink.h2.not-grpc {method} {contentType}",
                method=method.decode("ascii", "replace"),
                contentType=contentType.decode("ascii", "replace"),
                peer=self.peer(),
            )
            stream.sendHeaders(refusal, endStream=True)
            self._waste("refused")
            return
        try:
            stream.handler = self._handlerFactory(stream)
        except Exception:
            self.log.failure("tink.h2.handler-failed", streamId=streamId)
            stream.reset(ErrorCodes.INTERNAL_ERROR)
            return
        self._call(stream, "headersReceived", headers)

    def _dataReceived(self, stream: StreamResponder, data: bytes) -> None:
        tooLarge = stream.sizes.feed(data)
        if tooLarge is None:
            self._call(stream, "dataReceived", data)
            return
        self.log.warn(
            "tink.h2.message-too-large {size} {limit}",
            size=tooLarge,
            limit=self.maxMessageBytes,
            peer=self.peer(),
        )
        stream.trailersOnly(
            GRPCStatus.RESOURCE_EXHAUSTED,
            f"grpc: received message larger than max "
            f"({tooLarge} vs. {self.maxMessageBytes})",
        )
        self._call(stream, "reset", ErrorCodes.CANCEL)
        stream.handler = None
        self._waste("refused")

    def _call(self, stream: StreamResponder, name: str, *args: object) -> None:
        """Deliver one event to the stream's handler; a handler that raises
        is a bug: log it and reset its stream."""
        if stream.handler is None:
            return
        try:
            getattr(stream.handler, name)(*args)
        except Exception:
            self.log.failure(
                "tink.h2.handler-failed", streamId=stream.streamId, call=name
            )
            stream.handler = None
            stream.reset(ErrorCodes.INTERNAL_ERROR)

    def streamEnded(self, stream: StreamResponder) -> None:
        """We sent END_STREAM: forget the stream, resetting an unfinished
        request with NO_ERROR as gRPC asks (and grpc-go does)."""
        h2stream = self.h2.streams.get(stream.streamId)
        if h2stream is not None and not h2stream.closed:
            stream.reset(ErrorCodes.NO_ERROR)
        elif stream.requestEnded and stream.sizes.messages and self.guard:
            self.guard.completed()
        self.forget(stream)

    def forget(self, stream: StreamResponder) -> None:
        """C{stream} is over: drop it and what it still held for the
        client (and close, if draining and it was the last). Not progress:
        a stream the client resets moves no request or response bytes."""
        if self.streams.get(stream.streamId) is stream:
            del self.streams[stream.streamId]
            stream.release()
            if self._lastAccepted is not None and not self.streams:
                self._close()  # drained after our GOAWAY

    def _close(self) -> None:
        self._closing = True
        self._cancelIdleTimer()
        self.flushNow()  # before the close, batch or not
        if self._release():
            self._closeSoon()

    def peer(self) -> str:
        return str(self.transport.getPeer()) if self.transport is not None else "?"
