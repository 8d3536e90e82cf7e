"""
Twisted protocols that carry DNS messages to a L{Responder} and back [A5].

UDP: one datagram, one reply (or none). TCP (RFC 7766): messages framed by
a two-byte length, answered in order, with a maximum message size, an idle
timeout on the injected clock, a cap on concurrent connections, and reading
paused while the peer does not read its replies, so memory stays bounded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, cast
from typing import Protocol as TypingProtocol

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IPushProducer,
    IReactorTime,
)
from twisted.internet.protocol import (
    DatagramProtocol,
    Protocol,
    ServerFactory,
    connectionDone,
)
from twisted.python.failure import Failure
from zope.interface import implementer

from fleetd.dns.metrics import TransportMetrics
from fleetd.dns.responder import Responder

_LENGTH = struct.Struct("!H")


class _StreamTransport(TypingProtocol):
    """What L{DNSStreamProtocol} uses of a TCP transport."""

    def writeSequence(self, data: Iterable[bytes]) -> None: ...
    def loseConnection(self) -> None: ...
    def abortConnection(self) -> None: ...
    def registerProducer(self, producer: object, streaming: bool) -> None: ...
    def pauseProducing(self) -> None: ...
    def resumeProducing(self) -> None: ...


class DNSDatagramProtocol(DatagramProtocol):
    """Answer DNS queries arriving as UDP datagrams."""

    noisy = False

    def __init__(self, responder: Responder, metrics: TransportMetrics) -> None:
        self._metrics = metrics
        self._fastAnswer = metrics.fastAnswer
        self.responder = responder

    @property
    def responder(self) -> Responder:
        """The responder in use; setting it takes effect with the next query."""
        return self._responder

    @responder.setter
    def responder(self, responder: Responder) -> None:
        self._responder = responder
        self._fast = responder.fast

    def startProtocol(self) -> None:
        assert self.transport is not None
        self._write = self.transport.write

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        wire = self._fast(datagram)
        if wire is not None:
            self._fastAnswer.inc()
        else:
            reply = self._responder.respond(datagram, udp=True)
            self._metrics.count(reply)
            wire = reply.wire
            if wire is None:
                return
        try:
            self._write(wire, addr)
        except OSError:
            # e.g. a spoofed source port 0: there is nobody to tell.
            pass


@implementer(IPushProducer)
class DNSStreamProtocol(Protocol):
    """Answer length-framed DNS queries on one TCP connection."""

    def __init__(self, factory: DNSStreamFactory) -> None:
        self._factory = factory
        self._buffer = b""
        self._timer: IDelayedCall | None = None
        self._closing = False
        self.lost: Deferred[None] = Deferred()

    @property
    def _transport(self) -> _StreamTransport:
        return cast(_StreamTransport, self.transport)

    def connectionMade(self) -> None:
        self._factory.connections.add(self)
        self._transport.registerProducer(self, True)
        self._timer = self._factory.clock.callLater(
            self._factory.idleTimeout, self._idle
        )

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        if self._timer is not None:
            self._timer.reset(self._factory.idleTimeout)
        buffer = self._buffer + data if self._buffer else data
        factory = self._factory
        replies = []
        start = 0
        while len(buffer) - start >= 2:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if length > factory.maxMessage:
                self._closing = True
                start = len(buffer)
                break
            end = start + 2 + length
            if len(buffer) < end:
                break
            message = buffer[start + 2 : end]
            start = end
            wire = factory.responder.fast(message)
            if wire is not None:
                factory.metrics.fastAnswer.inc()
            else:
                reply = factory.responder.respond(message, udp=False)
                factory.metrics.count(reply)
                wire = reply.wire
                if wire is None:
                    continue
            replies.append(_LENGTH.pack(len(wire)) + wire)
        self._buffer = buffer[start:]
        if replies:
            self._transport.writeSequence(replies)
        if self._closing:
            factory.metrics.countMalformed()
            self._transport.loseConnection()

    def _idle(self) -> None:
        self._timer = None
        self.abort()

    def abort(self) -> None:
        """Drop the connection now, discarding unsent replies."""
        self._closing = True
        self._transport.abortConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._factory.connections.discard(self)
        self.lost.callback(None)

    # IPushProducer: the transport pauses us when the peer stops reading.
    def pauseProducing(self) -> None:
        self._transport.pauseProducing()

    def resumeProducing(self) -> None:
        if not self._closing:
            self._transport.resumeProducing()

    def stopProducing(self) -> None:
        self._closing = True


class DNSStreamFactory(ServerFactory):
    """Build L{DNSStreamProtocol}s, at most C{maxConnections} at a time."""

    noisy = False

    def __init__(
        self,
        responder: Responder,
        metrics: TransportMetrics,
        clock: IReactorTime,
        *,
        maxConnections: int,
        idleTimeout: float,
        maxMessage: int,
    ) -> None:
        self.responder = responder
        self.metrics = metrics
        self.clock = clock
        self.maxConnections = maxConnections
        self.idleTimeout = idleTimeout
        self.maxMessage = maxMessage
        self.connections: set[DNSStreamProtocol] = set()

    def buildProtocol(self, addr: IAddress | None) -> Protocol | None:
        if len(self.connections) >= self.maxConnections:
            return None
        return DNSStreamProtocol(self)

    def dropAll(self) -> Deferred[None]:
        """Abort every connection; fire when all of them are gone."""
        lost = [p.lost for p in self.connections]
        for p in list(self.connections):
            p.abort()
        return gatherResults(lost).addCallback(lambda _: None)
