"""Tests for L{fleetd.listen}: TLS options and connection limits."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Any, cast

from twisted.internet import reactor
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.config import ConfigError, TLSFiles
from fleetd.listen.connections import LimitedFactory, connectionSource
from fleetd.listen.tls import loadCertificates, loadTLSOptions, tlsFactory
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI

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

    def test_idle_closesLoggedAtMostTenPer10s(self) -> None:
        """
        Many idle connections closed at once log at most ten lines per
        10 s per listener, then one line counting the others.
        """
        factory = LimitedFactory(
            Factory.forProtocol(Recorder), name="boot", clock=self.clock,
            maxConnections=100, idleTimeout=10,
        )  # fmt: skip
        protocols = []
        for _ in range(30):
            proto = factory.buildProtocol(ADDR)
            proto.makeConnection(StringTransport())
            protocols.append(proto)
        with capturedLogs() as events:
            self.clock.advance(10)
            self.clock.advance(10)
            proto = factory.buildProtocol(ADDR)
            proto.makeConnection(StringTransport())
            protocols.append(proto)
            self.clock.advance(10)
        lines = [e for e in events if "listen.idle-timeout" in e["log_format"]]
        self.assertEqual(len(lines), 11)
        self.assertEqual(lines[-1].get("suppressed"), 20)
        for proto in protocols:
            proto.connectionLost(None)
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

    def test_idle_oneSweepPerListener_eachAtItsOwnDeadline(self) -> None:
        """
        However many connections are open, the listener holds one timer;
        each idle connection is still dropped at its own deadline, and the
        timer goes when the last connection does.
        """
        self.factory.maxConnections = self.factory.maxPerSource = 10
        first, firstT = self.connect()
        self.clock.advance(3)
        second, secondT = self.connect()
        self.clock.advance(3)
        third, thirdT = self.connect()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(3.5)  # t = 9.5
        third.dataReceived(b"x")  # type: ignore[attr-defined]
        self.clock.advance(0.5)  # t = 10: the first one's deadline
        self.assertEqual(
            [t.disconnecting for t in (firstT, secondT, thirdT)], [True, False, False]
        )
        first.connectionLost(None)  # type: ignore[attr-defined]
        self.clock.advance(2.9)  # t = 12.9
        self.assertFalse(secondT.disconnecting)
        self.clock.advance(0.1)  # t = 13
        self.assertEqual([t.disconnecting for t in (secondT, thirdT)], [True, False])
        second.connectionLost(None)  # type: ignore[attr-defined]
        self.clock.advance(6.4)  # t = 19.4
        self.assertFalse(thirdT.disconnecting)
        self.clock.advance(0.1)  # t = 19.5
        self.assertTrue(thirdT.disconnecting)
        self.assertEqual(len(self.clock.getDelayedCalls()), 0)
        third.connectionLost(None)  # type: ignore[attr-defined]
        self.assertEqual(self.clock.getDelayedCalls(), [])
        fourth, fourthT = self.connect()  # a new connection arms it again
        self.clock.advance(10)
        self.assertTrue(fourthT.disconnecting)
        fourth.connectionLost(None)  # type: ignore[attr-defined]
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_wrapperProvidesTransportInterfaces(self) -> None:
        """
        The limit wrapper still looks like its transport (what TLS and HTTP
        adapt it to), connection after connection and per transport class,
        though the declaration is built once per class.
        """
        from twisted.internet.interfaces import IPushProducer, ITCPTransport
        from zope.interface import implementer

        @implementer(ITCPTransport)  # declared only: the wrapper copies declarations
        class TCPish(StringTransport):  # type: ignore[misc]
            pass

        for _ in range(2):
            proto, _ = self.connect()
            self.assertTrue(IPushProducer.providedBy(proto))
            self.assertFalse(ITCPTransport.providedBy(proto))
            tcp = self.factory.buildProtocol(ADDR)
            tcp.makeConnection(TCPish())
            self.assertTrue(ITCPTransport.providedBy(tcp))
            for p in (proto, tcp):
                cast(Any, p).connectionLost(None)

    def test_connectionLost_cancelsTimer(self) -> None:
        """The idle sweep's timer goes when the last connection ends."""
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


class SourceKeyTests(SynchronousTestCase):
    """Which connections count as one source for the per-source cap."""

    def test_ipv6_groupedBy64(self) -> None:
        """
        IPv6 addresses in one /64 are one source; another /64 is another;
        IPv4 addresses are their own; IPv4-mapped IPv6 counts as IPv4; a
        zone index is ignored.
        """
        key = connectionSource
        a = key(IPv6Address("TCP", "2001:db8:1:2::1", 1))
        self.assertEqual(a, "2001:db8:1:2::/64")
        self.assertEqual(key(IPv6Address("TCP", "2001:db8:1:2:ffff:1:2:3", 9)), a)
        self.assertNotEqual(key(IPv6Address("TCP", "2001:db8:1:3::1", 1)), a)
        self.assertEqual(key(IPv4Address("TCP", "10.0.0.1", 1)), "10.0.0.1")
        self.assertNotEqual(
            key(IPv4Address("TCP", "10.0.0.2", 1)),
            key(IPv4Address("TCP", "10.0.0.1", 1)),
        )
        self.assertEqual(key(IPv6Address("TCP", "::ffff:10.0.0.1", 1)), "10.0.0.1")
        self.assertEqual(key(IPv6Address("TCP", "fe80::1%eth0", 1)), "fe80::/64")
        self.assertEqual(key(None), "")

    def test_maxPerSource_ipv6Slash64IsOneSource(self) -> None:
        """
        Per-source caps count an IPv6 /64 as one source: rotating through
        addresses of one /64 does not get past the cap; another /64 does.
        """
        factory = LimitedFactory(
            Factory.forProtocol(Recorder),
            name="boot",
            clock=Clock(),
            maxConnections=100,
            maxPerSource=3,
            idleTimeout=10,
        )
        opened = []
        for i in range(1, 10):
            proto = factory.buildProtocol(IPv6Address("TCP", f"2001:db8::{i:x}", 1))
            if proto is not None:
                proto.makeConnection(StringTransport())
                opened.append(proto)
        self.assertEqual(len(opened), 3)
        other = factory.buildProtocol(IPv6Address("TCP", "2001:db8:0:1::1", 1))
        self.assertIsNotNone(other)
        opened[0].connectionLost(None)
        self.assertIsNotNone(
            factory.buildProtocol(IPv6Address("TCP", "2001:db8::ff", 1))
        )


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

    def test_tlsLayer_providesTransportInterfaces_oneDeclaration(self) -> None:
        """
        fleetd's TLS layer (which builds its declaration once per kind of
        transport) provides exactly what Twisted's own TLS protocol would
        on the same transport, connection after connection.
        """
        from twisted.internet.interfaces import IPushProducer, ITCPTransport
        from zope.interface import implementer, providedBy

        @implementer(ITCPTransport)  # declared only: the wrappers copy declarations
        class TCPish(StringTransport):  # type: ignore[misc]
            pass

        factory = tlsFactory(
            loadTLSOptions(self.files()),
            Factory.forProtocol(Protocol),
            name="t",
            clock=Clock(),
            maxConnections=10,
            idleTimeout=30.0,
        )
        layers = []
        for _ in range(2):
            limited: Any = factory.buildProtocol(ADDR)
            limited.makeConnection(TCPish())
            tls = limited.wrappedProtocol
            self.assertIsInstance(tls, TLSMemoryBIOProtocol)
            self.assertTrue(ITCPTransport.providedBy(tls))
            self.assertTrue(IPushProducer.providedBy(tls))
            # What Twisted's own TLS protocol would provide on that transport:
            stock = TLSMemoryBIOProtocol(tls.factory, Protocol())
            stock.makeConnection(limited)
            self.assertEqual(
                set(providedBy(tls).flattened()), set(providedBy(stock).flattened())
            )
            self.assertIs(tls.wrappedProtocol.transport, tls)
            layers.append(tls)
        for layer in layers:
            layer.transport.connectionLost(None)

    def test_tlsLayer_readsOnlyWhatTheBIOHolds(self) -> None:
        """
        fleetd's TLS layer hands its transport every byte OpenSSL wrote (a
        client completes the handshake and reads a 100,000-byte answer
        whole), and never reads its outgoing memory BIO when it is empty
        (where pyOpenSSL raises, and Twisted's own layer catches that some
        five times a connection).
        """
        from OpenSSL import SSL

        from fleetd.listen.tls import _BIO_LENGTH

        self.assertIsNotNone(_BIO_LENGTH, "this pyOpenSSL hides the BIO's length")
        answer = bytes(range(256)) * 390 + b"end"

        class Answer(Protocol):
            def dataReceived(self, data: bytes) -> None:
                self.transport.write(answer)  # type: ignore[union-attr]

        factory = tlsFactory(
            loadTLSOptions(self.files()),
            Factory.forProtocol(Answer),
            name="t",
            clock=Clock(),
            maxConnections=10,
            idleTimeout=30.0,
        )
        limited: Any = factory.buildProtocol(ADDR)
        transport = StringTransport()
        limited.makeConnection(transport)
        connection = limited.wrappedProtocol._tlsConnection
        read, empty = connection.bio_read, []

        def spy(size: int) -> bytes:
            try:
                return cast(bytes, read(size))
            except SSL.WantReadError:
                empty.append(size)
                raise

        connection.bio_read = spy
        client = SSL.Connection(SSL.Context(SSL.TLS_CLIENT_METHOD), None)
        client.set_connect_state()

        def exchange() -> None:
            while True:
                try:
                    limited.dataReceived(client.bio_read(65536))
                except SSL.WantReadError:
                    break
            client.bio_write(transport.value())
            transport.clear()

        for _ in range(3):
            try:
                client.do_handshake()
                break
            except SSL.WantReadError:
                exchange()
        client.send(b"ask")
        exchange()
        received = b""
        while len(received) < len(answer):
            received += client.recv(65536)
        self.assertEqual(received, answer)
        self.assertEqual(empty, [])
        limited.connectionLost(None)

    def test_tlsLayer_waitsForTheClientsHello(self) -> None:
        """
        fleetd's (server) TLS layer takes no handshake step before the
        client's hello (OpenSSL could only say it wants to read), and
        answers that hello with its own flight.
        """
        from OpenSSL import SSL

        factory = tlsFactory(
            loadTLSOptions(self.files()),
            Factory.forProtocol(Protocol),
            name="t",
            clock=Clock(),
            maxConnections=10,
            idleTimeout=30.0,
        )
        steps: list[int] = []
        original = SSL.Connection.do_handshake

        def counted(connection: SSL.Connection) -> None:
            steps.append(1)
            original(connection)

        self.patch(SSL.Connection, "do_handshake", counted)
        limited: Any = factory.buildProtocol(ADDR)
        transport = StringTransport()
        limited.makeConnection(transport)
        self.assertEqual((steps, transport.value()), ([], b""))
        client = SSL.Connection(SSL.Context(SSL.TLS_CLIENT_METHOD), None)
        client.set_connect_state()
        with self.assertRaises(SSL.WantReadError):
            original(client)
        limited.dataReceived(client.bio_read(65536))
        self.assertEqual(len(steps), 1)
        self.assertEqual(transport.value()[:1], b"\x16")  # a handshake record
        limited.connectionLost(None)

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


def handshake(
    port: int,
    ca: Path,
    ciphers: str | None = None,
    maxVersion: ssl.TLSVersion | None = None,
    minVersion: ssl.TLSVersion | None = None,
) -> tuple[str, str]:
    """A real Python TLS client's handshake; (version, cipher) or SSLError."""
    context = ssl.create_default_context(cafile=str(ca))
    if ciphers is not None:
        context.set_ciphers(ciphers)  # raises if this OpenSSL lacks them all
    if maxVersion is not None:
        context.maximum_version = maxVersion
    if minVersion is not None:
        context.minimum_version = minVersion
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            version, cipher = tls.version(), tls.cipher()
            assert version is not None and cipher is not None
            return version, cipher[0]


class TLSSuiteTests(TestCase):
    """
    Real clients against a listener with fleetd's TLS options: TLS 1.2+,
    forward-secret AEAD suites only, ECDSA and RSA certificates ([A3] §2).
    """

    TLS12 = ssl.TLSVersion.TLSv1_2

    def listen(self, keyType: str) -> tuple[int, DevPKIPaths]:
        pki = ensureDevPKI(Path(self.mktemp()), "enroll.lolwtf.ca", keyType=keyType)
        options = loadTLSOptions(TLSFiles(pki.public_cert, pki.public_key))
        factory = TLSMemoryBIOFactory(options, False, Factory.forProtocol(Recorder))
        tcp: Any = reactor
        port = tcp.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return int(port.getHost().port), pki

    async def refused(self, port: int, pki: DevPKIPaths, ciphers: str) -> None:
        with self.assertRaises(ssl.SSLError):
            await deferToThread(handshake, port, pki.public_ca, ciphers, self.TLS12)

    async def test_rsaCertificate_onlyForwardSecretAEAD(self) -> None:
        """
        With an RSA certificate: static-RSA, CBC-SHA1, CBC-SHA256 and DHE
        suites are refused, ECDHE with AES-GCM or ChaCha20-Poly1305 works,
        TLS 1.3 works, TLS 1.1 is refused.
        """
        port, pki = self.listen("rsa")
        for weak in [
            "AES128-SHA",  # static RSA, CBC, SHA-1
            "AES128-GCM-SHA256",  # static RSA, AEAD: no forward secrecy
            "ECDHE-RSA-AES128-SHA",  # CBC with SHA-1
            "ECDHE-RSA-AES128-SHA256",  # CBC
            "DHE-RSA-AES128-GCM-SHA256",  # finite-field DHE
        ]:
            await self.refused(port, pki, weak)
        for good in [
            "ECDHE-RSA-AES128-GCM-SHA256",
            "ECDHE-RSA-AES256-GCM-SHA384",
            "ECDHE-RSA-CHACHA20-POLY1305",
        ]:
            result = await deferToThread(
                handshake, port, pki.public_ca, good, self.TLS12
            )
            self.assertEqual(result, ("TLSv1.2", good))
        version, _ = await deferToThread(handshake, port, pki.public_ca)
        self.assertEqual(version, "TLSv1.3")
        with self.assertRaises(ssl.SSLError):
            await deferToThread(
                handshake, port, pki.public_ca, "ALL:@SECLEVEL=0",
                ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1,
            )  # fmt: skip

    async def test_ecdsaCertificate_onlyForwardSecretAEAD(self) -> None:
        """With an ECDSA certificate: ECDHE-ECDSA CBC suites are refused,
        AES-GCM and ChaCha20-Poly1305 work."""
        port, pki = self.listen("ecdsa")
        for weak in ["ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384"]:
            await self.refused(port, pki, weak)
        for good in ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"]:
            result = await deferToThread(
                handshake, port, pki.public_ca, good, self.TLS12
            )
            self.assertEqual(result, ("TLSv1.2", good))
