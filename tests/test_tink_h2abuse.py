"""
What one HTTP/2 client may cost the tink listener (issue 17, items 5 and
6; [A4], DESIGN.md section 2): the CVE-2023-44487 rapid-reset budget and
its GOAWAY(ENHANCE_YOUR_CALM), upstream streams only for whole requests,
new streams per source, control-frame floods, and a client that does not
read its replies (the pause).
"""

from __future__ import annotations

import socket
import ssl
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAckReceived,
    RequestReceived,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
)
from h2.settings import SettingCodes
from hyperframe.frame import PingFrame, SettingsFrame
from OpenSSL import crypto
from twisted.internet import ssl as tssl
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.listen import LimitedFactory
from fleetd.tink import GRPCStatus, TinkListenerFactory
from fleetd.tink.h2guard import H2Limits, SourceStreams
from fleetd.tink.h2server import SLICE
from fleetd.tink.metrics import TinkMetrics
from tests.test_tink_h2proxy import Site
from tests.test_tink_listener import (
    PREFACE,
    Harness,
    RecordingHandler,
    grpcHeaders,
    grpcMessage,
    selfSignedCertificate,
)

CALM = "tink.h2.enhance-your-calm {reason}"


def counted(metrics: TinkMetrics, kind: str) -> float:
    value: float = metrics.h2Abuse.labels(kind)._value.get()
    return value


def calm(h: Harness) -> list[ConnectionTerminated]:
    return [
        e
        for e in h.of(ConnectionTerminated)
        if e.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    ]


def guarded(limits: H2Limits, handler: Any = RecordingHandler, **kw: Any) -> Harness:
    """A L{Harness} whose server counts abuse in C{h.metrics}."""
    metrics = TinkMetrics()
    h = Harness(handler, handshake=False, limits=limits, **kw)
    h.server.countAbuse = metrics.abuse
    h.metrics = metrics  # type: ignore[attr-defined]
    h.pump()
    return h


class RapidResetTests(SynchronousTestCase):
    """Wasted streams spend a per-connection budget (CVE-2023-44487)."""

    def test_resets_goawayEnhanceYourCalm(self) -> None:
        """Streams the client resets before an answer spend the budget; the
        one that empties it gets GOAWAY(ENHANCE_YOUR_CALM), the connection
        closes, open streams are reset, and it is logged and counted
        (issue 17 item 5, [A4]). Fed whole or one byte at a time."""
        for byteWise in (False, True):
            h = guarded(H2Limits(streamBudget=4), byteWise=byteWise)
            kept = h.call(end=False)
            for _ in range(3):
                sid = h.call(end=False)
                h.client.reset_stream(sid, ErrorCodes.CANCEL)
            h.pump()
            self.assertEqual(calm(h), [])
            self.assertFalse(h.transport.disconnecting)
            with capturedLogs() as events:
                sid = h.call(end=False)
                h.client.reset_stream(sid, ErrorCodes.CANCEL)
                h.pump()
            [goaway] = calm(h)
            self.assertEqual(goaway.last_stream_id, sid)
            self.assertTrue(h.transport.disconnecting)
            self.assertEqual(h.handlers[0].calls[-1], ("reset", ErrorCodes.CANCEL))
            self.assertEqual(h.handlers[0].responder.streamId, kept)
            metrics = h.metrics  # type: ignore[attr-defined]
            self.assertEqual(counted(metrics, "reset"), 4)
            self.assertEqual(counted(metrics, "stream-budget"), 1)
            [line] = [e for e in events if e["log_format"] == CALM]
            self.assertEqual(line["reason"], "stream-budget")
            h.close()

    def test_calm_stopsReadingThenCutOff(self) -> None:
        """After GOAWAY(ENHANCE_YOUR_CALM) nothing more is read (a TLS
        close would read on, waiting for the client's close_notify), and
        the connection is aborted once closeGrace passed; a connection lost
        before that leaves no timer (issue 17 item 5)."""
        for lostFirst in (False, True):
            h = guarded(H2Limits(streamBudget=1, closeGrace=1.0))
            sid = h.call(end=False)
            h.client.reset_stream(sid, ErrorCodes.CANCEL)
            h.pump()
            self.assertEqual(len(calm(h)), 1)
            self.assertEqual(h.transport.producerState, "paused")
            self.assertFalse(h.transport.disconnected)
            if lostFirst:
                h.close()
                self.assertEqual(h.clock.getDelayedCalls(), [])
                continue
            h.clock.advance(1.0)
            self.assertTrue(h.transport.disconnected)
            h.close()
            self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_floodInOneRead_parsedOnlyUntilClose(self) -> None:
        """A read holding 1000 reset streams is parsed a slice at a time:
        once the budget closed the connection, the rest is never parsed
        (its cost is the slices up to the close) (issue 17 item 5)."""
        h = guarded(H2Limits(streamBudget=8))
        for _ in range(1000):
            sid = h.call(end=False)
            h.client.reset_stream(sid, ErrorCodes.CANCEL)
        flood = h.client.data_to_send()
        self.assertGreater(len(flood), 4 * SLICE)
        h.server.dataReceived(flood)
        self.assertTrue(h.transport.disconnecting)
        self.assertLess(h.server.h2.highest_inbound_stream_id, sid // 4)
        h.close()

    def test_answeredCalls_earnBack(self) -> None:
        """A call answered after a whole request gives one unit back, so an
        agent that cancels now and then on a long-lived connection is not
        cut off (issue 17 item 5)."""
        h = guarded(H2Limits(streamBudget=4))
        for _ in range(3):
            sid = h.call(end=False)
            h.client.reset_stream(sid, ErrorCodes.CANCEL)
        h.call(body=grpcMessage(b"poll"))
        h.pump()
        h.handlers[-1].responder.trailersOnly(GRPCStatus.NOT_FOUND, "no action")
        sid = h.call(end=False)
        h.client.reset_stream(sid, ErrorCodes.CANCEL)
        h.pump()
        self.assertEqual(calm(h), [])
        sid = h.call(end=False)
        h.client.reset_stream(sid, ErrorCodes.CANCEL)
        h.pump()
        self.assertEqual(len(calm(h)), 1)
        h.close()

    def test_incompleteRequests_spendBudget(self) -> None:
        """A request that ends inside a message, or without any message,
        is wasted (issue 17 item 5)."""
        h = guarded(H2Limits(streamBudget=2))
        h.call(body=b"\x00\x00\x00\x00\x05ab")
        h.pump()
        self.assertEqual(calm(h), [])
        h.call(body=b"")
        h.pump()
        self.assertEqual(len(calm(h)), 1)
        self.assertEqual(counted(h.metrics, "incomplete"), 2)  # type: ignore[attr-defined]
        h.close()

    def test_refusedStreams_spendBudget(self) -> None:
        """Streams fleetd refuses (not gRPC) are wasted too (issue 17 item
        5)."""
        h = guarded(H2Limits(streamBudget=3))
        for _ in range(3):
            h.call(headers=grpcHeaders(contentType=b"text/plain"))
        h.pump()
        self.assertEqual(len(calm(h)), 1)
        self.assertEqual(counted(h.metrics, "refused"), 3)  # type: ignore[attr-defined]
        h.close()


def requests(site: Site) -> list[RequestReceived]:
    return [
        e
        for _, _, _, events in site.upstreams
        for e in events
        if isinstance(e, RequestReceived)
    ]


class WholeRequestTests(SynchronousTestCase):
    """The upstream stream opens only for a whole request (issue 17 item
    5): a reset stream costs tink-server nothing."""

    def test_resetBeforeWhole_upstreamNeverOpened(self) -> None:
        """Headers and part of a message, then RST_STREAM: tink-server is
        not even dialled."""
        site = Site()
        client = site.client
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, grpcHeaders())
        client.send_data(sid, grpcMessage(b"0123456789")[:8])
        client.reset_stream(sid, ErrorCodes.CANCEL)
        site.pump()
        self.assertEqual(site.upstreams, [])
        self.assertEqual(site.metrics.active, 0)

    def test_messageSplit_opensOnceWhole(self) -> None:
        """A message split over DATA frames opens the upstream stream when
        its last byte arrives, and all of it is forwarded."""
        site = Site()
        client = site.client
        sid = client.get_next_available_stream_id()
        message = grpcMessage(b"0123456789")
        client.send_headers(sid, grpcHeaders())
        client.send_data(sid, message[:6])
        site.pump()
        self.assertEqual(requests(site), [])
        client.send_data(sid, message[6:])
        site.pump()
        self.assertEqual(len(requests(site)), 1)
        data = b"".join(
            e.data for e in site.serverEvents() if isinstance(e, DataReceived)
        )
        self.assertEqual(data, message)

    def test_endStreamAlone_opens(self) -> None:
        """END_STREAM without a message is a whole request: forwarded."""
        site = Site()
        site.call(body=b"")
        self.assertEqual(len(requests(site)), 1)

    def test_rapidReset_upstreamSeesAtMostBudget(self) -> None:
        """An attacker sending whole requests and resetting each at once
        reaches tink-server with at most the budget of streams, then gets
        GOAWAY(ENHANCE_YOUR_CALM) (issue 17 item 5)."""
        site = Site(limits=H2Limits(streamBudget=8))
        client = site.client
        for _ in range(100):
            sid = client.get_next_available_stream_id()
            client.send_headers(sid, grpcHeaders())
            client.send_data(sid, grpcMessage(b"x"), end_stream=True)
            client.reset_stream(sid, ErrorCodes.CANCEL)
        site.pump()
        self.assertEqual(len(requests(site)), 8)
        [goaway] = site.of(ConnectionTerminated)
        self.assertEqual(goaway.error_code, ErrorCodes.ENHANCE_YOUR_CALM)
        resets = [e for e in site.serverEvents() if isinstance(e, StreamReset)]
        self.assertEqual(len(resets), 8)
        self.assertEqual(site.metrics.active, 0)


class Conn:
    """One client connection to a L{TinkListenerFactory} from C{peer}."""

    def __init__(self, factory: TinkListenerFactory, peer: Any) -> None:
        self.server = factory.buildProtocol(None)
        self.transport = StringTransport(peerAddress=peer)
        self.server.makeConnection(self.transport)
        self.client = H2Connection(
            H2Configuration(client_side=True, header_encoding=None)
        )
        self.client.initiate_connection()
        self.events: list[Event] = []
        self.pump()

    def pump(self) -> None:
        while True:
            out = self.client.data_to_send()
            if out:
                self.server.dataReceived(out)
            back = self.transport.value()
            self.transport.clear()
            if back:
                self.events += self.client.receive_data(back)
            if not out and not back:
                return

    def call(self) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, grpcHeaders())
        self.client.send_data(sid, grpcMessage(b"x"), end_stream=True)
        self.pump()
        return sid

    def refused(self, sid: int) -> bool:
        return any(
            isinstance(e, StreamReset)
            and e.stream_id == sid
            and e.error_code == ErrorCodes.REFUSED_STREAM
            for e in self.events
        )


class SourceLimitTests(SynchronousTestCase):
    """New streams per source, across connections (issue 17 item 5)."""

    def factory(self) -> tuple[TinkListenerFactory, Clock]:
        clock = Clock()
        return (
            TinkListenerFactory(clock, sourceStreamRate=0.5, sourceStreamBurst=3),
            clock,
        )

    def test_sameSource_refusedAcrossConnections(self) -> None:
        """A source's streams over its bucket are refused with
        REFUSED_STREAM (gRPC clients retry those), whichever connection
        they come on; another source is served; the bucket refills."""
        factory, clock = self.factory()
        peer = IPv4Address("TCP", "192.0.2.7", 40000)
        a, b = Conn(factory, peer), Conn(factory, peer)
        sids = [a.call(), a.call(), b.call()]
        self.assertFalse(any(a.refused(s) or b.refused(s) for s in sids))
        self.assertTrue(b.refused(b.call()))
        other = Conn(factory, IPv4Address("TCP", "192.0.2.8", 40000))
        self.assertFalse(other.refused(other.call()))
        clock.advance(2)
        self.assertFalse(a.refused(a.call()))

    def test_ipv6Slash64_oneSource(self) -> None:
        """Addresses of one IPv6 /64 are one source; the next /64 is
        another."""
        factory, _ = self.factory()
        conns = [
            Conn(factory, IPv6Address("TCP", f"2001:db8::{n}", 40000))
            for n in (1, 2, 3)
        ]
        for conn in conns:
            self.assertFalse(conn.refused(conn.call()))
        fourth = Conn(factory, IPv6Address("TCP", "2001:db8::ffff", 40000))
        self.assertTrue(fourth.refused(fourth.call()))
        elsewhere = Conn(factory, IPv6Address("TCP", "2001:db8:0:1::1", 40000))
        self.assertFalse(elsewhere.refused(elsewhere.call()))


class PenaltyTests(SynchronousTestCase):
    """A source whose connection was closed for abuse is kept away for a
    while, before any TLS work (issue 17 item 5)."""

    def test_penalty_doublesThenForgiven(self) -> None:
        """1 s at first, doubling with each repeat up to maxPenalty; a
        source quiet for maxPenalty after its last penalty starts at 1 s
        again."""
        clock = Clock()
        clock.advance(1000)
        sources = SourceStreams(clock, rate=1, burst=1, maxPenalty=8)
        self.assertEqual(
            [sources.penalize("192.0.2.7") for _ in range(5)], [1, 2, 4, 8, 8]
        )
        self.assertFalse(sources.admits("192.0.2.7"))
        self.assertTrue(sources.admits("192.0.2.8"))
        clock.advance(7.9)
        self.assertFalse(sources.admits("192.0.2.7"))
        clock.advance(0.1)
        self.assertTrue(sources.admits("192.0.2.7"))
        clock.advance(8)
        self.assertEqual(sources.penalize("192.0.2.7"), 1)

    def test_calm_sourceRefusedBeforeTLS(self) -> None:
        """After GOAWAY(ENHANCE_YOUR_CALM) the connection limits (which sit
        below TLS) refuse the source's next connection, as an IPv6 /64,
        logged and counted; other sources are accepted; after the penalty
        the source is accepted again."""
        clock = Clock()
        metrics = TinkMetrics()
        factory = TinkListenerFactory(
            clock,
            handlerFactory=RecordingHandler,
            limits=H2Limits(streamBudget=2),
            countAbuse=metrics.abuse,
        )
        limited = LimitedFactory(
            factory,
            name="tink",
            clock=clock,
            maxConnections=10,
            idleTimeout=300,
            admit=factory.admits,
        )
        conn = Conn(factory, IPv6Address("TCP", "2001:db8::1", 40000))
        with capturedLogs() as events:
            for _ in range(2):
                sid = conn.client.get_next_available_stream_id()
                conn.client.send_headers(sid, grpcHeaders())
                conn.client.reset_stream(sid, ErrorCodes.CANCEL)
            conn.pump()
        self.assertTrue(conn.transport.disconnecting)
        [line] = [
            e
            for e in events
            if e["log_format"] == "tink.h2.source-penalized {source} {seconds}"
        ]
        self.assertEqual(line["source"], "2001:db8::/64")
        self.assertEqual(counted(metrics, "penalty"), 1)
        same = IPv6Address("TCP", "2001:db8::2", 40000)
        self.assertIsNone(limited.buildProtocol(same))
        self.assertEqual(limited.refused, 1)
        other = IPv6Address("TCP", "2001:db8:1::1", 40000)
        self.assertIsNotNone(limited.buildProtocol(other))
        clock.advance(1)
        self.assertIsNotNone(limited.buildProtocol(same))


class ControlFrameTests(SynchronousTestCase):
    """PING and SETTINGS floods, and what counts as progress (issue 17
    item 6)."""

    def test_pingFlood_goawayEnhanceYourCalm(self) -> None:
        """PINGs over the connection's rate get GOAWAY(ENHANCE_YOUR_CALM);
        the bucket refills with time. (The client's first SETTINGS took
        one token of ten.)"""
        h = guarded(H2Limits(controlBurst=10, controlRate=1.0))
        for n in range(9):
            h.client.ping(b"%08d" % n)
        h.pump()
        self.assertEqual(len(h.of(PingAckReceived)), 9)
        h.clock.advance(1)
        h.client.ping(b"refilled")
        h.pump()
        self.assertEqual(calm(h), [])
        h.client.ping(b"one more")
        h.pump()
        self.assertEqual(len(calm(h)), 1)
        self.assertTrue(h.transport.disconnecting)
        self.assertEqual(counted(h.metrics, "control-frames"), 1)  # type: ignore[attr-defined]
        h.close()

    def test_settingsFlood_goawayEnhanceYourCalm(self) -> None:
        """SETTINGS frames draw from the same bucket."""
        h = guarded(H2Limits(controlBurst=5, controlRate=1.0))
        for _ in range(4):
            h.client.update_settings({SettingCodes.ENABLE_PUSH: 0})
        h.pump()
        self.assertEqual(calm(h), [])
        h.client.update_settings({SettingCodes.ENABLE_PUSH: 0})
        h.pump()
        self.assertEqual(len(calm(h)), 1)
        h.close()

    def test_pings_notProgress(self) -> None:
        """PINGs do not keep an idle connection open: it times out from
        its last request (issue 17 item 6)."""
        h = Harness(idleTimeout=30.0)
        h.clock.advance(20)
        h.client.ping(b"\x00" * 8)
        h.pump()
        h.clock.advance(10)
        self.assertTrue(h.transport.disconnecting)
        h.close()

    def test_emptyData_notProgress(self) -> None:
        """Empty DATA frames on an open stream are not progress either: the
        stream timeout counts from the last request byte."""
        h = Harness(RecordingHandler, idleTimeout=30.0, streamTimeout=100.0)
        sid = h.call(body=grpcMessage(b"x"), end=False)
        h.pump()
        for _ in range(5):
            h.clock.advance(19)
            h.client.send_data(sid, b"")
            h.pump()
        h.clock.advance(5)
        self.assertTrue(h.transport.disconnecting)
        h.close()


class PauseTests(SynchronousTestCase):
    """fleetd stops reading while its replies are unread (issue 17 item
    6)."""

    def test_producer_registeredOnFirstBytes(self) -> None:
        """The protocol becomes the transport's streaming producer with the
        client's first bytes (after a TLS handshake, which must never wait
        for a paused reader), not before."""
        h = Harness(handshake=False)
        self.assertIsNone(h.transport.producer)
        h.pump()
        self.assertIs(h.transport.producer, h.server)
        self.assertTrue(h.transport.streaming)
        h.close()

    def test_pause_stopsReadingAndHoldsReplies(self) -> None:
        """While the transport's buffer is full, reading stops and replies
        are held; once it drains they leave and reading resumes."""
        h = guarded(H2Limits())
        h.server.pauseProducing()
        self.assertEqual(h.transport.producerState, "paused")
        h.client.ping(b"held-ack")
        h.server.dataReceived(h.client.data_to_send())
        self.assertEqual(h.transport.value(), b"")
        h.server.resumeProducing()
        self.assertEqual(h.transport.producerState, "producing")
        h.pump()
        [ack] = h.of(PingAckReceived)
        self.assertEqual(ack.ping_data, b"held-ack")
        self.assertEqual(counted(h.metrics, "paused"), 1)  # type: ignore[attr-defined]
        h.close()

    def test_pause_responseWaits(self) -> None:
        """A response is not sent into a full buffer: its data and trailers
        wait (so the upstream's window, not fleetd's memory, holds them)
        and leave in order on resume."""
        h = guarded(H2Limits())
        sid = h.call(body=grpcMessage(b"x"))
        h.pump()
        responder = h.handlers[0].responder
        h.server.pauseProducing()
        responder.sendHeaders(
            [(b":status", b"200"), (b"content-type", b"application/grpc")]
        )
        responder.sendData(grpcMessage(b"answer"))
        responder.sendTrailers([(b"grpc-status", b"0")])
        self.assertEqual(h.transport.value(), b"")
        self.assertEqual(bytes(responder._outbound), grpcMessage(b"answer"))
        h.server.resumeProducing()
        h.pump()
        self.assertEqual(len(h.of(ResponseReceived, sid)), 1)
        [data] = h.of(DataReceived, sid)
        self.assertEqual(data.data, grpcMessage(b"answer"))
        self.assertEqual(len(h.of(TrailersReceived, sid)), 1)
        h.close()

    def test_unreadReplies_aborted(self) -> None:
        """More than maxUnreadBytes of replies held while paused aborts the
        connection (no GOAWAY could be read anyway), resetting its streams,
        logged and counted."""
        h = guarded(H2Limits(maxUnreadBytes=100))
        h.call(end=False)
        h.pump()
        h.server.pauseProducing()
        with capturedLogs() as events:
            for n in range(6):  # 6 ACKs of 17 bytes
                h.server.dataReceived(ping(b"%08d" % n))
        self.assertTrue(h.transport.disconnected)
        self.assertEqual(h.handlers[0].calls[-1], ("reset", ErrorCodes.CANCEL))
        self.assertEqual(counted(h.metrics, "unread"), 1)  # type: ignore[attr-defined]
        [line] = [
            e for e in events if e["log_format"] == "tink.h2.unread-replies {held}"
        ]
        self.assertGreater(line["held"], 100)
        h.close()

    def test_timeoutWhilePaused_aborted(self) -> None:
        """A paused connection that times out is aborted, not left waiting
        for a reader that never comes."""
        h = guarded(H2Limits(), idleTimeout=30.0)
        h.server.pauseProducing()
        h.clock.advance(30)
        self.assertTrue(h.transport.disconnected)
        h.close()


def ping(data: bytes) -> bytes:
    frame = PingFrame(0)
    frame.opaque_data = data
    return frame.serialize()


def pingFlood(port: int, certPEM: bytes, total: int) -> tuple[int, str]:
    """Send the preface, SETTINGS and C{total} bytes of PINGs over TLS,
    reading nothing; return the bytes sent and how sending ended."""
    context = ssl.create_default_context(cadata=certPEM.decode())
    context.set_alpn_protocols(["h2"])
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Before connecting, so the kernel cannot grow the window to tens of
    # MiB (tcp_rmem) and read the replies for us.
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(30)
    raw.connect(("127.0.0.1", port))
    with context.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(PREFACE + SettingsFrame(0).serialize())
        chunk = ping(b"12345678") * 4096
        sent = 0
        try:
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError as e:
            return sent, type(e).__name__
        return sent, "completed"


class RealSocketPauseTests(TestCase):
    """The pause through Twisted's real TLS and TCP transports."""

    async def test_pingFlood_notRead_pausedAndClosed(self) -> None:
        """A client that floods PINGs over TLS and reads nothing makes
        fleetd stop reading (it is the TLS transport's producer) and close
        the connection once its replies stay unread, long before 16 MiB
        were taken in (issue 17 item 6)."""
        from twisted.internet import reactor

        keyPEM, certPEM = selfSignedCertificate()
        options = tssl.CertificateOptions(
            privateKey=crypto.PKey.from_cryptography_key(
                serialization.load_pem_private_key(keyPEM, None)  # type: ignore[arg-type]
            ),
            certificate=crypto.X509.from_cryptography(
                x509.load_pem_x509_certificate(certPEM)
            ),
            acceptableProtocols=[b"h2"],
        )
        kinds: list[str] = []
        listener = TinkListenerFactory(
            reactor,
            idleTimeout=2.0,
            limits=H2Limits(controlBurst=1e9, controlRate=1e9),
            countAbuse=kinds.append,
        )
        tls = TLSMemoryBIOFactory(options, False, listener)
        port = reactor.listenTCP(0, tls, interface="127.0.0.1")  # type: ignore[arg-type]
        # Accepted sockets inherit these: the kernel then holds little of
        # what either side does not read, so the buffers that fill are
        # fleetd's own, and the client feels the pause.
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            port.socket.setsockopt(socket.SOL_SOCKET, option, 4096)  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        total = 16 << 20
        number = cast(IPv4Address, port.getHost()).port
        sent, how = await deferToThread(pingFlood, number, certPEM, total)
        for _ in range(500):
            if not listener.protocols:
                break
            await deferLater(reactor, 0.01, lambda: None)
        left = list(listener.protocols)
        for protocol in left:  # leave the reactor clean, then fail
            protocol.transport.abortConnection()  # type: ignore[union-attr]
        self.assertEqual(left, [])
        self.assertNotEqual(how, "completed")
        self.assertLess(sent, total)
        self.assertIn("paused", kinds)
