"""
Tests for L{fleetd.dns.protocol} and L{fleetd.dns.service} with in-memory
transports, and the malformed-packet corpus.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import dns.flags
import dns.message
import dns.rcode
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IReactorUDP
from twisted.internet.protocol import DatagramProtocol
from twisted.internet.testing import (
    FakeDatagramTransport,
    MemoryReactorClock,
    StringTransport,
    StringTransportWithDisconnection,
    _FakePort,
)
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from fleetd.config import ConfigError, Topology
from fleetd.dns.metrics import DNSMetrics
from fleetd.dns.protocol import DNSDatagramProtocol, DNSStreamFactory
from fleetd.dns.responder import Responder
from fleetd.dns.service import DNSService
from tests.dnssupport import NAME, TOPOLOGY, framed, query, sample, unframe

PEER = ("127.0.0.9", 5353)


def answers(wire: bytes) -> list[str]:
    return [r.to_text() for rrset in dns.message.from_wire(wire).answer for r in rrset]


class UDPTests(SynchronousTestCase):
    """L{DNSDatagramProtocol} answers datagrams and counts them [A5]."""

    def setUp(self) -> None:
        self.registry = CollectorRegistry()
        metrics = DNSMetrics(self.registry).forTransport("udp")
        self.protocol = DNSDatagramProtocol(Responder(TOPOLOGY, 60), metrics)
        self.transport = FakeDatagramTransport()
        self.protocol.makeConnection(self.transport)

    def test_answer(self) -> None:
        """The A query is answered to its sender and counted [A5]."""
        self.protocol.datagramReceived(query(), PEER)
        [(wire, addr)] = self.transport.written
        self.assertEqual((answers(wire), addr), (["10.20.0.6"], PEER))
        labels = {"qtype": "A", "rcode": "NOERROR", "transport": "udp"}
        self.assertEqual(sample(self.registry, "fleetd_dns_queries_total", **labels), 1)

    def test_refusedCounted(self) -> None:
        """Other names are REFUSED and counted by qtype and rcode [A5]."""
        self.protocol.datagramReceived(query("example.com", "MX"), PEER)
        [(wire, _)] = self.transport.written
        self.assertEqual(dns.message.from_wire(wire).rcode(), dns.rcode.REFUSED)
        labels = {"qtype": "MX", "rcode": "REFUSED", "transport": "udp"}
        self.assertEqual(sample(self.registry, "fleetd_dns_queries_total", **labels), 1)

    def test_malformedSilentAndCounted(self) -> None:
        """Short packets and responses get no reply but are counted [A5]."""
        self.protocol.datagramReceived(b"\x00" * 5, PEER)
        self.protocol.datagramReceived(query(flags=dns.flags.QR), PEER)
        self.assertEqual(self.transport.written, [])
        value = sample(self.registry, "fleetd_dns_malformed_total", transport="udp")
        self.assertEqual(value, 2)

    def test_exposition(self) -> None:
        """
        The counters reach the text exposition at scrape time, with HELP,
        TYPE and the _total suffix [A5].
        """
        self.protocol.datagramReceived(query(), PEER)
        self.protocol.datagramReceived(query("example.com"), PEER)
        text = generate_latest(self.registry).decode()
        self.assertIn("# TYPE fleetd_dns_queries_total counter", text)
        self.assertIn(
            'fleetd_dns_queries_total{qtype="A",rcode="REFUSED",transport="udp"} 1.0',
            text,
        )
        self.assertIn(
            'fleetd_dns_queries_total{qtype="A",rcode="NOERROR",transport="udp"} 1.0',
            text,
        )
        self.assertIn("# HELP fleetd_dns_rate_limited_total", text)

    def test_writeErrorSwallowed(self) -> None:
        """A send error (e.g. to port 0) drops the reply without raising [A5]."""

        def fail(packet: bytes, addr: Any) -> None:
            raise OSError(22, "Invalid argument")

        self.protocol._write = fail
        self.protocol.datagramReceived(query(), ("127.0.0.9", 0))

    def test_responderSwap(self) -> None:
        """Setting a new responder changes the next answer [A5]."""
        other = Topology("10.20.0.5", "10.20.0.99", NAME, ())
        self.protocol.responder = Responder(other, 60)
        self.protocol.datagramReceived(query(), PEER)
        self.assertEqual(answers(self.transport.written[0][0]), ["10.20.0.99"])


class TCPTests(SynchronousTestCase):
    """L{DNSStreamProtocol}: framing, limits and timeouts [A5]."""

    def setUp(self) -> None:
        self.registry = CollectorRegistry()
        self.clock = MemoryReactorClock()
        self.factory = DNSStreamFactory(
            Responder(TOPOLOGY, 60),
            DNSMetrics(self.registry).forTransport("tcp"),
            self.clock,
            maxConnections=2,
            idleTimeout=10.0,
            maxMessage=512,
        )

    def connect(self) -> tuple[Any, StringTransport]:
        protocol = self.factory.buildProtocol(IPv4Address("TCP", *PEER))
        assert protocol is not None
        transport = StringTransport()
        protocol.makeConnection(transport)
        return protocol, transport

    def test_whole(self) -> None:
        """A framed query gets a framed answer [A5]."""
        protocol, transport = self.connect()
        protocol.dataReceived(framed(query()))
        [wire] = unframe(transport.value())
        self.assertEqual(answers(wire), ["10.20.0.6"])
        labels = {"qtype": "A", "rcode": "NOERROR", "transport": "tcp"}
        self.assertEqual(sample(self.registry, "fleetd_dns_queries_total", **labels), 1)

    def test_byteAtATime(self) -> None:
        """A query arriving one byte at a time is answered once, whole [A5]."""
        protocol, transport = self.connect()
        data = framed(query(f"a.{NAME}")) + framed(query())
        for i in range(len(data)):
            protocol.dataReceived(data[i : i + 1])
        first, second = unframe(transport.value())
        self.assertEqual(dns.message.from_wire(first).rcode(), dns.rcode.NXDOMAIN)
        self.assertEqual(answers(second), ["10.20.0.6"])

    def test_pipelined(self) -> None:
        """Several queries in one segment are answered in order [A5]."""
        protocol, transport = self.connect()
        ids = [1, 2, 3]
        protocol.dataReceived(b"".join(framed(query(qid=i)) for i in ids))
        got = [dns.message.from_wire(m).id for m in unframe(transport.value())]
        self.assertEqual(got, ids)

    def test_tooLong(self) -> None:
        """A message over the size limit closes the connection [A5]."""
        protocol, transport = self.connect()
        protocol.dataReceived(struct.pack("!H", 513))
        self.assertTrue(transport.disconnecting)
        protocol.dataReceived(framed(query()))
        self.assertEqual(transport.value(), b"")
        value = sample(self.registry, "fleetd_dns_malformed_total", transport="tcp")
        self.assertEqual(value, 1)

    def test_idleTimeout(self) -> None:
        """An idle connection is aborted on the injected clock [A5]."""
        protocol, transport = self.connect()
        self.clock.advance(9)
        protocol.dataReceived(framed(query())[:3])
        self.clock.advance(9)
        self.assertFalse(transport.disconnecting)
        self.clock.advance(1)
        self.assertTrue(transport.disconnected)
        protocol.connectionLost()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_lostCancelsTimer(self) -> None:
        """Losing the connection cancels its idle timer [A5]."""
        protocol, _ = self.connect()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        protocol.connectionLost()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.factory.connections, set())

    def test_maxConnections(self) -> None:
        """Connections past the limit are refused until one closes [A5]."""
        first, _ = self.connect()
        self.connect()
        self.assertIsNone(self.factory.buildProtocol(IPv4Address("TCP", *PEER)))
        first.connectionLost()
        self.assertIsNotNone(self.factory.buildProtocol(IPv4Address("TCP", *PEER)))

    def test_backPressure(self) -> None:
        """Reading pauses while the peer does not read its replies [A5]."""
        protocol, transport = self.connect()
        self.assertIs(transport.producer, protocol)
        protocol.pauseProducing()
        self.assertEqual(transport.producerState, "paused")
        protocol.resumeProducing()
        self.assertEqual(transport.producerState, "producing")

    def test_dropAll(self) -> None:
        """dropAll aborts every connection and fires once they are gone [A5]."""
        protocol, transport = self.connect()
        d = self.factory.dropAll()
        self.assertTrue(transport.disconnected)
        self.assertNoResult(d)
        protocol.connectionLost()
        self.assertIsNone(self.successResultOf(d))


@implementer(IReactorUDP)
class MemoryReactorUDP(MemoryReactorClock):
    """L{MemoryReactorClock} that also records C{listenUDP}."""

    def __init__(self) -> None:
        super().__init__()
        self.udpServers: list[tuple[int, DatagramProtocol, str, int]] = []

    def listenUDP(
        self,
        port: int,
        protocol: DatagramProtocol,
        interface: str = "",
        maxPacketSize: int = 8192,
    ) -> _FakePort:
        self.udpServers.append((port, protocol, interface, maxPacketSize))
        return _FakePort(IPv4Address("UDP", interface or "0.0.0.0", port))


class ServiceTests(SynchronousTestCase):
    """L{DNSService}: listeners, reload, shutdown [A5] [A1]."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorUDP()
        self.registry = CollectorRegistry()
        self.next: Topology | Exception = TOPOLOGY
        self.service = DNSService(
            self.reactor,
            TOPOLOGY,
            port=10053,
            interface="127.0.0.1",
            ttl=30,
            registry=self.registry,
            topologyLoader=self.load,
        )
        self.service.startService()
        [(_, protocol, _, _)] = self.reactor.udpServers
        self.udp = protocol
        self.transport = FakeDatagramTransport()
        self.udp.makeConnection(self.transport)

    def load(self) -> Topology:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next

    def ask(self) -> list[str]:
        self.udp.datagramReceived(query(), PEER)
        wire, _ = self.transport.written.pop()
        response = dns.message.from_wire(wire)
        self.assertEqual(response.answer[0].ttl, 30)
        return answers(wire)

    def test_listens(self) -> None:
        """UDP and TCP listen on the same port and interface [A5]."""
        [(port, _, interface, _)] = self.reactor.udpServers
        [(tcpPort, factory, _, tcpInterface)] = self.reactor.tcpServers
        self.assertEqual((port, interface), (10053, "127.0.0.1"))
        self.assertEqual((tcpPort, tcpInterface), (10053, "127.0.0.1"))
        self.assertIsInstance(factory, DNSStreamFactory)
        self.assertEqual(self.ask(), ["10.20.0.6"])

    def test_reload(self) -> None:
        """A good new topology is answered from without a restart [A5] [A1]."""
        self.next = Topology("10.20.0.5", "10.20.0.7", NAME, ())
        with capturedLogs() as events:
            self.service.reloadTopology()
        self.assertEqual(self.ask(), ["10.20.0.7"])
        self.assertEqual(self.service.topology, self.next)
        self.assertIn(
            "dns.reload.accepted {name} {address}", [e["log_format"] for e in events]
        )
        [(_, factory, _, _)] = self.reactor.tcpServers
        assert isinstance(factory, DNSStreamFactory)
        self.assertIs(factory.responder, self.service.responder)

    def test_reloadRejected(self) -> None:
        """A bad topology keeps the old answers and logs why [A5] [A1]."""
        self.next = ConfigError("site.topology.SPORE_BOOTSTRAP_IP", "not an IP address")
        with capturedLogs() as events:
            self.service.reloadTopology()
        self.assertEqual(self.ask(), ["10.20.0.6"])
        [event] = [
            e for e in events if e["log_format"] == "dns.reload.rejected {problem}"
        ]
        self.assertIn("SPORE_BOOTSTRAP_IP", event["problem"])
        self.assertEqual(event["log_level"].name, "warn")

    def test_reloadBug(self) -> None:
        """An unexpected error while reloading keeps the old answers too [A5] [A1]."""
        self.next = RuntimeError("bug")
        with capturedLogs() as events:
            self.service.reloadTopology()
        self.assertEqual(self.ask(), ["10.20.0.6"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertIn("dns.reload.failed", [e["log_format"] for e in events])

    def test_stop(self) -> None:
        """Stopping waits for every TCP connection to go [A5]."""
        [(_, factory, _, _)] = self.reactor.tcpServers
        protocol = factory.buildProtocol(IPv4Address("TCP", *PEER))
        assert protocol is not None
        transport = StringTransportWithDisconnection()
        transport.protocol = protocol
        protocol.makeConnection(transport)
        self.assertIsNone(self.successResultOf(self.service.stopService()))
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.assertIsNone(self.service.udpPort)


def handMade() -> list[bytes]:
    """Hand-made malformed packets: each must get FORMERR or silence."""
    header = struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 0)
    good = query(qid=0xBEEF)
    q = good[12:]
    packets = [
        b"",
        b"\xbe",
        good[:11],
        header,  # QDCOUNT 1, no question
        header + b"\xc0\x0c\x00\x01\x00\x01",  # pointer to itself: loop
        header + b"\x01a\xc0\x0c\x00\x01\x00\x01",  # pointer back into a loop
        header + b"\xc0\x20\x00\x01\x00\x01" + bytes(30),  # pointer forward
        header + b"\xc0\xff\x00\x01\x00\x01",  # pointer out of range
        header + b"\x3fabc",  # label longer than the packet
        header + b"\x40abc\x00\x00\x01\x00\x01",  # extended label type
        header + (b"\x3f" + b"a" * 63) * 5 + b"\x00\x00\x01\x00\x01",  # name > 255
        header + q[:-1],  # question cut short
        good + b"\x00",  # trailing junk
        struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0xFFFF, 0xFFFF, 0xFFFF) + q,
        struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 1) + q + b"\x00\x00\x29\x04",
        struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 2)
        + q
        + (b"\x00\x00\x29\x04\xd0" + bytes(6)) * 2,  # two OPTs
        struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 1, 0, 0)
        + q
        + b"\x00\x00\x29\x04\xd0"
        + bytes(6),  # OPT in the answer section
        struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 1)
        + q
        + b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x08\x00\x0a\x00\x10abcd",
        struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 1)
        + q
        + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x09\x01\x02\x03\x04",
    ]
    return packets


def randomPackets() -> list[bytes]:
    """Reproducible random packets, some with a plausible header."""
    rng = random.Random(4)
    packets = [rng.randbytes(rng.randrange(0, 80)) for _ in range(200)]
    header = b"\x00\x01\x00\x00\x00\x01"
    packets += [header + rng.randbytes(rng.randrange(0, 80)) for _ in range(200)]
    return packets


def udpLimit(data: bytes) -> int:
    """The most a UDP reply to C{data} may hold: 512, or its EDNS payload."""
    try:
        message = dns.message.from_wire(data)
    except Exception:
        return 512
    if message.edns < 0:
        return 512
    return min(max(message.payload, 512), 1232)


class MalformedTests(SynchronousTestCase):
    """Malformed packets never crash the responder: FORMERR or silence [A5]."""

    def setUp(self) -> None:
        self.responder = Responder(TOPOLOGY, 60)

    def check(self, data: bytes, udp: bool = True) -> bytes | None:
        reply = self.responder.respond(data, udp=udp)
        fast = self.responder.fast(data)
        if fast is not None:
            self.assertEqual(fast, reply.wire)
        if reply.wire is None:
            self.assertTrue(len(data) < 12 or data[2] & 0x80)
            return None
        response = dns.message.from_wire(reply.wire)
        self.assertEqual(response.id, struct.unpack("!H", data[:2])[0])
        self.assertTrue(response.flags & dns.flags.QR)
        self.assertLessEqual(len(reply.wire), udpLimit(data) if udp else 65535)
        return reply.wire

    def test_corpus(self) -> None:
        """The hand-made corpus gets FORMERR (ID echoed) or silence [A5]."""
        for data in handMade():
            wire = self.check(data)
            if wire is not None:
                rcode = dns.message.from_wire(wire).rcode()
                self.assertEqual(rcode, dns.rcode.FORMERR, data)

    def test_randomCorpus(self) -> None:
        """Random packets get a well-formed reply with their ID, or silence [A5]."""
        for data in randomPackets():
            self.check(data)

    def test_throughProtocols(self) -> None:
        """The corpus through UDP and TCP: counted, nothing raised [A5]."""
        registry = CollectorRegistry()
        metrics = DNSMetrics(registry)
        udp = DNSDatagramProtocol(self.responder, metrics.forTransport("udp"))
        udp.makeConnection(FakeDatagramTransport())
        factory = DNSStreamFactory(
            self.responder,
            metrics.forTransport("tcp"),
            MemoryReactorClock(),
            maxConnections=1,
            idleTimeout=1,
            maxMessage=4096,
        )
        tcp = factory.buildProtocol(None)
        assert tcp is not None
        tcp.makeConnection(StringTransport())
        for data in handMade() + randomPackets():
            udp.datagramReceived(data, PEER)
            tcp.dataReceived(framed(data))
        self.assertGreater(
            sample(registry, "fleetd_dns_malformed_total", transport="udp"), 18
        )
        self.assertGreater(
            sample(registry, "fleetd_dns_malformed_total", transport="tcp"), 18
        )
        tcp.connectionLost()

    @settings(max_examples=1000, deadline=None)
    @given(data=st.binary(max_size=600), udp=st.booleans())
    def test_randomBytes(self, data: bytes, udp: bool) -> None:
        """Any bytes: no exception, a valid reply with the same ID, or silence [A5]."""
        self.check(data, udp)

    @settings(max_examples=1000, deadline=None)
    @given(
        edits=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), max_size=6),
        cut=st.integers(0, 90),
        edns=st.booleans(),
    )
    def test_mutatedQueries(
        self, edits: list[tuple[int, int]], cut: int, edns: bool
    ) -> None:
        """Valid queries with bytes changed or cut off never crash it [A5]."""
        data = bytearray(query(f"x.{NAME}", edns=0 if edns else -1))
        for position, value in edits:
            if position < len(data):
                data[position] = value
        self.check(bytes(data[:cut]) if cut < len(data) else bytes(data))
