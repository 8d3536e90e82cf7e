"""
L{fleetd.dns.mmsg} and L{fleetd.dns.udp.BatchPort}: the DNS responder's
batched UDP I/O (C{recvmmsg}/C{sendmmsg}) against its per-packet fallback
[A5].
"""

from __future__ import annotations

import random
import socket
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import DNSRateLimit
from fleetd.dns import mmsg
from fleetd.dns.metrics import DNSMetrics
from fleetd.dns.protocol import DNSDatagramProtocol
from fleetd.dns.ratelimit import ResponseRateLimiter
from fleetd.dns.responder import Responder
from fleetd.dns.udp import BatchPort, QuickPort, listenUDP
from tests.dnssupport import NAME, TOPOLOGY, Collector, query

if not mmsg.available():
    skip = "no recvmmsg/sendmmsg here"


def queries() -> list[bytes]:
    """A mix that reaches every path: fast A, quick REFUSED/NXDOMAIN/FORMERR,
    dnspython, garbage, empty and oversized datagrams."""
    rng = random.Random(8)
    out = [query(), query(NAME, "AAAA"), query("x.example.org"), b"", b"\x00" * 11]
    out += [query(f"n{i}.{NAME}") for i in range(5)]
    out += [query(f"q{i}.example.com") for i in range(20)]
    out += [
        query(NAME, "TXT"),
        b"\x12\x34" + bytes(rng.randrange(256) for _ in range(40)),
    ]
    out += [query() + b"\x00" * 8000]  # 8 KiB
    return out


def drain(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(65536))
        except BlockingIOError:
            return got


class SameRepliesTests(SynchronousTestCase):
    def serve(self, batched: bool, family: int, host: str) -> list[list[bytes]]:
        """Send every query from three clients, in turns of 200 bytes; what
        each client got back."""
        limiter = ResponseRateLimiter(
            DNSRateLimit(rate=5.0, burst=6.0, slip=2), Clock()
        )
        metrics = DNSMetrics(CollectorRegistry()).forTransport("udp")
        proto = DNSDatagramProtocol(Responder(TOPOLOGY, 60), metrics, limiter)
        port: Any = listenUDP(reactor, 0, proto, interface=host, batched=batched)
        self.addCleanup(port.stopListening)
        self.assertIs(type(port), BatchPort if batched else QuickPort)
        port.maxThroughput = 200
        clients = []
        for _ in range(3):
            c = socket.socket(family, socket.SOCK_DGRAM)
            self.addCleanup(c.close)
            c.bind((host, 0))
            c.setblocking(False)
            clients.append(c)
        target = (host, port.getHost().port)
        sent: list[int] = []
        if batched:  # count the replies that went by sendmmsg
            flush = port._batch.flush

            def counted() -> int:
                sent.append(len(port._batch.queued))
                dropped: int = flush()
                return dropped

            port._batch.flush = counted
        for i, q in enumerate(queries() * 2):
            clients[i % 3].sendto(q, target)
        for _ in range(200):
            port.doRead()
        got = [drain(c) for c in clients]
        if batched:
            self.assertEqual(sum(sent), sum(map(len, got)))
        return got

    def test_batchedAndPerPacket_sameBytesToSameAddresses(self) -> None:
        """
        [A5] The same queries (fast, quick, general, rate-limited with slips,
        empty, garbage, 8 KiB) from three sources get byte-identical replies
        at the same sources through C{recvmmsg}/C{sendmmsg} as through
        C{recvfrom}/C{sendto}.
        """
        perPacket = self.serve(False, socket.AF_INET, "127.0.0.1")
        batched = self.serve(True, socket.AF_INET, "127.0.0.1")
        self.assertEqual(batched, perPacket)
        self.assertGreater(sum(map(len, perPacket)), 20)
        self.assertTrue(all(perPacket))

    def test_ipv6_sameBytesToSameAddresses(self) -> None:
        """[A5] Over IPv6 too (::1), replies and destinations are the same."""
        try:
            perPacket = self.serve(False, socket.AF_INET6, "::1")
        except Exception as e:
            raise self.skipTest(f"no ::1: {e}") from e
        self.assertEqual(self.serve(True, socket.AF_INET6, "::1"), perPacket)
        self.assertTrue(all(perPacket))


class BatchPortTests(SynchronousTestCase):
    def listen(
        self, host: str = "127.0.0.1", family: int = socket.AF_INET
    ) -> tuple[Collector, Any, socket.socket]:
        proto = Collector()
        port = listenUDP(reactor, 0, proto, interface=host, maxPacketSize=8192)
        self.addCleanup(port.stopListening)
        self.assertIsInstance(port, BatchPort)
        sender = socket.socket(family, socket.SOCK_DGRAM)
        self.addCleanup(sender.close)
        sender.bind((host, 0))
        return proto, port, sender

    def test_budget_boundsTurn_batchAnsweredWhole(self) -> None:
        """
        A turn reads until C{maxThroughput} bytes: with equal datagrams the
        same count as the per-packet loop; a batch that crosses the budget
        is handed over whole, and the rest waits for the next turn.
        """
        proto, port, sender = self.listen()
        port.maxThroughput = 100
        target = ("127.0.0.1", port.getHost().port)
        for i in range(25):
            sender.sendto(b"%010d" % i, target)
        port.doRead()
        self.assertEqual(len(proto.got), 10)
        port.doRead()
        self.assertEqual(len(proto.got), 20)
        sender.sendto(b"x" * 95, target)  # the estimate says 10 bytes: crosses
        port.doRead()
        self.assertEqual(
            [d for d, _ in proto.got][:20], [b"%010d" % i for i in range(20)]
        )
        port.doRead()
        port.doRead()
        self.assertEqual(len(proto.got), 26)
        self.assertEqual(proto.got[-1], (b"x" * 95, sender.getsockname()))

    def test_emptyLongAndCutDatagrams_asRecvfromHasThem(self) -> None:
        """
        An empty datagram arrives empty, an 8 KiB one whole, a longer one
        cut to the port's packet size (as C{recvfrom(size)} cuts it), and a
        handler's exception does not end the turn.
        """
        proto, port, sender = self.listen()
        target = ("127.0.0.1", port.getHost().port)
        for payload in (b"", b"boom", b"y" * 8192, b"z" * 9000, b"end"):
            sender.sendto(payload, target)
        port.doRead()
        self.flushLoggedErrors(ValueError)
        self.assertEqual(
            [d for d, _ in proto.got], [b"", b"y" * 8192, b"z" * 8192, b"end"]
        )

    def test_ipv6_addressIsHostAndPort(self) -> None:
        """Over IPv6 the handler gets (host, port), as from C{recvfrom}."""
        try:
            proto, port, sender = self.listen("::1", socket.AF_INET6)
        except Exception as e:
            raise self.skipTest(f"no ::1: {e}") from e
        sender.sendto(b"six", ("::1", port.getHost().port))
        port.doRead()
        port.doRead()  # empty: returns
        self.assertEqual(proto.got, [(b"six", sender.getsockname()[:2])])

    def test_failingDestination_othersStillSent(self) -> None:
        """
        C{sendmmsg} stops at a message it cannot send: that one is dropped
        and the replies after it are still sent.
        """
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addCleanup(server.close)
        server.bind(("127.0.0.1", 0))
        batch = mmsg.Batch(server.fileno(), socket.AF_INET, 512, count=8)
        clients = []
        for i in range(4):
            c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.addCleanup(c.close)
            c.bind(("127.0.0.1", 0))
            c.setblocking(False)
            c.sendto(b"q%d" % i, server.getsockname())
            clients.append(c)
        self.assertEqual(batch.receive(8), 4)
        self.assertEqual(
            batch.datagrams(4),
            [(b"q%d" % i, c.getsockname()) for i, c in enumerate(clients)],
        )
        batch.names[1 * 32 + 2 : 1 * 32 + 4] = b"\x00\x00"  # port 0: EINVAL
        for i in range(4):
            self.assertTrue(batch.queue(i, b"reply-%d" % i))
        self.assertEqual(batch.flush(), 1)
        self.assertEqual(
            [drain(c) for c in clients], [[b"reply-0"], [], [b"reply-2"], [b"reply-3"]]
        )
        self.assertEqual(batch.receive(8), 0)  # EAGAIN: nothing, no error

    def test_oversizedReply_sentAlone_inOrder(self) -> None:
        """A reply larger than a send slot goes by C{sendto}, after the
        replies queued before it."""
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addCleanup(server.close)
        server.bind(("127.0.0.1", 0))
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addCleanup(client.close)
        client.bind(("127.0.0.1", 0))
        client.setblocking(False)

        class Echo(Collector):
            def datagramReceived(self, datagram: bytes, addr: Any) -> None:
                size = 9000 if datagram == b"big" else 10
                port.sendBatched(datagram * (size // len(datagram)), addr)

        port: Any = listenUDP(reactor, 0, Echo(), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        for q in (b"a", b"big", b"c"):
            client.sendto(q, ("127.0.0.1", port.getHost().port))
        port.doRead()
        self.assertEqual(drain(client), [b"a" * 10, b"big" * 3000, b"c" * 10])

    def test_twoRepliesToOneDatagram_bothSent_inOrder(self) -> None:
        """A second reply to the same datagram does not overwrite the first
        in its buffer: it goes by C{sendto}, after the first."""
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addCleanup(client.close)
        client.bind(("127.0.0.1", 0))
        client.setblocking(False)

        class Twice(Collector):
            def datagramReceived(self, datagram: bytes, addr: Any) -> None:
                port.sendBatched(datagram + b"-1", addr)
                port.sendBatched(datagram + b"-2", addr)

        port: Any = listenUDP(reactor, 0, Twice(), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        for q in (b"a", b"b"):
            client.sendto(q, ("127.0.0.1", port.getHost().port))
        port.doRead()
        self.assertEqual(drain(client), [b"a-1", b"a-2", b"b-1", b"b-2"])

    def test_noLibcSupport_fallsBackToPerPacket(self) -> None:
        """Without C{recvmmsg}/C{sendmmsg} the port is a L{QuickPort}."""
        self.patch(mmsg, "_CALLS", None)
        self.assertFalse(mmsg.available())
        port = listenUDP(reactor, 0, Collector(), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.assertIs(type(port), QuickPort)
