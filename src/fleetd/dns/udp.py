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

from fleetd.dns import mmsg

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


class BatchPort(QuickPort):
    """
    A L{QuickPort} that reads with C{recvmmsg} and answers with C{sendmmsg}
    (L{fleetd.dns.mmsg}).

    The turn's byte budget holds as before, counted over whole batches:
    each C{recvmmsg} asks for as many datagrams as the budget left would
    take at the size of the datagrams last read, so uniform traffic reads
    the same datagrams a turn as L{QuickPort} does; a batch already out of
    the kernel is answered whole. Replies written during a batch to the
    address the datagram came from go out together with one C{sendmmsg}
    after the batch; any other reply (too large, another address) is sent
    at once with C{sendto}, after the queued ones.
    """

    _batch: mmsg.Batch
    _current = -1
    _currentAddr: Any = None
    _estimate = 64

    def startListening(self) -> None:
        super().startListening()  # type: ignore[no-untyped-call]
        self._batch = mmsg.Batch(
            self.socket.fileno(), self.addressFamily, self.maxPacketSize
        )

    def doRead(self) -> None:
        batch = self._batch
        received = self.protocol.datagramReceived
        budget = self.maxThroughput
        read = 0
        while read < budget:
            # as many as reach the budget at the last size seen, like QuickPort
            vlen = min(batch.count, -(-(budget - read) // self._estimate))
            try:
                n = batch.receive(vlen)
            except OSError as e:
                if e.errno in _REFUSED:
                    if self._connectedAddr:
                        self.protocol.connectionRefused()
                    return
                raise
            if not n:
                return
            got = 0
            try:
                for i, (data, addr) in enumerate(batch.datagrams(n)):
                    got += len(data)
                    self._current = i
                    self._currentAddr = addr
                    try:
                        received(data, addr)
                    except BaseException:
                        self.log.failure("dns.udp.handler-failed")
            finally:
                self._current = -1
                if batch.queued:
                    batch.flush()
            read += got
            self._estimate = max(1, got // n)
            if n < vlen:  # the socket is empty
                return

    def sendBatched(self, wire: bytes, addr: Any) -> None:
        """
        Send C{wire} to C{addr}: with the batch's replies when C{addr} is
        the datagram being answered, else now (L{OSError} raised as by
        C{sendto}).
        """
        if addr is self._currentAddr and self._current >= 0:
            if self._batch.queue(self._current, wire):
                return
        if self._batch.queued:
            self._batch.flush()
        self.socket.sendto(wire, addr)


def listenUDP(
    reactor: Any,
    port: int,
    protocol: DatagramProtocol,
    *,
    interface: str = "",
    maxPacketSize: int = 8192,
    batched: bool | None = None,
) -> IListeningPort:
    """
    Listen with a L{BatchPort} on a real reactor, or a L{QuickPort} when
    C{batched} is false or, by default, libc lacks C{recvmmsg}/C{sendmmsg};
    through C{listenUDP} otherwise (test doubles).
    """
    from twisted.internet.posixbase import PosixReactorBase

    if not isinstance(reactor, PosixReactorBase):
        listening: IListeningPort = reactor.listenUDP(
            port, protocol, interface=interface, maxPacketSize=maxPacketSize
        )
        return listening
    if batched is None:
        batched = mmsg.available()
    kind = BatchPort if batched else QuickPort
    quick = kind(port, protocol, interface, maxPacketSize, reactor)  # type: ignore[no-untyped-call]
    quick.startListening()  # type: ignore[no-untyped-call]
    return quick
