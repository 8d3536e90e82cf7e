"""Tests for L{fleetd.listen}: TLS options and connection limits."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, TLSFiles
from fleetd.listen import LimitedFactory, loadCertificates, loadTLSOptions
from fleetd.pki.dev import ensureDevPKI

ADDR = IPv4Address("TCP", "127.0.0.1", 40000)


class Recorder(Protocol):
    def __init__(self) -> None:
        self.received: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self.received.append(data)


class LimitedFactoryTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.factory = LimitedFactory(
            Factory.forProtocol(Recorder),
            name="boot",
            clock=self.clock,
            maxConnections=2,
            idleTimeout=10,
        )

    def connect(self) -> tuple[object, StringTransport]:
        proto = self.factory.buildProtocol(ADDR)
        transport = StringTransport()
        if proto is not None:
            proto.makeConnection(transport)
        return proto, transport

    def test_maxConnections_refusesBeyondLimit(self) -> None:
        """Connections over the limit are refused; closing one makes room."""
        first, _ = self.connect()
        second, _ = self.connect()
        third, _ = self.connect()
        self.assertIsNotNone(first)
        self.assertIsNotNone(second)
        self.assertIsNone(third)
        self.assertEqual(self.factory.refused, 1)
        self.assertEqual(self.factory.openConnections(), 2)
        first.connectionLost(None)  # type: ignore[attr-defined]
        fourth, _ = self.connect()
        self.assertIsNotNone(fourth)
        for proto in list(self.factory.protocols):
            proto.connectionLost(None)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_idle_aborts(self) -> None:
        """A connection with no byte either way for idleTimeout is aborted."""
        proto, transport = self.connect()
        self.clock.advance(9)
        self.assertFalse(transport.disconnecting)
        self.clock.advance(1)
        self.assertTrue(transport.disconnecting)
        proto.connectionLost(None)  # type: ignore[attr-defined]
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_idle_resetByTraffic(self) -> None:
        """Bytes in either direction push the idle deadline back."""
        proto, transport = self.connect()
        self.clock.advance(8)
        proto.dataReceived(b"x")  # type: ignore[attr-defined]
        self.clock.advance(8)
        proto.write(b"y")  # type: ignore[attr-defined]
        self.clock.advance(8)
        self.assertFalse(transport.disconnecting)
        self.assertEqual(proto.wrappedProtocol.received, [b"x"])  # type: ignore[attr-defined]
        self.clock.advance(2)
        self.assertTrue(transport.disconnecting)
        proto.connectionLost(None)  # type: ignore[attr-defined]

    def test_connectionLost_cancelsTimer(self) -> None:
        """Whoever arms the idle timer cancels it when the connection ends."""
        proto, _ = self.connect()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        proto.connectionLost(None)  # type: ignore[attr-defined]
        self.assertEqual(self.clock.getDelayedCalls(), [])


class PerSourceTests(SynchronousTestCase):
    def test_maxPerSource_oneAddressCannotHoldEverySlot(self) -> None:
        """
        One address gets at most maxPerSource connections; others still
        connect; closing one gives the address its slot back.
        """
        factory = LimitedFactory(
            Factory.forProtocol(Recorder),
            name="boot",
            clock=Clock(),
            maxConnections=10,
            maxPerSource=2,
            idleTimeout=10,
        )
        a = IPv4Address("TCP", "10.0.0.1", 1)
        b = IPv4Address("TCP", "10.0.0.2", 1)
        first, second = factory.buildProtocol(a), factory.buildProtocol(a)
        for proto in (first, second):
            proto.makeConnection(StringTransport())
        self.assertIsNone(factory.buildProtocol(a))
        other = factory.buildProtocol(b)
        self.assertIsNotNone(other)
        other.makeConnection(StringTransport())
        first.connectionLost(None)
        self.assertIsNotNone(factory.buildProtocol(a))

    def test_refusals_logThrottled(self) -> None:
        """A refusal flood logs one warning per interval, with the count."""
        clock = Clock()
        factory = LimitedFactory(
            Factory.forProtocol(Recorder),
            name="boot",
            clock=clock,
            maxConnections=1,
            idleTimeout=10,
        )
        factory.buildProtocol(ADDR).makeConnection(StringTransport())
        with capturedLogs() as events:
            for _ in range(500):
                self.assertIsNone(factory.buildProtocol(ADDR))
            clock.advance(10)
            self.assertIsNone(factory.buildProtocol(ADDR))
        warnings = [
            e for e in events if e["log_format"].startswith("listen.connection")
        ]
        self.assertEqual([e["count"] for e in warnings], [1, 500])
        self.assertEqual(factory.refused, 501)


class TLSOptionsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.pki = ensureDevPKI(Path(self.mktemp()), "enroll.lolwtf.ca")

    def files(self) -> TLSFiles:
        return TLSFiles(self.pki.public_cert, self.pki.public_key, self.pki.public_ca)

    def test_load_ecdsaAndRSA(self) -> None:
        """ECDSA and RSA certificates are both accepted."""
        loadTLSOptions(self.files()).getContext()
        rsa = ensureDevPKI(Path(self.mktemp()), "enroll.lolwtf.ca", keyType="rsa")
        loadTLSOptions(TLSFiles(rsa.public_cert, rsa.public_key)).getContext()

    def test_load_alpnAndClientCA(self) -> None:
        """ALPN and an owner CA for client certificates are accepted options."""
        options = loadTLSOptions(self.files(), alpn=[b"h2"], clientCA=self.pki.owner_ca)
        options.getContext()

    def test_mismatchedKey_namesKey(self) -> None:
        """A key that does not match the certificate is refused as tls.key."""
        e = self.assertRaises(
            ConfigError,
            loadTLSOptions,
            TLSFiles(self.pki.public_cert, self.pki.owner_key),
        )
        self.assertEqual(e.key, "tls.key")

    def test_missingOrBadFiles_nameKeys(self) -> None:
        """Missing or non-PEM files name their keys."""
        e = self.assertRaises(
            ConfigError,
            loadTLSOptions,
            TLSFiles(Path("/nonexistent"), self.pki.public_key),
        )
        self.assertEqual(e.key, "tls.cert")
        junk = Path(self.mktemp())
        junk.write_bytes(b"not pem")
        e = self.assertRaises(ConfigError, loadCertificates, "tls.chain", junk)
        self.assertEqual(e.key, "tls.chain")
        e = self.assertRaises(
            ConfigError, loadTLSOptions, TLSFiles(self.pki.public_cert, junk)
        )
        self.assertEqual(e.key, "tls.key")
