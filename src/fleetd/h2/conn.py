"""
An L{H2Connection} that drains on GOAWAY instead of stopping dead.

The ``h2`` package moves a connection to CLOSED as soon as a GOAWAY is sent
or received, after which it refuses to send anything, so streams already
accepted could not finish. HTTP/2 (RFC 9113 section 6.8) says those streams
go on: a graceful GOAWAY only stops new ones. L{DrainingH2Connection} keeps
the connection open for the streams in flight when the GOAWAY carries
NO_ERROR; the protocols built on it stop opening (or accepting) new streams
themselves. A GOAWAY with an error code still closes at once. It can
also credit a connection's receive window apart from its streams' (the
upstream hop's, so one stalled stream never holds the others back).

Also here, for both hops: L{H2Hop}, their one flush and window-update
path; the HPACK memory of L{fleetd.h2.memo}; L{noDelay} (TCP_NODELAY, so a
small frame is not held back by Nagle waiting for the peer's delayed ACK);
and L{writes}, which lets every connection touched while one connection's
bytes are processed write what h2 queued once, at the end, instead of once
per frame (one TLS record and one socket write per connection per batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar
from typing import Protocol as TypingProtocol

import h2.connection
import hpack.hpack
import hpack.table
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import ConnectionTerminated, Event, RemoteSettingsChanged, WindowUpdated
from h2.exceptions import StreamClosedError
from hyperframe.frame import Frame, GoAwayFrame, WindowUpdateFrame
from twisted.internet.protocol import Protocol

from fleetd.h2.memo import remember


class _Silent:
    """A logger that drops everything, without even a level check."""

    def debug(self, *args: object, **kwargs: object) -> None:
        pass


def _quietLibraries() -> None:
    """Stop per-frame and per-header debug work inside the h2 stack.

    hpack logs every integer and header it encodes or decodes through
    C{logging.debug} (about 60 calls per proxied call, each with a level
    check; its lines would also carry header values, which may be secrets
    and must not reach a log), and h2 builds a C{repr} of every received
    frame for a trace line its default logger then drops. Both modules
    look these names up as globals, so shadowing them here is enough.
    """
    hpack.hpack.log = _Silent()  # type: ignore[assignment]
    hpack.table.log = _Silent()  # type: ignore[assignment]
    h2.connection.repr = lambda _: ""  # type: ignore[attr-defined]


_quietLibraries()


class DrainingH2Connection(H2Connection):
    """Graceful GOAWAY both ways and separate window credit (see the module
    docstring), with HPACK work remembered (L{fleetd.h2.memo})."""

    def __init__(self, config: H2Configuration | None = None) -> None:
        super().__init__(config)
        remember(self)

    def goAway(self, lastStreamId: int, debug: bytes = b"") -> None:
        """Queue GOAWAY(NO_ERROR, C{lastStreamId}) and keep serving the
        streams at or below it."""
        frame = GoAwayFrame(
            stream_id=0,
            last_stream_id=lastStreamId,
            error_code=ErrorCodes.NO_ERROR,
            additional_data=debug,
        )
        self._prepare_for_sending([frame])

    def acknowledgeConnection(self, size: int) -> None:
        """Credit C{size} received bytes to the connection's window only
        (h2's C{acknowledge_received_data} credits the stream too)."""
        increment = self._inbound_flow_control_window_manager.process_bytes(size)
        if increment:
            frame = WindowUpdateFrame(0)
            frame.window_increment = increment
            self._prepare_for_sending([frame])

    def acknowledgeStream(self, size: int, streamId: int) -> None:
        """Credit C{size} received bytes to stream C{streamId}'s window
        only (nothing if the stream is gone)."""
        try:
            stream = self._get_stream_by_id(streamId)
        except StreamClosedError:
            return
        if stream.open:
            self._prepare_for_sending(stream.acknowledge_received_data(size))

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Frame], list[Event]]:
        if frame.error_code != ErrorCodes.NO_ERROR:
            result: tuple[list[Frame], list[Event]] = super()._receive_goaway_frame(
                frame
            )
            return result
        event = ConnectionTerminated()
        event.error_code = ErrorCodes.NO_ERROR
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


def noDelay(transport: object) -> bool:
    """Set TCP_NODELAY on C{transport}'s socket, through TLS and other
    wrappers (which pass unknown attributes on to the transport they wrap).
    Returns whether the transport had a socket option to set."""
    setter = getattr(transport, "setTcpNoDelay", None)
    if setter is None:
        return False
    setter(True)
    return True


class WriteBatch:
    """Defers h2 output flushes while a batch of received bytes is processed.

    Inside L{run}, L{defer} records the flush (once per connection) and
    says to skip it; the outermost L{run} runs the recorded flushes when
    it ends, even if processing raised. Outside a batch nothing is deferred.
    One reactor thread, so one instance serves every connection.
    """

    def __init__(self) -> None:
        self._depth = 0
        self._pending: dict[int, Callable[[], None]] = {}

    def defer(self, key: object, flush: Callable[[], None]) -> bool:
        """Inside a batch: remember C{flush} for C{key} and return True."""
        if not self._depth:
            return False
        self._pending.setdefault(id(key), flush)
        return True

    def run(self, work: Callable[[bytes], None], data: bytes) -> None:
        """C{work(data)} as one batch (batches nest); the outermost one runs
        the recorded flushes when it ends, even if C{work} raised."""
        self._depth += 1
        try:
            work(data)
        finally:
            self._depth -= 1
            if not self._depth:
                while self._pending:
                    pending, self._pending = self._pending, {}
                    for flush in pending.values():
                        flush()


writes = WriteBatch()


class IWindowed(TypingProtocol):
    """One stream of an L{H2Hop}, as its windows path sees it."""

    @property
    def blocked(self) -> bool:
        """Whether bytes wait for a flow-control window."""

    def windowOpened(self) -> None:
        """Windows opened: send what they now allow."""


S = TypeVar("S", bound=IWindowed)


class H2Hop(Protocol, Generic[S]):
    """What both hops (the server side and the upstream client side) share:
    writing what h2 queued, and resuming streams when windows open.

    @ivar streams: the live streams, by id.
    """

    h2: H2Connection
    streams: dict[int, S]

    def flush(self) -> None:
        """Write what h2 queued: now, or once the batch ends (L{writes})."""
        if not writes.defer(self, self.flushNow):
            self.flushNow()

    def flushNow(self) -> None:
        """Write what h2 queued, now."""
        data = self.h2.data_to_send()
        if data and self.transport is not None:
            self.writeOut(data)

    def writeOut(self, data: bytes) -> None:
        """Give C{data} to the transport (a hop may hold it instead)."""
        assert self.transport is not None
        self.transport.write(data)

    def windowsOpened(self, event: WindowUpdated | RemoteSettingsChanged) -> None:
        """WINDOW_UPDATE or new SETTINGS: resume the streams waiting for a
        window. A stream's own update wakes only that stream: a peer
        acknowledges often, and many streams may be open."""
        if isinstance(event, WindowUpdated) and event.stream_id:
            stream = self.streams.get(event.stream_id)
            if stream is not None and stream.blocked:
                stream.windowOpened()
        else:
            for each in list(self.streams.values()):
                if each.blocked:
                    each.windowOpened()
