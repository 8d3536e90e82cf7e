"""
Twisted protocols that carry DNS messages to a L{Responder} and back [A5].

UDP: one datagram, one reply (or none), subject to response-rate limiting
when a L{ResponseRateLimiter} is given. TCP (RFC 7766): messages framed by
a two-byte length, answered in order, with a maximum message size, an idle
timeout on the injected clock, a cap on concurrent connections in total and
per source (an IPv4 address, an IPv6 /64), and reading paused while the
peer does not read its replies, so memory stays bounded.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterable
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
from fleetd.dns.ratelimit import SLIP, ResponseRateLimiter, slipReply
from fleetd.dns.responder import Responder
from fleetd.sources import HOST_IPV4_BITS, HOST_IPV6_BITS, SourcePrefix

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

    def __init__(
        self,
        responder: Responder,
        metrics: TransportMetrics,
        limiter: ResponseRateLimiter | None = None,
    ) -> None:
        self._metrics = metrics
        self._fastAnswer = metrics.fastAnswer
        self.responder = responder
        self.limiter = limiter

    @property
    def responder(self) -> Responder:
        """The responder in use; setting it takes effect with the next query."""
        return self._responder

    @responder.setter
    def responder(self, responder: Responder) -> None:
        self._responder = responder
        self._fast = responder.fast
        self._quick = responder.quick

    def startProtocol(self) -> None:
        """
        Send through the port's batch when it has one (C{sendBatched}, one
        C{sendmmsg} a batch), else straight to the socket: the address came
        from C{recvfrom}, so the port's per-packet address checks (about a
        microsecond) are not needed; send errors are dropped all the same.
        """
        transport = self.transport
        assert transport is not None
        getHandle = getattr(transport, "getHandle", None)
        handle = getHandle() if getHandle is not None else None
        self._write: Callable[[bytes, Any], object]
        batched = getattr(transport, "sendBatched", None)
        if batched is not None:  # fleetd.dns.udp.BatchPort: sendmmsg
            self._write = batched
        elif isinstance(handle, socket.socket):
            self._write = handle.sendto
        else:
            self._write = transport.write

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        limiter = self.limiter
        wire = self._fast(datagram)
        if wire is not None:
            if limiter is not None:
                verdict = limiter.verdict(addr[0], True)
                if verdict:
                    self._limited(verdict, True, datagram, addr)
                    return
            self._fastAnswer.value += 1
        else:
            if (
                limiter is not None
                and len(datagram) >= 12
                and not datagram[2] & 0x80  # silence costs no budget
            ):
                verdict = limiter.verdict(addr[0], False)
                if verdict:
                    self._limited(verdict, False, datagram, addr)
                    return
            reply = self._quick(datagram, True) or self._responder.general(
                datagram, udp=True
            )
            self._metrics.count(reply)
            wire = reply[0]
            if wire is None:
                return
        try:
            self._write(wire, addr)
        except OSError:
            # e.g. a spoofed source port 0: there is nobody to tell.
            pass

    def _limited(self, verdict: int, answer: bool, datagram: bytes, addr: Any) -> None:
        """Drop the response to C{datagram}, or slip it: send it truncated."""
        self._metrics.countLimited(verdict, answer)
        if verdict == SLIP:
            wire = slipReply(datagram)
            if wire is not None:
                self._send(wire, addr)

    def _send(self, wire: bytes, addr: Any) -> None:
        try:
            self._write(wire, addr)
        except OSError:
            # e.g. a spoofed source port 0: there is nobody to tell.
            pass


@implementer(IPushProducer)
class DNSStreamProtocol(Protocol):
    """Answer length-framed DNS queries on one TCP connection."""

    def __init__(self, factory: DNSStreamFactory, source: bytes | str) -> None:
        self._factory = factory
        self.source = source
        self._buffer = b""
        self._timer: IDelayedCall | None = None
        self._closing = False
        self.lost: Deferred[None] = Deferred()

    @property
    def _transport(self) -> _StreamTransport:
        return cast(_StreamTransport, self.transport)

    def connectionMade(self) -> None:
        self._factory.opened(self)
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
        self._factory.closed(self)
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
    """
    Build L{DNSStreamProtocol}s, at most C{maxConnections} at a time and
    C{maxPerSource} from one source: an IPv4 address or an IPv6 /64.
    """

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
        maxPerSource: int | None = None,
    ) -> None:
        self.responder = responder
        self.metrics = metrics
        self.clock = clock
        self.maxConnections = maxConnections
        self.idleTimeout = idleTimeout
        self.maxMessage = maxMessage
        self.maxPerSource = maxConnections if maxPerSource is None else maxPerSource
        self.connections: set[DNSStreamProtocol] = set()
        self.perSource: dict[bytes | str, int] = {}
        self._sourceOf = SourcePrefix(HOST_IPV4_BITS, HOST_IPV6_BITS)

    def buildProtocol(self, addr: IAddress | None) -> Protocol | None:
        if len(self.connections) >= self.maxConnections:
            self.metrics.countRefused("total")
            return None
        source = self._sourceOf(str(getattr(addr, "host", "")))
        if self.perSource.get(source, 0) >= self.maxPerSource:
            self.metrics.countRefused("source")
            return None
        return DNSStreamProtocol(self, source)

    def opened(self, protocol: DNSStreamProtocol) -> None:
        """Count C{protocol}'s connection against the caps."""
        self.connections.add(protocol)
        self.perSource[protocol.source] = self.perSource.get(protocol.source, 0) + 1

    def closed(self, protocol: DNSStreamProtocol) -> None:
        """Stop counting C{protocol}'s connection; idempotent."""
        if protocol not in self.connections:
            return
        self.connections.discard(protocol)
        left = self.perSource[protocol.source] - 1
        if left:
            self.perSource[protocol.source] = left
        else:
            del self.perSource[protocol.source]

    def dropAll(self) -> Deferred[None]:
        """Abort every connection; fire when all of them are gone."""
        lost = [p.lost for p in self.connections]
        for p in list(self.connections):
            p.abort()
        return gatherResults(lost).addCallback(lambda _: None)
