"""
Connection policy for fleetd's stream listeners.

Every stream listener is wrapped in L{LimitedFactory}, which caps
concurrent connections (in total and per source, L{fleetd.sources}: an
IPv6 /64 counting as one source) and closes connections idle (no byte in
or out) for too long, TLS handshakes included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.protocols import policies
from twisted.python.failure import Failure
from zope.interface import directlyProvides, providedBy

from fleetd.logs import ThrottledLog
from fleetd.sources import sourceKey


def connectionSource(addr: IAddress | None) -> str:
    """
    The key under which a connection from C{addr} counts against the
    per-source cap: the IPv4 address, or the IPv6 /64 (an IPv4-mapped IPv6
    address counts as its IPv4 address).
    """
    return sourceKey(str(getattr(addr, "host", "")))


_PROVIDES: dict[tuple[type, Any], Any] = {}


def provideLike(wrapper: Any, transport: Any) -> None:
    """Declare that C{wrapper} provides what C{transport} provides, as
    Twisted's wrappers do, with the declaration built once per wrapper
    class and kind of transport instead of on every connection (zope's
    declarations are shared objects by design)."""
    key = (type(wrapper), providedBy(transport))
    provides = _PROVIDES.get(key)
    if provides is None:
        directlyProvides(wrapper, key[1])
        _PROVIDES[key] = getattr(wrapper, "__provides__")  # noqa: B009
    else:
        wrapper.__provides__ = provides


class LimitedProtocol(policies.ProtocolWrapper):
    """
    Counts towards its factory's limits and stamps the time of every byte
    in or out; the factory's idle sweep drops it after C{idleTimeout}
    seconds without one. The hot path costs an attribute store, and a
    connection no timer of its own.

    It sits right above the socket's transport (below TLS), so it also
    counts the bytes handed to that transport (C{bytesWritten}) and tells
    whoever asks (L{whenLost}) when the socket is gone: the transport's
    buffers then hold exactly what never reached the kernel.
    """

    factory: LimitedFactory
    _lost = False
    _aborted = False
    _active = 0.0
    _onLost: list[Callable[[], None]] | None = None
    bytesWritten = 0

    def whenLost(self, callback: Callable[[], None]) -> None:
        """Call C{callback} once the connection is lost (at once if it is)."""
        if self._lost:
            callback()
            return
        if self._onLost is None:
            self._onLost = []
        self._onLost.append(callback)

    def makeConnection(self, transport: Any) -> None:
        factory = self.factory
        self._active = factory.clock.seconds()
        factory.armSweep()
        # ProtocolWrapper.makeConnection, its declaration made once.
        provideLike(self, transport)
        Protocol.makeConnection(self, transport)
        factory.registerProtocol(self)
        wrapped: Any = self.wrappedProtocol
        wrapped.makeConnection(self)

    def idleAbort(self) -> None:
        """Drop the connection: it was idle for too long."""
        self._aborted = True
        self.factory.idleLog.info(
            "listen.idle-timeout {listener}", listener=self.factory.name
        )
        transport: Any = self.transport
        transport.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        self._active = self.factory.clock.seconds()
        super().dataReceived(data)

    def write(self, data: bytes) -> None:
        self._active = self.factory.clock.seconds()
        self.bytesWritten += len(data)
        transport: Any = self.transport
        transport.write(data)

    def writeSequence(self, data: Any) -> None:
        # One buffer, not a check and an append per piece (an HTTP head
        # arrives here as some thirty pieces when no TLS joins them first).
        self.write(b"".join(data))

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self._lost = True
        super().connectionLost(reason)
        callbacks, self._onLost = self._onLost, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:
                self.factory.log.failure(
                    "listen.lost-callback {listener}", listener=self.factory.name
                )


class LimitedFactory(policies.WrappingFactory):
    """
    Cap concurrent connections and drop idle ones.

    Idle connections are found by one sweep per listener, a single timer
    due when the connection that has been quiet longest reaches
    C{idleTimeout}: it drops every connection past its deadline and sleeps
    until the next one's, but at least C{idleTimeout / 16} (so staggered
    deadlines cannot make it run for every connection; a connection may
    then be dropped up to that much late). No connection, no timer.

    Connections over C{maxConnections}, or over C{maxPerSource} from one
    source (L{connectionSource}: an IPv6 /64 is one source), are closed as
    soon as they are accepted, before any TLS work, so a flood costs little.
    Refusals are counted; the warning about them is logged at most once per
    C{logEvery} seconds so a flood cannot drown the log. C{admit}, when
    given, may refuse a source for its own reasons the same way (the tink
    listener's sources told to calm down, issue 17).
    """

    logEvery = 10.0
    sweepSteps = 16

    protocol = LimitedProtocol
    log = Logger()
    noisy = False

    def __init__(
        self,
        wrappedFactory: Any,
        *,
        name: str,
        clock: IReactorTime,
        maxConnections: int,
        idleTimeout: float,
        maxPerSource: int | None = None,
        admit: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__(wrappedFactory)
        self.admit = admit
        self.name = name
        self.clock = clock
        self.maxConnections = maxConnections
        self.maxPerSource = maxPerSource or maxConnections
        self.idleTimeout = idleTimeout
        self.refused = 0
        self._perSource: dict[str, int] = {}
        self._sourceOf: dict[Any, str] = {}
        self._drained: list[Deferred[None]] = []
        self._lastWarning: float | None = None
        self._unreported = 0
        self._sweep: IDelayedCall | None = None
        # A client can open many connections and leave them idle: their
        # closes are logged at most ten per 10 s per listener.
        self.idleLog = ThrottledLog(clock, self.log)

    def armSweep(self) -> None:
        """A connection opens: make sure the idle sweep will look at it."""
        if self._sweep is None:
            self._sweep = self.clock.callLater(self.idleTimeout, self._sweepIdle)

    def _sweepIdle(self) -> None:
        self._sweep = None
        now, timeout = self.clock.seconds(), self.idleTimeout
        due: float | None = None
        for proto in list(self.protocols):
            if proto._lost or proto._aborted:
                continue
            deadline = proto._active + timeout
            if deadline <= now:
                proto.idleAbort()
            elif due is None or deadline < due:
                due = deadline
        if due is not None:
            wait = max(due - now, timeout / self.sweepSteps)
            self._sweep = self.clock.callLater(wait, self._sweepIdle)

    def buildProtocol(self, addr: IAddress | None) -> Any:
        source = connectionSource(addr)
        if len(self.protocols) >= self.maxConnections:
            return self._refuse("total", self.maxConnections)
        if self._perSource.get(source, 0) >= self.maxPerSource:
            return self._refuse("source", self.maxPerSource)
        if self.admit is not None and not self.admit(source):
            return self._refuse("penalty", 0)
        protocol = super().buildProtocol(addr)
        self._perSource[source] = self._perSource.get(source, 0) + 1
        self._sourceOf[protocol] = source
        return protocol

    def _refuse(self, why: str, limit: int) -> None:
        self.refused += 1
        self._unreported += 1
        now = self.clock.seconds()
        if self._lastWarning is None or now - self._lastWarning >= self.logEvery:
            self.log.warn(
                "listen.connection-refused {listener} {why} {limit} ({count} refused)",
                listener=self.name,
                why=why,
                limit=limit,
                count=self._unreported,
            )
            self._lastWarning = now
            self._unreported = 0
        return None

    def openConnections(self) -> int:
        return len(self.protocols)

    def unregisterProtocol(self, p: Any) -> None:
        super().unregisterProtocol(p)
        source = self._sourceOf.pop(p, None)
        if source is not None:
            left = self._perSource[source] - 1
            if left:
                self._perSource[source] = left
            else:
                del self._perSource[source]
        if not self.protocols:
            if self._sweep is not None:
                if self._sweep.active():
                    self._sweep.cancel()
                self._sweep = None
            waiters, self._drained = self._drained, []
            for d in waiters:
                d.callback(None)

    def closeAll(self) -> Deferred[None]:
        """Abort every open connection; fire once all of them are gone."""
        if not self.protocols:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._drained.append(d)
        for proto in list(self.protocols):
            proto.transport.abortConnection()
        return d
