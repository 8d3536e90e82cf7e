"""
When has the operating system got a whole response? [C1]

Twisted finishing a response means every byte was handed to the
connection, not to the kernel: the TLS layer and the TCP transport keep
what the socket would not take yet in fleetd's own memory. The revised
[C1] counts a delivery only once all of it has reached the operating
system, and withdraws the mark when the connection fails before that. So
after the last write we watch the transport stack until its buffers are
empty (delivered) or the connection is gone with bytes still held
(not delivered). A client that stops reading keeps the check waiting
until the listener's idle timeout closes the connection.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.protocols.policies import ProtocolWrapper
from twisted.protocols.tls import TLSMemoryBIOProtocol

FIRST_WAIT = 0.0
MAX_WAIT = 1.0
_MAX_DEPTH = 8


def _stack(transport: object) -> list[object]:
    """
    C{transport} and the transports it wraps (limit wrapper, TLS, TCP).
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
    Report once, with C{True} when the operating system has every byte
    written to C{transport}, with C{False} when the connection went first.
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

    def start(self) -> None:
        """Check now (usually the kernel took it all), then back off."""
        self._check()

    def poll(self) -> None:
        """
        Check now, out of turn: another request for the same run arrived,
        and that client may already have read everything.
        """
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._check()

    def _check(self) -> None:
        self._timer = None
        report = self._report
        if report is None:
            return
        unsent = unsentBytes(self._transport, self._layers)
        if unsent == 0 or connectionGone(self._transport, self._layers):
            self._report = None
            report(unsent == 0)
            return
        self._timer = self._clock.callLater(self._wait, self._check)
        self._wait = min(MAX_WAIT, max(0.01, self._wait * 2))

    def cancel(self) -> None:
        """Stop watching without reporting (fleetd is stopping)."""
        self._report = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
