"""
Control-frame floods and clients that do not read on the tink listener
(issue 17, item 6; [A4], design.md, Listeners): the PING/SETTINGS rate,
what counts as progress, and the pause (fleetd stops reading while its
replies are unread), on fake and on real TLS transports.
"""

from __future__ import annotations

import socket
import ssl
from typing import cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from h2.errors import ErrorCodes
from h2.events import DataReceived, PingAckReceived, ResponseReceived, TrailersReceived
from h2.settings import SettingCodes
from hyperframe.frame import PingFrame, SettingsFrame
from OpenSSL import crypto
from twisted.internet import ssl as tssl
from twisted.internet.address import IPv4Address
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.h2.guard import H2Limits
from fleetd.h2.listener import TinkListenerFactory
from tests.h2support import (
    PREFACE,
    Harness,
    RecordingHandler,
    calm,
    counted,
    grpcMessage,
    guarded,
    selfSignedCertificate,
)


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
            limits=H2Limits(
                controlBurst=1e9, controlRate=1e9, frameBurst=1e9, frameRate=1e9
            ),
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
