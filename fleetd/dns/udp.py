"""
A UDP port with a leaner read loop for the DNS responder [A5].

Twisted's L{udp.Port.doRead} looks up the socket, the packet size, the
address family and the protocol's handler again for every datagram.
L{QuickPort} looks them up once per reactor turn and otherwise does the
same: at most C{maxThroughput} bytes a turn, errors handled as Twisted
does, a handler's exception logged without ending the turn.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from twisted.internet import udp
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import DatagramProtocol
from twisted.logger import Logger

_IGNORE = frozenset((errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR))
_REFUSED = frozenset((errno.ECONNREFUSED,))


class QuickPort(udp.Port):
    """L{udp.Port} whose read loop binds what it needs once per turn."""

    log = Logger()

    def doRead(self) -> None:
        recvfrom = self.socket.recvfrom
        size = self.maxPacketSize
        received = self.protocol.datagramReceived
        v6 = self.addressFamily == socket.AF_INET6
        budget = self.maxThroughput
        read = 0
        while read < budget:
            try:
                data, addr = recvfrom(size)
            except OSError as e:
                if e.errno in _IGNORE:
                    return
                if e.errno in _REFUSED:
                    if self._connectedAddr:
                        self.protocol.connectionRefused()
                    return
                raise
            read += len(data)
            if v6:
                addr = addr[:2]  # (host, port), as Twisted reports it
            try:
                received(data, addr)
            except BaseException:
                self.log.failure("dns.udp.handler-failed")


def listenUDP(
    reactor: Any,
    port: int,
    protocol: DatagramProtocol,
    *,
    interface: str = "",
    maxPacketSize: int = 8192,
) -> IListeningPort:
    """
    Listen with a L{QuickPort} on a real reactor; through C{listenUDP}
    otherwise (test doubles).
    """
    from twisted.internet.posixbase import PosixReactorBase

    if not isinstance(reactor, PosixReactorBase):
        listening: IListeningPort = reactor.listenUDP(
            port, protocol, interface=interface, maxPacketSize=maxPacketSize
        )
        return listening
    quick = QuickPort(port, protocol, interface, maxPacketSize, reactor)  # type: ignore[no-untyped-call]
    quick.startListening()  # type: ignore[no-untyped-call]
    return quick
