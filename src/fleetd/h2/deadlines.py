"""
The deadlines past which a client's own stalls close an HTTP/2 server
connection of the tink listener (the connection itself is
L{fleetd.h2.server.H2ServerProtocol}).

L{TimedProtocol} keeps three: the handshake, idle or stream timeout (one
timer, armed for the shortest that could apply, checking the time of the
last progress when it fires), an open header block's deadline, and the
time answers may wait for the client's window. Past one, the connection
is closed (calmly, or with GOAWAY(ENHANCE_YOUR_CALM) for a stall that
looks like abuse, L{fleetd.h2.calm}).
"""

from __future__ import annotations

from h2.errors import ErrorCodes
from twisted.internet.interfaces import IDelayedCall

from fleetd.h2.calm import GuardedProtocol
from fleetd.h2.frames import FrameMeter
from fleetd.h2.guard import H2Limits


class TimedProtocol(GuardedProtocol):
    """
    The stall deadlines of an HTTP/2 server connection (see the module
    docstring); the subclass sets the timers' state in its C{__init__}
    and calls L{progress} when a frame moves.
    """

    _limits: H2Limits
    meter: FrameMeter
    _idleTimeout: float
    _streamTimeout: float
    _handshakeTimeout: float
    _idleCall: IDelayedCall | None
    _headerCall: IDelayedCall | None  # an open header block
    _headerBlock: int  # which block (L{FrameMeter.blocks}) it times
    _windowCall: IDelayedCall | None  # answers held
    _progressAt: float  # when a frame last moved either way
    _greeted: bool  # the client's preface and SETTINGS arrived

    def owe(self, delta: int, sent: bool) -> None:
        """Response bytes held for the client's window (or its unread
        socket) changed by C{delta}; C{sent}: some of a stalled stream's
        left. Too many, or none leaving for C{windowTimeout}: calm."""
        guard = self.guard
        if guard is None or self._closing:
            return
        if guard.owe(delta, sent):
            self._calm("window-held", owed=guard.owed)
        elif guard.owed > 0 and self._windowCall is None:
            self._windowCall = self._clock.callLater(
                self._limits.windowTimeout, self._windowCheck
            )

    def _windowCheck(self) -> None:
        self._windowCall = None
        left = self.guard.windowLeft() if self.guard is not None else None
        if left is None or self._closing:
            return
        if left > 0:
            self._windowCall = self._clock.callLater(left, self._windowCheck)
            return
        self._calm("window-timeout", owed=self.guard.owed if self.guard else 0)

    def _headerDeadline(self) -> None:
        """Time an open header block (HEADERS without END_HEADERS yet)."""
        meter = self.meter
        if not meter.inBlock or self._closing:
            if self._headerCall is not None:
                self._headerCall.cancel()
                self._headerCall = None
        elif self._headerCall is None or self._headerBlock != meter.blocks:
            if self._headerCall is not None:
                self._headerCall.cancel()
            self._headerBlock = meter.blocks
            self._headerCall = self._clock.callLater(
                self._limits.headerTimeout, self._headerTimedOut
            )

    def _headerTimedOut(self) -> None:
        self._headerCall = None
        if self.meter.inBlock and not self._closing:
            self._calm("header-timeout", size=self.meter.blockBytes)

    def _idleCheck(self) -> None:
        """The timer fired: time out if nothing moved for the timeout that
        applies now, else look again when it could (see L{progress})."""
        self._idleCall = None
        left = self._progressAt + self._timeout() - self._clock.seconds()
        if left > 0:
            self._idleCall = self._clock.callLater(
                min(left, self._shortest()), self._idleCheck
            )
            return
        self._idleTimedOut()

    def _idleTimedOut(self) -> None:
        timeout = self._timeout()
        if not self._greeted:
            event = "tink.h2.handshake-timeout {timeout}"
        elif self.streams:
            event = "tink.h2.stream-timeout {timeout}"
        else:
            event = "tink.h2.idle-timeout {timeout}"
        self.log.info(event, timeout=timeout, peer=self.peer())
        # Streams that made no progress for this long are abandoned: tell
        # the client nothing past the last one was (or will be) processed.
        code = ErrorCodes.NO_ERROR if not self.streams else ErrorCodes.CANCEL
        self._abandon(code)
        self._close()

    def _timeout(self) -> float:
        if not self._greeted:
            return min(self._handshakeTimeout, self._idleTimeout)
        return self._streamTimeout if self.streams else self._idleTimeout

    def _shortest(self) -> float:
        """The shortest timeout that could apply before the timer fires."""
        return min(self._timeout(), self._idleTimeout)

    def progress(self) -> None:
        """Progress: the handshake, idle (no streams) or stream (streams
        open, no frame either way) timeout, whichever applies, counts from
        now. Only the time is noted (this runs several times a call); the
        one timer, armed for the shortest timeout that could apply, checks
        it when it fires."""
        if self._closing:
            self._cancelIdleTimer()
            return
        self._progressAt = self._clock.seconds()
        if self._idleCall is None:
            self._idleCall = self._clock.callLater(self._shortest(), self._idleCheck)

    def _cancelIdleTimer(self) -> None:
        """Closing: stop the idle timer and the header and window
        deadlines."""
        for name in ("_idleCall", "_headerCall", "_windowCall"):
            call = getattr(self, name)
            if call is not None:
                call.cancel()
                setattr(self, name, None)
