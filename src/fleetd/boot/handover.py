"""
When has the operating system got a whole response? [C1]

Twisted finishing a response means every byte was handed to the
connection, not to the kernel: the TLS layer and the TCP transport keep
what the socket would not take yet in fleetd's own memory. The revised
[C1] counts a delivery only once all of it has reached the operating
system, and withdraws the mark when the connection fails before that.

On fleetd's listeners a L{LimitedProtocol} sits right above the socket's
transport and counts every byte handed to it. When the body's last byte
has been written (L{Handover.bodyWritten}) that count marks the end of
the body in the connection's byte stream; the kernel has the whole body
once the transport has sent that many bytes, whatever was written after
it (the TLS close alert). A delivery's response ends its connection
(C{Connection: close}), so the check runs when the response is finished
and, unless the kernel took everything already, once more when the
connection is lost (or when another request for the same run arrives):
no timer at all. A client that stops reading keeps the check waiting
until the listener's idle timeout closes the connection.

Over any other transport (no L{LimitedProtocol} below, as in tests that
drive the HTTP channel directly) the check polls instead, backing off
from the next reactor turn to once a second, and counts every byte
still held.

L{BodyProducer} writes the body itself, in chunks while the connection
takes them, and tells the L{Handover} where it ended.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.protocols.policies import ProtocolWrapper
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.web.iweb import IRequest
from zope.interface import implementer

from fleetd.listen.connections import LimitedProtocol

FIRST_WAIT = 0.0
MAX_WAIT = 1.0
_MAX_DEPTH = 8


def _stack(transport: object) -> list[object]:
    """
    C{transport} and the transports it wraps (TLS, limit wrapper, TCP).
    Read from each layer's own attributes: a L{ProtocolWrapper} forwards
    unknown attribute lookups to its transport, which would count the TCP
    buffer once per layer (and raise and catch on every miss).
    """
    layers: list[object] = []
    while transport is not None and len(layers) < _MAX_DEPTH:
        layers.append(transport)
        transport = getattr(transport, "__dict__", {}).get("transport")
    return layers


def unsentBytes(transport: object, layers: list[object] | None = None) -> int:
    """
    How many bytes written to C{transport} are still in fleetd's buffers:
    TLS application data held back (before the handshake ends) and what
    the TCP transport has not written to its socket. C{layers}: the
    transport's L{_stack}, when the caller has it already.
    """
    total = 0
    for layer in _stack(transport) if layers is None else layers:
        if isinstance(layer, TLSMemoryBIOProtocol):
            total += sum(len(chunk) for chunk in layer._appSendBuffer)
        elif not isinstance(layer, ProtocolWrapper):  # the socket's transport
            data = getattr(layer, "dataBuffer", None)
            if isinstance(data, bytes):
                total += len(data) - int(getattr(layer, "offset", 0))
                total += int(getattr(layer, "_tempDataLen", 0))
    return total


def connectionGone(transport: object, layers: list[object] | None = None) -> bool:
    """Whether the socket under C{transport} has been closed."""
    return any(
        not isinstance(layer, ProtocolWrapper)
        and bool(getattr(layer, "disconnected", False))
        for layer in (_stack(transport) if layers is None else layers)
    )


class Handover:
    """
    Report once, with C{True} when the operating system has the whole
    body written to C{transport}, with C{False} when the connection went
    first.
    """

    def __init__(
        self,
        clock: IReactorTime,
        transport: object,
        report: Callable[[bool], None],
    ) -> None:
        self._clock = clock
        self._transport = transport
        self._layers = _stack(transport)  # a connection's stack stays put
        self._report: Callable[[bool], None] | None = report
        self._wait = FIRST_WAIT
        self._timer: IDelayedCall | None = None
        self._limited: LimitedProtocol | None = None
        self._above: list[object] = []  # TLS, which may hold application data
        self._below: list[object] = []  # the socket's transport
        for i, layer in enumerate(self._layers):
            if isinstance(layer, LimitedProtocol):
                self._limited = layer
                self._above, self._below = self._layers[:i], self._layers[i + 1 :]
                break
        self._end: int | None = None  # the body's end in the limited stream

    def bodyWritten(self) -> None:
        """
        The body's last byte was just written: note where the body ends
        in the stream below TLS (nothing of it may be held above).
        """
        limited = self._limited
        if limited is not None and unsentBytes(None, self._above) == 0:
            self._end = limited.bytesWritten

    def _settled(self) -> bool | None:
        """Delivered (C{True}), failed (C{False}) or not known yet (L{None})."""
        limited, end = self._limited, self._end
        if limited is not None and end is not None:
            sent = limited.bytesWritten - unsentBytes(None, self._below)
            if sent >= end:
                return True
            return False if limited._lost else None
        if unsentBytes(self._transport, self._layers) == 0:
            return True
        return False if connectionGone(self._transport, self._layers) else None

    def start(self) -> None:
        """
        Check now; if the body is not all with the kernel yet, check again
        when the connection is lost (or poll, without a L{LimitedProtocol}
        or its count of the body).
        """
        self._check(poll=False)
        if self._report is None:
            return
        if self._limited is not None and self._end is not None:
            self._limited.whenLost(self._check)
            return
        self._timer = self._clock.callLater(self._wait, self._check)
        self._wait = min(MAX_WAIT, max(0.01, self._wait * 2))

    def poll(self) -> None:
        """
        Check now, out of turn: another request for the same run arrived,
        and that client may already have read everything.
        """
        timer = self._timer
        if timer is not None and timer.active():
            timer.cancel()
        self._check(poll=timer is not None)

    def _check(self, poll: bool = True) -> None:
        """Report if settled; else, when C{poll}ing, look again later."""
        self._timer = None
        report = self._report
        if report is None:
            return
        settled = self._settled()
        if settled is not None:
            self._report = None
            report(settled)
            return
        if poll and self._end is None:
            self._timer = self._clock.callLater(self._wait, self._check)
            self._wait = min(MAX_WAIT, max(0.01, self._wait * 2))

    def cancel(self) -> None:
        """Stop watching without reporting (fleetd is stopping)."""
        self._report = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


@implementer(IPushProducer)
class BodyProducer:
    """
    Write a body in chunks while the connection takes them, pausing when
    its buffers are full, and finish the response in the same step as the
    last chunk.

    Once the last byte is handed over the client may have everything, so
    the response must count as finished then: a client that closes right
    after reading Content-Length bytes must not make the run deliverable
    again [C1]. A connection lost while chunks are still held back (a slow
    or vanished reader) is a delivery that did not happen.
    """

    chunkSize = 65536

    def __init__(
        self,
        request: IRequest,
        body: bytes,
        lastWritten: Callable[[], None] = lambda: None,
    ) -> None:
        self._request = request
        self._lastWritten = lastWritten  # called between the last write and finish
        self._body = memoryview(body)
        self._offset = 0
        self._paused = False
        self._done = False

    def start(self) -> None:
        if len(self._body) <= self.chunkSize:
            self._done = True
            self._request.write(bytes(self._body))
            self._lastWritten()
            self._request.finish()
            return
        self._request.registerProducer(self, True)  # type: ignore[attr-defined]
        self._pump()

    def _pump(self) -> None:
        while not (self._paused or self._done):
            chunk = bytes(self._body[self._offset : self._offset + self.chunkSize])
            self._offset += len(chunk)
            if self._offset >= len(self._body):
                self._done = True
                self._request.unregisterProducer()  # type: ignore[attr-defined]
                self._request.write(chunk)
                self._lastWritten()
                self._request.finish()
            else:
                self._request.write(chunk)  # may pause us, synchronously

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._pump()

    def stopProducing(self) -> None:
        self._done = True
