"""
Tests for L{fleetd.dns.ratelimit} and how the transports use it: response-
rate limiting with slip over UDP, the per-source TCP cap, their metrics and
configuration (issue 8, items 8 and 12).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.rcode
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock
from twisted.internet.testing import FakeDatagramTransport, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, DNSRateLimit, parseSettings
from fleetd.dns.metrics import DNSMetrics
from fleetd.dns.protocol import DNSDatagramProtocol, DNSStreamFactory
from fleetd.dns.ratelimit import (
    DROP,
    SEND,
    SLIP,
    ResponseRateLimiter,
    slipReply,
)
from fleetd.dns.responder import Responder
from tests.dnssupport import TOPOLOGY, framed, query, sample, unframe

SETTINGS = DNSRateLimit(rate=10.0, burst=5.0, slip=2)


class LimiterTests(SynchronousTestCase):
    """Token buckets per prefix and kind, with slip (issue 8, item 12)."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.limiter = ResponseRateLimiter(SETTINGS, self.clock)

    def verdicts(self, host: str, count: int, answer: bool = False) -> list[int]:
        return [self.limiter.verdict(host, answer) for _ in range(count)]

    def test_burstThenSlip(self) -> None:
        """A burst is sent; past it every 2nd response slips, others drop (item 12)."""
        self.assertEqual(self.verdicts("10.0.0.1", 5), [SEND] * 5)
        self.assertEqual(self.verdicts("10.0.0.2", 4), [DROP, SLIP, DROP, SLIP])

    def test_refill(self) -> None:
        """The budget refills at C{rate} a second of the injected clock (item 12)."""
        self.verdicts("10.0.0.1", 8)
        self.clock.advance(0.1)
        self.assertEqual(self.verdicts("10.0.0.1", 2), [SEND, SLIP])
        self.clock.advance(10)
        self.assertEqual(self.verdicts("10.0.0.1", 6), [SEND] * 5 + [DROP])

    def test_otherPrefixUnaffected(self) -> None:
        """A flood from one prefix leaves other prefixes their budget (item 12)."""
        self.verdicts("10.0.0.1", 1000)
        self.assertEqual(self.verdicts("10.0.1.1", 5), [SEND] * 5)
        self.verdicts("2001:db8:0:1::1", 1000)
        self.assertEqual(self.verdicts("2001:db8:0:100::1", 5), [SEND] * 5)

    def test_answersApart(self) -> None:
        """Other names from a prefix never use up its enrollment answers (item 12)."""
        self.verdicts("10.0.0.1", 1000, answer=False)
        self.assertEqual(self.verdicts("10.0.0.9", 5, answer=True), [SEND] * 5)
        self.assertEqual(self.verdicts("10.0.0.9", 1, answer=True), [DROP])

    def test_slipSettings(self) -> None:
        """Slip 0 drops every excess response; slip 1 truncates every one (item 12)."""
        for slip, expected in ((0, DROP), (1, SLIP)):
            limiter = ResponseRateLimiter(
                DNSRateLimit(rate=1, burst=1, slip=slip), self.clock
            )
            limiter.verdict("10.0.0.1", False)
            verdicts = {limiter.verdict("10.0.0.1", False) for _ in range(10)}
            self.assertEqual(verdicts, {expected})

    def test_tableBounded(self) -> None:
        """The account table never grows past C{table_size} (item 12)."""
        limiter = ResponseRateLimiter(DNSRateLimit(table_size=16), self.clock)
        for i in range(1000):
            limiter.verdict(f"10.{i // 256}.{i % 256}.1", False)
            self.assertLessEqual(len(limiter), 16)
        self.clock.advance(60)
        for i in range(100):
            limiter.verdict(f"11.0.{i}.1", False)
        self.assertEqual(len(limiter), 16)

    def test_sweepKeepsActive(self) -> None:
        """
        A full table sweeps refilled accounts first, so the oldest account,
        a flooder's, keeps what it has spent (item 12).
        """
        limiter = ResponseRateLimiter(
            DNSRateLimit(rate=1, burst=3, table_size=4), self.clock
        )
        self.assertEqual(len({limiter.verdict("10.9.9.9", False) for _ in range(5)}), 3)
        for host in ("10.0.1.1", "10.0.2.1", "10.0.3.1"):
            limiter.verdict(host, False)  # one each, refilled a second later
        self.clock.advance(2)
        limiter.verdict("10.0.4.1", False)  # table full: sweep the refilled
        self.assertEqual(len(limiter), 2)
        # Two seconds refilled two of the flooder's three: the third is over.
        verdicts = [limiter.verdict("10.9.9.9", False) for _ in range(3)]
        self.assertEqual(verdicts[:2], [SEND, SEND])
        self.assertNotEqual(verdicts[2], SEND)


class SlipReplyTests(SynchronousTestCase):
    """Slipped replies are truncated and well formed (issue 8, item 12)."""

    def test_truncated(self) -> None:
        """ID, RD and the question kept; TC and QR set; no records (item 12)."""
        data = query("random.example", "A", edns=0)
        wire = slipReply(data)
        assert wire is not None
        response = dns.message.from_wire(wire)
        self.assertEqual(response.id, 0x1234)
        self.assertTrue(response.flags & dns.flags.TC)
        self.assertTrue(response.flags & dns.flags.QR)
        self.assertTrue(response.flags & dns.flags.RD)
        self.assertEqual(str(response.question[0].name), "random.example.")
        self.assertEqual(response.answer + response.authority, [])

    def test_oddQueries(self) -> None:
        """Unreadable questions get a bare header; silence stays silent (item 12)."""
        header = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0)
        for data in (
            header + b"\x3fabc",  # the label runs past the end
            header + b"\xc0\x0c\x00\x01\x00\x01",  # a pointer
            header + b"\x01a\x00\x00\x01",  # type and class cut short
        ):
            wire = slipReply(data)
            assert wire is not None
            self.assertEqual(len(wire), 12)
            self.assertTrue(dns.message.from_wire(wire).flags & dns.flags.TC)
        self.assertIsNone(slipReply(b"\x00" * 11))
        self.assertIsNone(slipReply(query(flags=dns.flags.QR)))

    @settings(max_examples=1000, deadline=None)
    @given(data=st.binary(max_size=300), oneQuestion=st.booleans())
    def test_anyBytes(self, data: bytes, oneQuestion: bool) -> None:
        """
        Any packet: silence, or a truncated reply dnspython reads, with the
        packet's ID; never an exception (issue 8, item 12; [A5]).
        """
        if oneQuestion and len(data) >= 12:
            data = data[:2] + b"\x01\x00\x00\x01" + data[6:]
        wire = slipReply(data)
        if wire is None:
            self.assertTrue(len(data) < 12 or data[2] & 0x80)
            return
        response = dns.message.from_wire(wire)
        self.assertEqual(wire[:2], data[:2])
        self.assertTrue(response.flags & dns.flags.TC)
        self.assertEqual(response.answer + response.authority, [])


class UDPRateLimitTests(SynchronousTestCase):
    """L{DNSDatagramProtocol} applies the limiter and counts it (issue 8, item 12)."""

    def setUp(self) -> None:
        self.registry = CollectorRegistry()
        self.clock = Clock()
        self.protocol = DNSDatagramProtocol(
            Responder(TOPOLOGY, 60),
            DNSMetrics(self.registry).forTransport("udp"),
            ResponseRateLimiter(SETTINGS, self.clock),
        )
        self.transport = FakeDatagramTransport()
        self.protocol.makeConnection(self.transport)

    def replies(self, peer: str) -> list[dns.message.Message]:
        return [
            dns.message.from_wire(wire)
            for wire, addr in self.transport.written
            if addr[0] == peer
        ]

    def limited(self, action: str, kind: str) -> float:
        return sample(
            self.registry, "fleetd_dns_rate_limited_total", action=action, kind=kind
        )

    def test_floodLimitedLegitimateFlows(self) -> None:
        """
        A flood of other names from one /24 is dropped or slipped while the
        enrollment name's A answers to another /24 and to the flooder's own
        /24 keep flowing, within their budget, on the injected clock (item 12).
        """
        for tick in range(50):
            for i in range(100):
                self.protocol.datagramReceived(
                    query(f"n{tick}-{i}.example", qid=i), ("10.9.0.66", 5353)
                )
            self.protocol.datagramReceived(query(qid=tick), ("10.20.0.7", 5353))
            self.protocol.datagramReceived(query(qid=tick), ("10.9.0.8", 5353))
            self.clock.advance(0.1)
        ok = self.replies("10.20.0.7") + self.replies("10.9.0.8")
        self.assertEqual(len(ok), 100)
        for response in ok:
            self.assertEqual(response.answer[0][0].to_text(), "10.20.0.6")
            self.assertFalse(response.flags & dns.flags.TC)
        flood = self.replies("10.9.0.66")
        sent = [r for r in flood if not r.flags & dns.flags.TC]
        slipped = [r for r in flood if r.flags & dns.flags.TC]
        self.assertEqual(len(sent), 5 + 49)  # the burst, then 10/s for 4.9 s
        self.assertTrue(all(r.rcode() == dns.rcode.REFUSED for r in sent))
        dropped = 5000 - len(sent) - len(slipped)
        self.assertEqual(len(slipped), dropped)
        self.assertEqual(self.limited("slipped", "other"), len(slipped))
        self.assertEqual(self.limited("dropped", "other"), dropped)
        self.assertEqual(self.limited("dropped", "answer"), 0)

    def test_answersLimitedToo(self) -> None:
        """The enrollment name's answers have a budget of their own (item 12)."""
        for _ in range(8):
            self.protocol.datagramReceived(query(), ("10.20.0.7", 5353))
        self.assertEqual(len(self.transport.written), 5 + 1)
        self.assertEqual(self.limited("dropped", "answer"), 2)
        self.assertEqual(self.limited("slipped", "answer"), 1)

    def test_silenceCostsNothing(self) -> None:
        """Packets that get no reply do not spend the prefix's budget (item 12)."""
        for _ in range(100):
            self.protocol.datagramReceived(b"\x00" * 5, ("10.9.0.66", 5353))
        self.protocol.datagramReceived(query("x.example"), ("10.9.0.66", 5353))
        self.assertEqual(len(self.transport.written), 1)

    def test_disabled(self) -> None:
        """Without a limiter every query is answered (item 12)."""
        self.protocol.limiter = None
        for i in range(100):
            self.protocol.datagramReceived(query(f"{i}.example"), ("10.9.0.66", 53))
        self.assertEqual(len(self.transport.written), 100)


class TCPPerSourceTests(SynchronousTestCase):
    """One source cannot hold every TCP slot (issue 8, item 8; design.md, Listeners)."""

    def setUp(self) -> None:
        self.registry = CollectorRegistry()
        self.factory = DNSStreamFactory(
            Responder(TOPOLOGY, 60),
            DNSMetrics(self.registry).forTransport("tcp"),
            Clock(),
            maxConnections=10,
            idleTimeout=10.0,
            maxMessage=512,
            maxPerSource=3,
        )

    def connect(self, address: Any) -> tuple[Any, StringTransport] | None:
        protocol = self.factory.buildProtocol(address)
        if protocol is None:
            return None
        transport = StringTransport()
        protocol.makeConnection(transport)
        return protocol, transport

    def test_capPerAddress(self) -> None:
        """The 4th connection from one address is refused, others served (item 8)."""
        held = [self.connect(IPv4Address("TCP", "127.0.0.2", p)) for p in range(3)]
        self.assertIsNone(self.connect(IPv4Address("TCP", "127.0.0.2", 9)))
        other = self.connect(IPv4Address("TCP", "127.0.0.3", 9))
        assert other is not None
        other[0].dataReceived(framed(query()))
        [wire] = unframe(other[1].value())
        self.assertEqual(
            dns.message.from_wire(wire).answer[0][0].to_text(), "10.20.0.6"
        )
        refused = sample(self.registry, "fleetd_dns_tcp_refused_total", reason="source")
        self.assertEqual(refused, 1)
        first = held[0]
        assert first is not None
        first[0].connectionLost()
        self.assertIsNotNone(self.connect(IPv4Address("TCP", "127.0.0.2", 9)))

    def test_ipv6Slash64(self) -> None:
        """IPv6 sources in one /64 share the cap; another /64 does not (item 8)."""
        for i in range(3):
            self.assertIsNotNone(self.connect(IPv6Address("TCP", f"2001:db8::{i}", 1)))
        self.assertIsNone(self.connect(IPv6Address("TCP", "2001:db8::ffff:1", 1)))
        self.assertIsNotNone(self.connect(IPv6Address("TCP", "2001:db8:0:1::1", 1)))

    def test_countsReleased(self) -> None:
        """Closed connections give their slot back; nothing is left counted (item 8)."""
        held = [self.connect(IPv4Address("TCP", "127.0.0.2", p)) for p in range(3)]
        for pair in held:
            assert pair is not None
            pair[0].connectionLost()
        self.assertEqual(self.factory.perSource, {})
        self.assertEqual(self.factory.connections, set())


class ConfigTests(SynchronousTestCase):
    """[dns.rate_limit] keys are read and checked (issue 8, item 12)."""

    def parse(self, rateLimit: dict[str, Any] | None) -> DNSRateLimit:
        from tests.support import writeConfig

        directory = Path(self.mktemp())
        overrides = {} if rateLimit is None else {"dns.rate_limit": rateLimit}
        path = writeConfig(directory, overrides)
        import tomllib

        return parseSettings(tomllib.loads(path.read_text()), path).dns_rate_limit

    def test_defaults(self) -> None:
        """Absent, RRL is on: 20/s, burst 40, slip 2, /24 and /56 (item 12)."""
        self.assertEqual(self.parse(None), DNSRateLimit())
        self.assertTrue(DNSRateLimit().enabled)

    def test_keys(self) -> None:
        """Every key is read (item 12)."""
        got = self.parse(
            {
                "enabled": False,
                "rate": 5,
                "burst": 7,
                "slip": 0,
                "ipv4_prefix": 32,
                "ipv6_prefix": 64,
                "table_size": 100,
            }
        )
        self.assertEqual(got, DNSRateLimit(False, 5.0, 7.0, 0, 32, 64, 100))

    def test_bad(self) -> None:
        """A bad value stops start-up naming the key (item 12)."""
        for key, value in (("slip", -1), ("rate", 0), ("ipv4_prefix", 33)):
            error = self.assertRaises(ConfigError, self.parse, {key: value})
            self.assertIn(f"dns.rate_limit.{key}", str(error))
