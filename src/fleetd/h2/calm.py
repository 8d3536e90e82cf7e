"""
How the tink listener's HTTP/2 connections act on their abuse limits
(issue 17; the limits themselves are L{fleetd.h2.guard}).

L{GuardedProtocol} is the base of L{fleetd.h2.server.H2ServerProtocol}
(through L{fleetd.h2.deadlines.TimedProtocol}): it counts wasted streams
and control frames against the connection's L{ConnectionGuard} and
answers GOAWAY(ENHANCE_YOUR_CALM) past them; it is the transport's
streaming producer, so while the transport's write buffer is full it
stops reading and holds what it would write, and it aborts a connection
whose held replies pass the bound.
"""

from __future__ import annotations

from collections.abc import Callable

from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from fleetd.h2.conn import H2Hop
from fleetd.h2.guard import ConnectionGuard, SourceStreams
from fleetd.h2.stream import StreamResponder
from fleetd.logs import ThrottledLog


class GuardedProtocol(H2Hop[StreamResponder]):
    """
    The abuse reactions of an HTTP/2 server connection (see the module
    docstring); the subclass supplies the connection itself.

    @ivar sources: the listener's new-streams-per-source limit, if any.
    @ivar countAbuse: counts abuse by kind (L{IProxyMetrics.abuse}), if set.
    @ivar guard: this connection's budgets, from C{connectionMade} on. The
        protocol becomes the transport's producer with the client's first
        bytes (after the TLS handshake, which must not wait for a paused
        reader).
    """

    log: Logger | ThrottledLog
    _closing: bool
    _clock: IReactorTime
    _closeGrace = 1.0
    _cutOff: IDelayedCall | None = None
    _calmed = False  # GOAWAY(ENHANCE_YOUR_CALM) was sent
    sources: SourceStreams | None = None
    countAbuse: Callable[[str], None] | None = None
    guard: ConnectionGuard | None = None
    _producing = False
    _aborted = False

    # What the subclass provides.

    def _close(self) -> None:
        raise NotImplementedError

    def _call(self, stream: StreamResponder, name: str, *args: object) -> None:
        raise NotImplementedError

    def _cancelIdleTimer(self) -> None:
        raise NotImplementedError

    def peer(self) -> str:
        raise NotImplementedError

    # IPushProducer, for the transport

    def _produce(self) -> None:
        """Become the transport's streaming producer (once)."""
        if not self._producing and self.transport is not None:
            self._producing = True
            self.transport.registerProducer(self, True)  # type: ignore[attr-defined]

    def pauseProducing(self) -> None:
        """The transport's write buffer is full: stop reading until the
        client reads what was written."""
        guard = self.guard
        if guard is None or guard.paused or self._closing or self.transport is None:
            return
        guard.paused = True
        self._count("paused")
        self.transport.pauseProducing()  # type: ignore[attr-defined]

    def resumeProducing(self) -> None:
        """The write buffer drained: write what was held, read again."""
        guard = self.guard
        if guard is None or not guard.paused:
            return
        held = guard.release()
        if self._closing or self.transport is None:
            return
        self.transport.resumeProducing()  # type: ignore[attr-defined]
        if held:
            self.transport.write(held)
        for stream in list(self.streams.values()):
            if stream.pending:
                stream.resumeSending()
        self.flush()

    def stopProducing(self) -> None:
        """The transport goes away; C{connectionLost} follows."""

    # Writing, closing

    def writeOut(self, data: bytes) -> None:
        """Write C{data}, or hold it while paused; too much held aborts
        (and nothing is written once aborted)."""
        if self._aborted:
            return
        guard = self.guard
        if guard is None or not guard.paused:
            assert self.transport is not None
            self.transport.write(data)
        elif guard.hold(data):
            # The client reads nothing, yet its frames keep asking for replies.
            self._count("unread")
            self.log.warn(
                "tink.h2.unread-replies {held}", held=len(guard.held), peer=self.peer()
            )
            self._abort()
            self._penalize()

    def _release(self) -> bool:
        """Before a close: whether the transport may close gracefully (it
        is aborted instead while paused: a client that does not read would
        hold it open)."""
        transport = self.transport
        if transport is None or self._aborted:
            return False
        if self.guard is not None and self.guard.paused:
            self._abort()
            return False
        if self._producing:
            self._producing = False
            # TLS shuts down only once no producer is registered.
            transport.unregisterProducer()  # type: ignore[attr-defined]
        return True

    def _abort(self) -> None:
        self._closing = self._aborted = True
        self._cancelIdleTimer()
        self._stopCutOff()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self._call(stream, "reset", ErrorCodes.CANCEL)
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()

    # Budgets

    def _count(self, kind: str) -> None:
        if self.countAbuse is not None:
            self.countAbuse(kind)

    def _waste(self, kind: str) -> None:
        """A wasted stream (L{fleetd.h2.guard}); past the budget, calm."""
        self._count(kind)
        guard = self.guard
        if guard is not None and guard.waste() and not self._closing:
            self._calm("stream-budget", wasted=guard.wasted)

    def _controlFrame(self) -> None:
        guard = self.guard
        if guard is not None and guard.controlFrame() and not self._closing:
            self._calm("control-frames")

    def _calm(self, reason: str, **fields: object) -> None:
        """GOAWAY(ENHANCE_YOUR_CALM), abandon the streams, close."""
        self._count(reason)
        self.log.warn(
            "tink.h2.enhance-your-calm {reason}",
            reason=reason,
            peer=self.peer(),
            **fields,
        )
        self._abandon(ErrorCodes.ENHANCE_YOUR_CALM)
        self._calmed = True
        self._close()
        self._penalize()

    def _penalize(self) -> None:
        """Keep this connection's source away for a while (see
        L{SourceStreams.penalize})."""
        if self.sources is None or self.guard is None:
            return
        seconds = self.sources.penalize(self.guard.source)
        self._count("penalty")
        self.log.warn(
            "tink.h2.source-penalized {source} {seconds}",
            source=self.guard.source,
            seconds=seconds,
        )

    def _closeSoon(self) -> None:
        """Close the transport, and cut it off if it is not gone after
        C{closeGrace}: a TLS close waits for the client's close_notify,
        reading (and decrypting) all the client still sends meanwhile, so
        a client that keeps sending would hold the connection open. After
        GOAWAY(ENHANCE_YOUR_CALM) nothing more is read at all; after a
        graceful close reading goes on, so a client that closes in turn
        (as gRPC clients do on GOAWAY) ends the connection cleanly."""
        transport = self.transport
        if transport is None:
            return
        if self._calmed:
            transport.pauseProducing()  # type: ignore[attr-defined]
        self._cutOff = self._clock.callLater(self._closeGrace, self._abort)
        transport.loseConnection()

    def _stopCutOff(self) -> None:
        """The connection is gone: no cut-off timer outlives it."""
        if self._cutOff is not None and self._cutOff.active():
            self._cutOff.cancel()
        self._cutOff = None

    def _abandon(self, code: int) -> None:
        """Send GOAWAY(C{code}) and reset every stream's handler."""
        try:
            self.h2.close_connection(code)
        except ProtocolError:
            pass
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self._call(stream, "reset", ErrorCodes.CANCEL)
