"""Tests for the tink listener's HTTP/2 server protocol ([A4])."""

from __future__ import annotations

import socket
import ssl
from typing import Any, cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from h2.config import H2Configuration
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from h2.settings import SettingCodes
from hypothesis import given, settings
from hypothesis import strategies as st
from OpenSSL import crypto
from twisted.internet import ssl as tssl
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.h2.grpcwire import GRPCStatus, MessageSizeGuard, encodeGrpcMessage
from fleetd.h2.listener import TinkListenerFactory, UnimplementedHandler
from fleetd.h2.server import H2ServerProtocol
from fleetd.h2.stream import Headers
from tests.h2support import (
    PATH,
    PREFACE,
    Harness,
    RecordingHandler,
    grpcHeaders,
    grpcMessage,
    selfSignedCertificate,
)


class UnimplementedTests(SynchronousTestCase):
    """Every gRPC call is answered Trailers-Only UNIMPLEMENTED ([A4])."""

    def assertUnimplemented(self, h: Harness, sid: int) -> None:
        headers = h.response(sid)
        self.assertEqual(headers[b":status"], b"200")
        self.assertEqual(headers[b"content-type"], b"application/grpc")
        self.assertEqual(headers[b"grpc-status"], b"12")
        self.assertEqual(
            headers[b"grpc-message"],
            b"fleetd: /proto.WorkflowService/GetAction is not served yet",
        )
        [response] = h.of(ResponseReceived, sid)
        self.assertIsNotNone(response.stream_ended)
        self.assertEqual(h.of(DataReceived, sid), [])
        self.assertEqual(h.of(TrailersReceived, sid), [])

    def test_unaryCall_trailersOnly(self) -> None:
        """A unary call gets one HEADERS frame with grpc-status 12 and
        END_STREAM: a Trailers-Only response [A4]."""
        h = Harness()
        sid = h.call(body=grpcMessage(b"\x0a\x02id"))
        h.pump()
        self.assertUnimplemented(h, sid)
        self.assertEqual(h.of(StreamReset, sid), [])
        h.close()

    def test_unaryCall_oneByteAtATime(self) -> None:
        """Fed one byte at a time, the server answers the same way [A4]."""
        h = Harness(byteWise=True)
        sid = h.call(body=grpcMessage(b"\x0a\x02id"))
        h.pump()
        self.assertUnimplemented(h, sid)
        h.close()

    def test_streamingCall_answeredBeforeClientEnds(self) -> None:
        """A streaming call that has not half-closed is answered at once,
        then reset with NO_ERROR as the gRPC spec asks, whole or fed one
        byte at a time [A4]."""
        for byteWise in (False, True):
            h = Harness(byteWise=byteWise)
            sid = h.call(body=grpcMessage(b"one"), end=False)
            h.pump()
            self.assertUnimplemented(h, sid)
            [reset] = h.of(StreamReset, sid)
            self.assertEqual(reset.error_code, ErrorCodes.NO_ERROR)
            h.close()

    def test_manyCalls_oneConnection(self) -> None:
        """Successive polls on one connection each get their answer, as
        tink-agent polls on one long-lived connection [A4]."""
        h = Harness()
        sids = [h.call(body=grpcMessage(b"x")) for _ in range(5)]
        h.pump()
        for sid in sids:
            self.assertUnimplemented(h, sid)
        h.close()

    def test_logged_stableEventName(self) -> None:
        """The refusal is logged under a stable event name with the path as
        a named field."""
        h = Harness()
        with capturedLogs() as events:
            h.call()
            h.pump()
        [event] = [e for e in events if e["log_format"] == "tink.unimplemented {path}"]
        self.assertEqual(event["path"], PATH.decode())
        h.close()

    def test_connected_logsSource(self) -> None:
        """Each connection is logged with the address it came from, the
        source fleetd's per-source limits count."""
        factory = TinkListenerFactory(Clock())
        with capturedLogs() as events:
            h = Harness(server=factory.buildProtocol(None))
        [event] = [e for e in events if e["log_format"] == "tink.connected {source}"]
        self.assertEqual(event["source"], "192.168.1.1")  # StringTransport's peer
        h.close()

    def test_logged_rateLimitedAcrossConnections(self) -> None:
        """
        A flood of calls over many connections of one listener logs at most
        ten C{tink.unimplemented} lines per 10 s, then counts the rest; the
        not-gRPC refusals are limited the same way.
        """
        clock = Clock()
        factory = TinkListenerFactory(clock)
        with capturedLogs() as events:
            for _ in range(5):
                h = Harness(server=factory.buildProtocol(None))
                for _ in range(10):
                    h.call()
                    h.call(grpcHeaders(contentType=b"text/plain"))
                h.pump()
                h.close()
            clock.advance(10)
            h = Harness(server=factory.buildProtocol(None))
            h.call()
            h.pump()
            h.close()
        unimplemented = [e for e in events if "tink.unimplemented" in e["log_format"]]
        notGrpc = [e for e in events if "tink.h2.not-grpc" in e["log_format"]]
        self.assertEqual(len(unimplemented), 11)
        self.assertEqual(unimplemented[-1]["suppressed"], 40)
        self.assertEqual(len(notGrpc), 10)


class NotGrpcTests(SynchronousTestCase):
    """Requests that are not gRPC are refused like grpc-go does."""

    def test_contentType_415(self) -> None:
        """A non-gRPC content-type gets :status 415 with END_STREAM."""
        h = Harness()
        sid = h.call(grpcHeaders(contentType=b"application/json"), body=b"{}")
        h.pump()
        headers = h.response(sid)
        self.assertEqual(headers[b":status"], b"415")
        self.assertEqual(headers[b"grpc-status"], b"%d" % GRPCStatus.INVALID_ARGUMENT)
        self.assertIsNotNone(h.of(ResponseReceived, sid)[0].stream_ended)
        self.assertEqual(h.handlers, [])
        h.close()

    def test_method_405(self) -> None:
        """A GET gets :status 405 with END_STREAM."""
        h = Harness()
        sid = h.call(grpcHeaders(method=b"GET"))
        h.pump()
        self.assertEqual(h.response(sid)[b":status"], b"405")
        self.assertIsNotNone(h.of(ResponseReceived, sid)[0].stream_ended)
        h.close()

    def test_missingPath_goaway(self) -> None:
        """A request without :path is a protocol error: GOAWAY
        PROTOCOL_ERROR and the connection is closed, without a traceback."""
        h = Harness(
            clientConfig=H2Configuration(
                client_side=True, header_encoding=None, validate_outbound_headers=False
            )
        )
        headers = [kv for kv in grpcHeaders() if kv[0] != b":path"]
        h.call(headers)
        h.pump()
        [goaway] = h.of(ConnectionTerminated)
        self.assertEqual(goaway.error_code, ErrorCodes.PROTOCOL_ERROR)
        self.assertTrue(h.transport.disconnecting)
        h.close()
        self.assertEqual(h.clock.getDelayedCalls(), [])


class ConnectionTests(SynchronousTestCase):
    """Prefaces, garbage, PING, GOAWAY, SETTINGS and limits."""

    def test_http11Preface_closed(self) -> None:
        """An HTTP/1.1 request instead of the HTTP/2 preface closes the
        connection."""
        for byteWise in (False, True):
            clock = Clock()
            server = H2ServerProtocol(UnimplementedHandler, clock=clock)
            transport = StringTransport()
            server.makeConnection(transport)
            request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
            if byteWise:
                for i in range(len(request)):
                    server.dataReceived(request[i : i + 1])
            else:
                server.dataReceived(request)
            self.assertTrue(transport.disconnecting)
            server.connectionLost(None)
            self.assertEqual(clock.getDelayedCalls(), [])

    @settings(max_examples=200, deadline=None)
    @given(st.binary(min_size=1, max_size=200), st.booleans())
    def test_garbage_closedWithoutException(
        self, junk: bytes, afterPreface: bool
    ) -> None:
        """Arbitrary bytes, as preface or after a valid preface, never raise
        out of the protocol; the connection ends up closed or still sane."""
        clock = Clock()
        server = H2ServerProtocol(UnimplementedHandler, clock=clock)
        transport = StringTransport()
        server.makeConnection(transport)
        server.dataReceived((PREFACE if afterPreface else b"") + junk)
        if not afterPreface and not PREFACE.startswith(junk):
            self.assertTrue(transport.disconnecting)
        server.connectionLost(None)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_garbageFrame_closed(self) -> None:
        """A malformed SETTINGS frame (length not a multiple of 6) after the
        preface is a connection error: GOAWAY, then close."""
        h = Harness()
        h.server.dataReceived(b"\x00\x00\x04\x04\x00\x00\x00\x00\x00junk")
        self.assertTrue(h.transport.disconnecting)
        h.close()

    def test_ping_answered(self) -> None:
        """A PING is ACKed with the same opaque data."""
        h = Harness()
        h.client.ping(b"12345678")
        h.pump()
        [ack] = h.of(PingAckReceived)
        self.assertEqual(ack.ping_data, b"12345678")
        h.close()

    def test_settings_advertised(self) -> None:
        """SETTINGS advertise maxConcurrentStreams and maxHeaderListSize from
        the first frame."""
        h = Harness(maxConcurrentStreams=7, maxHeaderListSize=4096)
        self.assertEqual(h.client.remote_settings.max_concurrent_streams, 7)
        self.assertEqual(h.client.remote_settings.max_header_list_size, 4096)
        h.close()

    def test_tooManyStreams_refused(self) -> None:
        """A client that opens more streams than advertised is stopped by h2
        (it treats this as a connection error: GOAWAY, then close)."""
        h = Harness(RecordingHandler, handshake=False, maxConcurrentStreams=2)
        for _ in range(3):
            h.call(end=False)
        h.pump()
        [goaway] = h.of(ConnectionTerminated)
        self.assertEqual(goaway.error_code, ErrorCodes.PROTOCOL_ERROR)
        self.assertTrue(h.transport.disconnecting)
        h.close()
        for handler in h.handlers:
            self.assertEqual(handler.calls[-1], ("reset", ErrorCodes.CANCEL))

    def test_oversizedHeaders_closed(self) -> None:
        """A header list over maxHeaderListSize ends the connection with
        GOAWAY ENHANCE_YOUR_CALM, without a traceback."""
        h = Harness(maxHeaderListSize=1024)
        h.call([*grpcHeaders(), (b"x-big", b"a" * 2048)])
        h.pump()
        [goaway] = h.of(ConnectionTerminated)
        self.assertEqual(goaway.error_code, ErrorCodes.ENHANCE_YOUR_CALM)
        self.assertTrue(h.transport.disconnecting)
        h.close()

    def test_clientGoaway_closesAndResets(self) -> None:
        """A GOAWAY from the client closes the connection; open handlers are
        reset when it is lost."""
        h = Harness(RecordingHandler)
        h.call(end=False)
        h.pump()
        h.client.close_connection()
        h.pump()
        self.assertTrue(h.transport.disconnecting)
        h.close()
        self.assertEqual(h.handlers[0].calls[-1], ("reset", ErrorCodes.CANCEL))

    def test_connectionLost_resetsHandlers(self) -> None:
        """On connectionLost every open handler gets reset and the idle timer
        is cancelled; later responder calls are ignored."""
        h = Harness(RecordingHandler)
        h.call(end=False)
        h.call(end=False)
        h.pump()
        h.close()
        for handler in h.handlers:
            self.assertEqual(handler.calls[-1], ("reset", ErrorCodes.CANCEL))
        h.handlers[0].responder.trailersOnly(GRPCStatus.OK)
        self.assertEqual(h.transport.value(), b"")
        self.assertEqual(h.clock.getDelayedCalls(), [])


class StreamTests(SynchronousTestCase):
    """Per-stream events, flow control and limits, through a handler."""

    def test_largeBody_drained(self) -> None:
        """A request body larger than the initial 65,535-byte windows is
        delivered in full: WINDOW_UPDATEs let the client finish."""
        h = Harness(RecordingHandler)
        sid = h.call(end=False)
        body = grpcMessage(b"a" * 300_000)
        sent = 0
        while sent < len(body):
            room = min(
                h.client.local_flow_control_window(sid),
                h.client.max_outbound_frame_size,
                len(body) - sent,
            )
            self.assertGreater(room, 0, "client stalled")
            h.client.send_data(sid, body[sent : sent + room])
            sent += room
            h.pump()
        h.client.end_stream(sid)
        h.pump()
        self.assertEqual(h.handlers[0].calls[-1], ("end", len(body)))
        self.assertTrue({0, sid} <= {e.stream_id for e in h.of(WindowUpdated)})
        h.close()

    def test_largeBody_unimplementedDrained(self) -> None:
        """Body bytes still arriving after the UNIMPLEMENTED answer are
        credited back to the connection, so later calls are not stalled
        [A4]."""
        h = Harness()
        total = 0
        for _ in range(5):
            sid = h.call(end=False)
            while window := h.client.local_flow_control_window(sid):
                size = min(window, h.client.max_outbound_frame_size)
                h.client.send_data(sid, b"b" * size)
                total += size
            h.pump()
            self.assertEqual(h.response(sid)[b"grpc-status"], b"12")
            # h2 returns credit in batches of at least half the window.
            self.assertGreaterEqual(h.client.outbound_flow_control_window, 32768)
        self.assertGreater(total, 4 * 65535)
        h.close()

    def test_largeResponse_flowControlled(self) -> None:
        """sendData buffers beyond the client's window and resumes on
        WINDOW_UPDATE; trailers follow the last byte."""
        h = Harness(RecordingHandler)
        sid = h.call()
        h.pump()
        responder = h.handlers[0].responder
        responder.sendHeaders(
            [(b":status", b"200"), (b"content-type", b"application/grpc")]
        )
        payload = b"r" * 200_000
        responder.sendData(payload)
        responder.sendTrailers([(b"grpc-status", b"0")])
        h.pump()
        got = sum(len(e.data) for e in h.of(DataReceived, sid))
        self.assertEqual(got, 65535)
        self.assertEqual(h.of(TrailersReceived, sid), [])
        acked = 0
        while not h.of(StreamEnded, sid):
            received = sum(e.flow_controlled_length for e in h.of(DataReceived, sid))
            self.assertGreater(received, acked, "server stalled")
            h.client.acknowledge_received_data(received - acked, sid)
            acked = received
            h.pump()
        data = b"".join(e.data for e in h.of(DataReceived, sid))
        self.assertEqual(data, payload)
        [trailers] = h.of(TrailersReceived, sid)
        self.assertEqual(dict(trailers.headers)[b"grpc-status"], b"0")
        h.close()

    def test_settingsAndConnectionWindow_resumeSending(self) -> None:
        """Buffered response data waits for both windows: a connection
        WINDOW_UPDATE alone does not release it, a larger
        SETTINGS_INITIAL_WINDOW_SIZE then does."""
        h = Harness(RecordingHandler)
        sid = h.call()
        h.pump()
        responder = h.handlers[0].responder
        responder.sendHeaders([(b":status", b"200")])
        responder.sendData(b"s" * 100_000)
        responder.sendTrailers([(b"grpc-status", b"0")])
        h.pump()

        def received() -> int:
            return sum(len(e.data) for e in h.of(DataReceived, sid))

        self.assertEqual(received(), 65535)
        h.client.increment_flow_control_window(1 << 20)
        h.pump()
        self.assertEqual(received(), 65535)
        h.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
        h.pump()
        self.assertEqual(received(), 100_000)
        self.assertEqual(len(h.of(TrailersReceived, sid)), 1)
        h.close()

    def test_clientReset_handlerReset(self) -> None:
        """RST_STREAM from the client reaches the handler; its later sends
        are ignored and the connection carries on."""
        h = Harness(RecordingHandler)
        sid = h.call(end=False)
        h.pump()
        h.client.reset_stream(sid, ErrorCodes.CANCEL)
        h.pump()
        self.assertEqual(h.handlers[0].calls[-1], ("reset", ErrorCodes.CANCEL))
        h.handlers[0].responder.trailersOnly(GRPCStatus.OK)
        self.assertEqual(h.pump(), [])
        h.call()
        h.pump()
        self.assertEqual(h.handlers[1].calls, [("headers", PATH), ("end", 0)])
        self.assertFalse(h.transport.disconnecting)
        h.close()

    def test_oversizedMessage_resourceExhausted(self) -> None:
        """A message declaring more than maxMessageBytes is refused with
        RESOURCE_EXHAUSTED before its body is buffered."""
        h = Harness(RecordingHandler, maxMessageBytes=1000)
        sid = h.call(body=b"\x00" + (1001).to_bytes(4, "big") + b"x" * 10, end=False)
        h.pump()
        self.assertEqual(h.response(sid)[b"grpc-status"], b"8")
        self.assertEqual(h.handlers[0].calls[-1], ("reset", ErrorCodes.CANCEL))
        h.close()

    def test_handlerFailure_streamReset(self) -> None:
        """A handler that raises gets its stream reset INTERNAL_ERROR and a
        logged failure; the connection survives."""

        class Failing(RecordingHandler):
            def headersReceived(self, headers: Headers) -> None:
                raise RuntimeError("boom")

        h = Harness(Failing)
        sid = h.call()
        h.pump()
        [reset] = h.of(StreamReset, sid)
        self.assertEqual(reset.error_code, ErrorCodes.INTERNAL_ERROR)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertFalse(h.transport.disconnecting)
        h.close()


class IdleTimeoutTests(SynchronousTestCase):
    """Idle connections are closed on the injected clock."""

    def test_idle_goawayAndClose(self) -> None:
        """With no streams and no data for idleTimeout seconds the server
        sends GOAWAY(NO_ERROR) and closes; the only delayed call left is
        the cut-off of a client that does not close in turn (issue 17),
        and none once the connection is gone."""
        h = Harness(idleTimeout=30.0)
        h.clock.advance(29.9)
        self.assertFalse(h.transport.disconnecting)
        h.clock.advance(0.1)
        h.pump()
        [goaway] = h.of(ConnectionTerminated)
        self.assertEqual(goaway.error_code, ErrorCodes.NO_ERROR)
        self.assertTrue(h.transport.disconnecting)
        [cutOff] = h.clock.getDelayedCalls()
        self.assertEqual(cutOff.getTime(), 31.0)
        h.close()
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_data_restartsTimer(self) -> None:
        """A request from the client restarts the idle timer (control
        frames do not: L{tests.test_tink_h2flood})."""
        h = Harness(idleTimeout=30.0)
        h.clock.advance(20)
        h.call(body=grpcMessage(b"x"))
        h.pump()
        h.clock.advance(20)
        self.assertFalse(h.transport.disconnecting)
        h.clock.advance(10)
        self.assertTrue(h.transport.disconnecting)
        h.close()

    def test_openStream_notIdle(self) -> None:
        """A connection with an unanswered stream is not idle; the timer
        starts when the last stream ends."""
        h = Harness(RecordingHandler, idleTimeout=30.0)
        h.call()
        h.pump()
        h.clock.advance(100)
        self.assertFalse(h.transport.disconnecting)
        h.handlers[0].responder.trailersOnly(GRPCStatus.NOT_FOUND, "no action")
        h.clock.advance(30)
        self.assertTrue(h.transport.disconnecting)
        h.close()
        self.assertEqual(h.clock.getDelayedCalls(), [])


class ProgressTimerTests(SynchronousTestCase):
    """Timeouts count from the last frame, with one timer per connection."""

    def test_stream_timeoutFromLastProgress(self) -> None:
        """An open stream with no request or response bytes for
        streamTimeout seconds is abandoned exactly then; request bytes in
        between restart the count."""
        h = Harness(RecordingHandler, idleTimeout=30.0, streamTimeout=100.0)
        sid = h.call(end=False)
        h.pump()
        h.clock.advance(60)
        h.client.send_data(sid, grpcMessage(b"x"))
        h.pump()  # progress at 60
        h.clock.advance(99.9)
        self.assertFalse(h.transport.disconnecting)
        h.clock.advance(0.1)
        self.assertTrue(h.transport.disconnecting)
        h.close()
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_streamEnds_idleCountsFromThen(self) -> None:
        """When the last stream ends, the (shorter) idle timeout counts from
        that moment, not from when the timer was armed."""
        h = Harness(RecordingHandler, idleTimeout=30.0, streamTimeout=100.0)
        h.call()
        h.pump()
        h.clock.advance(50)
        h.handlers[0].responder.trailersOnly(GRPCStatus.NOT_FOUND, "no action")
        h.pump()  # last stream ended at 50
        h.clock.advance(29.9)
        self.assertFalse(h.transport.disconnecting)
        h.clock.advance(0.1)
        self.assertTrue(h.transport.disconnecting)
        h.close()

    def test_frames_oneTimer(self) -> None:
        """Many frames do not re-arm or add timers: one delayed call, armed
        once, however many frames pass."""
        h = Harness(RecordingHandler, idleTimeout=30.0, streamTimeout=100.0)
        [timer] = h.clock.getDelayedCalls()
        armedFor = timer.getTime()
        for _ in range(5):
            h.client.ping(b"\x00" * 8)
            h.pump()
            h.clock.advance(1)
        self.assertEqual(h.clock.getDelayedCalls(), [timer])
        self.assertEqual(timer.getTime(), armedFor)  # not moved by each frame
        h.close()


class WireHelperTests(SynchronousTestCase):
    """grpc-message encoding and message framing."""

    def test_grpcMessage_percentEncoded(self) -> None:
        """grpc-message is UTF-8 percent-encoded, '%' included."""
        self.assertEqual(encodeGrpcMessage("50% ü\n ok"), b"50%25 %C3%BC%0A ok")

    def test_grpcStatus_allCodes(self) -> None:
        """All 17 gRPC status codes are defined with their numbers."""
        self.assertEqual([int(s) for s in GRPCStatus], list(range(17)))
        self.assertEqual(GRPCStatus.UNIMPLEMENTED, 12)

    @given(
        st.lists(st.binary(max_size=40), max_size=6),
        st.lists(st.integers(min_value=1, max_value=7), min_size=1),
    )
    def test_guard_anySplit(self, payloads: list[bytes], sizes: list[int]) -> None:
        """Messages under the limit pass however the body is split; one
        over the limit is reported with its declared length."""
        body = b"".join(grpcMessage(p) for p in payloads)
        for tail, expected in ((b"", None), (grpcMessage(b"z" * 41), 41)):
            guard = MessageSizeGuard(40)
            stream = body + tail
            found: int | None = None
            offset, i = 0, 0
            while offset < len(stream) and found is None:
                size = sizes[i % len(sizes)]
                found = guard.feed(stream[offset : offset + size])
                offset += size
                i += 1
            self.assertEqual(found, expected)

    def test_factory_limits(self) -> None:
        """TinkListenerFactory builds protocols carrying its clock and
        limits."""
        clock = Clock()
        factory = TinkListenerFactory(clock, maxConcurrentStreams=3, idleTimeout=5)
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        self.assertIs(protocol.factory, factory)
        clock.advance(5)
        self.assertTrue(transport.disconnecting)
        protocol.connectionLost(None)
        self.assertEqual(clock.getDelayedCalls(), [])


def grpcUnaryCode(port: int, certPEM: bytes) -> Any:
    """Run in a thread: one generic unary call; return its status code."""
    credentials = grpc.ssl_channel_credentials(root_certificates=certPEM)
    channel = grpc.secure_channel(f"localhost:{port}", credentials)
    try:
        call = channel.unary_unary(
            PATH.decode(),
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            call(b"", timeout=5)
        except grpc.RpcError as e:
            return e.code(), e.details()
        return None, None
    finally:
        channel.close()


def negotiatedAlpn(port: int, certPEM: bytes) -> str | None:
    """Run in a thread: the ALPN protocol the server selects."""
    context = ssl.create_default_context(cadata=certPEM.decode())
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.selected_alpn_protocol()


class TLSIntegrationTests(TestCase):
    """A real grpcio client over real TLS on loopback ([A4])."""

    async def test_grpcio_unimplemented(self) -> None:
        """grpcio's unary call over TLS with ALPN h2 gets UNIMPLEMENTED with
        the fleetd message; the server selects ALPN h2 [A4]."""
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
            raiseMinimumTo=tssl.TLSVersion.TLSv1_2,
        )
        tlsFactory = TLSMemoryBIOFactory(options, False, TinkListenerFactory(reactor))
        port = reactor.listenTCP(0, tlsFactory, interface="127.0.0.1")  # type: ignore[arg-type]
        self.addCleanup(port.stopListening)
        number = cast(IPv4Address, port.getHost()).port

        code, details = await deferToThread(grpcUnaryCode, number, certPEM)
        self.assertEqual(code, grpc.StatusCode.UNIMPLEMENTED)
        self.assertEqual(details, f"fleetd: {PATH.decode()} is not served yet")
        alpn = await deferToThread(negotiatedAlpn, number, certPEM)
        self.assertEqual(alpn, "h2")

        # Wait until the server has seen every connection close, so no
        # transport or idle timer outlives the test.
        for _ in range(500):
            if not tlsFactory.protocols:
                break
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(tlsFactory.protocols, {})
