"""
The tink proxy frame by frame: an h2 client, fleetd's proxy and an h2
server playing tink-server, joined by in-memory transports with a
task.Clock ([A4]). What grpcio cannot be made to do on purpose (GOAWAY with
a chosen last stream, a server that stops reading, a client that never
ends its stream) is done here.
"""

from __future__ import annotations

import logging

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from hpack import Decoder, Encoder
from hyperframe.frame import ContinuationFrame, HeadersFrame, PingFrame
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.h2.conn import DrainingH2Connection
from tests.h2support import OK_TRAILERS, Site, grpcHeaders, grpcMessage


class GoAwayTests(SynchronousTestCase):
    """tink-server's GOAWAY [A4]."""

    def test_upstreamGoaway_inFlightFinish_unprocessedRefused(self) -> None:
        """[A4] Streams at or below GOAWAY's last_stream_id finish; those
        above are reset REFUSED_STREAM to the client (which retries); the
        next call dials a fresh upstream connection."""
        site = Site()
        first = site.call()
        second = site.call()
        usid = site.upstreamSid(0)
        site.server.goAway(usid)
        site.pump()
        [reset] = site.of(StreamReset, second)
        self.assertEqual(reset.error_code, ErrorCodes.REFUSED_STREAM)
        # The old connection still carries the first call to its end.
        site.answer(usid)
        self.assertEqual(len(site.of(TrailersReceived, first)), 1)
        third = site.call()
        self.assertEqual(len(site.upstreams), 2)
        site.answer(site.upstreamSid(0))
        self.assertEqual(len(site.of(TrailersReceived, third)), 1)
        self.assertTrue(site.upstreams[0][1].disconnecting)

    def test_upstreamErrorGoaway_unavailable(self) -> None:
        """[A4] A GOAWAY with an error ends the calls it had taken
        UNAVAILABLE (the connection is gone)."""
        site = Site()
        sid = site.call()
        site.server.close_connection(
            ErrorCodes.INTERNAL_ERROR, last_stream_id=site.upstreamSid(0)
        )
        site.pump()
        [response] = site.of(ResponseReceived, sid)
        self.assertEqual(dict(response.headers)[b"grpc-status"], b"14")


class FlowControlTests(SynchronousTestCase):
    """Credit is returned only for what was forwarded [A4]."""

    def test_requestBackpressure(self) -> None:
        """[A4] A tink-server that stops reading stops the client: the proxy
        returns credit only for bytes it forwarded (it holds at most one
        window), and delivers everything unchanged once reading resumes."""
        site = Site()
        client = site.client
        message = grpcMessage(bytes(range(256)) * 800)  # 200 KiB
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, grpcHeaders())
        sent = 0

        def sendWhatFits() -> None:
            nonlocal sent
            while sent < len(message):
                window = min(
                    client.local_flow_control_window(sid),
                    client.max_outbound_frame_size,
                )
                if window <= 0:
                    return
                chunk = message[sent : sent + window]
                sent += len(chunk)
                client.send_data(sid, chunk, end_stream=sent == len(message))

        def received() -> bytes:
            return b"".join(
                e.data for e in site.serverEvents() if isinstance(e, DataReceived)
            )

        for _ in range(3):
            sendWhatFits()
            site.pump()
        self.assertLess(sent, len(message))
        self.assertEqual(len(received()), 65535)  # the upstream window
        self.assertLessEqual(sent - len(received()), 65535)  # held by the proxy
        stalled = sent
        sendWhatFits()
        site.pump()
        self.assertEqual(sent, stalled)
        usid = site.upstreamSid(0)
        acked = 0
        for _ in range(100):
            got = len(received())
            if got > acked:
                site.server.acknowledge_received_data(got - acked, usid)
                acked = got
            sendWhatFits()
            site.pump()
            if len(received()) == len(message):
                break
        self.assertEqual(received(), message)

    def test_responseLarge_manyFrames(self) -> None:
        """[A4] A 1 MiB response crosses the windows of both hops unchanged;
        tink-server may send only as fast as the client reads."""
        site = Site()
        sid = site.call()
        usid = site.upstreamSid(0)
        data = grpcMessage(bytes(i % 251 for i in range(1 << 20)))
        server = site.server
        server.send_headers(usid, [(b":status", b"200")])
        offset = acked = 0

        def got() -> bytes:
            return b"".join(e.data for e in site.of(DataReceived, sid))

        for _ in range(1000):
            while offset < len(data):
                window = min(
                    server.local_flow_control_window(usid),
                    server.max_outbound_frame_size,
                )
                if window <= 0:
                    break
                server.send_data(usid, data[offset : offset + window])
                offset += window
            site.pump()
            self.assertLessEqual(offset - len(got()), 2 * 65535)
            if len(got()) > acked:
                site.client.acknowledge_received_data(len(got()) - acked, sid)
                acked = len(got())
                site.pump()
            if len(got()) == len(data):
                break
        server.send_headers(usid, OK_TRAILERS, end_stream=True)
        site.pump()
        self.assertEqual(got(), data)
        self.assertEqual(len(site.of(TrailersReceived, sid)), 1)


class TrailersTests(SynchronousTestCase):
    def test_trailersOnly_oneHeadersFrame(self) -> None:
        """[A4] A Trailers-Only answer reaches the client as one HEADERS
        frame with END_STREAM, every field unchanged."""
        site = Site()
        sid = site.call()
        headers = [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", b"9"),
            (b"grpc-message", b"Workflow not in pending or running state"),
            (b"grpc-status-details-bin", b"CAkSKFdvcmtmbG93"),
        ]
        site.server.send_headers(site.upstreamSid(0), headers, end_stream=True)
        site.pump()
        [response] = site.of(ResponseReceived, sid)
        self.assertEqual(response.headers, headers)
        self.assertIsNotNone(response.stream_ended)
        self.assertEqual(site.of(DataReceived, sid), [])

    def test_requestHeaders_forwarded(self) -> None:
        """[A4] te, grpc-timeout and -bin metadata reach tink-server as sent."""
        site = Site()
        sid = site.client.get_next_available_stream_id()
        sent = [*grpcHeaders(), (b"grpc-timeout", b"5S"), (b"x-id-bin", b"AAEC")]
        site.client.send_headers(sid, sent, end_stream=True)
        site.pump()
        [request] = [e for e in site.serverEvents() if isinstance(e, RequestReceived)]
        self.assertEqual(request.headers, sent)

    def test_upstreamReset_passedOn(self) -> None:
        """[A4] tink-server resetting a stream resets the client's with the
        same code."""
        site = Site()
        sid = site.call()
        site.server.reset_stream(site.upstreamSid(0), ErrorCodes.CANCEL)
        site.pump()
        [reset] = site.of(StreamReset, sid)
        self.assertEqual(reset.error_code, ErrorCodes.CANCEL)

    def test_clientReset_resetsUpstream(self) -> None:
        """[A4] A client giving up resets the upstream stream."""
        site = Site()
        sid = site.call(end=False)
        site.client.reset_stream(sid, ErrorCodes.CANCEL)
        site.pump()
        resets = [e for e in site.serverEvents() if isinstance(e, StreamReset)]
        self.assertEqual([r.error_code for r in resets], [ErrorCodes.CANCEL])
        self.assertEqual(site.metrics.active, 0)


class DrainAndTimeoutTests(SynchronousTestCase):
    """fleetd's own GOAWAY, and clients that stall [A4]."""

    def test_drain_goawayThenFinish(self) -> None:
        """[A4] On stop: GOAWAY naming the last stream taken; that call
        finishes; a new stream is refused; then the connection closes."""
        site = Site()
        sid = site.call()
        drained = site.factory.drain()
        site.pump()
        [goaway] = site.of(ConnectionTerminated)
        self.assertEqual((goaway.error_code, goaway.last_stream_id), (0, sid))
        late = site.call()
        [reset] = site.of(StreamReset, late)
        self.assertEqual(reset.error_code, ErrorCodes.REFUSED_STREAM)
        self.assertNoResult(drained)
        site.answer(site.upstreamSid(0))
        self.assertEqual(len(site.of(TrailersReceived, sid)), 1)
        proxy, transport = site.clients[0][:2]
        self.assertTrue(transport.disconnecting)
        proxy.connectionLost(None)
        self.successResultOf(drained)
        self.assertEqual(site.clock.getDelayedCalls(), [])

    def test_drain_timeoutAborts(self) -> None:
        """[A4] A call still running after drain_timeout is cut off."""
        site = Site(drainTimeout=5)
        site.call(end=False)
        site.factory.drain()
        site.clock.advance(5)
        self.assertTrue(site.clients[0][1].disconnecting)

    def test_neverEndingStream_closed(self) -> None:
        """[A4] A stream with no frame either way for stream_timeout seconds
        closes its connection (GOAWAY CANCEL), the upstream stream is reset,
        and other connections keep working."""
        site = Site(streamTimeout=60, idleTimeout=120)
        site.call(end=False)
        other = site.connect()
        site.clock.advance(59)
        self.assertFalse(site.clients[0][1].disconnecting)
        site.clock.advance(1)
        site.pump()
        [goaway] = site.of(ConnectionTerminated)
        self.assertEqual(goaway.error_code, ErrorCodes.CANCEL)
        self.assertTrue(site.clients[0][1].disconnecting)
        resets = [e for e in site.serverEvents() if isinstance(e, StreamReset)]
        self.assertEqual(len(resets), 1)
        sid = site.call(index=other)
        site.answer(site.upstreamSid(1))
        self.assertEqual(len(site.of(TrailersReceived, sid, index=other)), 1)

    def test_noPreface_handshakeTimeout(self) -> None:
        """[A4] A connection that never sends the HTTP/2 preface is closed
        after handshake_timeout."""
        site = Site(handshakeTimeout=3)
        proxy = site.factory.buildProtocol(None)
        transport = StringTransport()
        proxy.makeConnection(transport)
        site.clock.advance(3)
        self.assertTrue(transport.disconnecting)

    def test_garbageBeforePreface_othersServed(self) -> None:
        """[A4] Garbage instead of the preface closes that connection with
        GOAWAY PROTOCOL_ERROR; fleetd keeps serving the others."""
        site = Site()
        proxy = site.factory.buildProtocol(None)
        transport = StringTransport()
        proxy.makeConnection(transport)
        proxy.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.disconnecting)
        probe = H2Connection(H2Configuration(client_side=True))
        probe.initiate_connection()
        events = probe.receive_data(transport.value())
        [goaway] = [e for e in events if isinstance(e, ConnectionTerminated)]
        self.assertEqual(goaway.error_code, ErrorCodes.PROTOCOL_ERROR)
        sid = site.call()
        site.answer(site.upstreamSid(0))
        self.assertEqual(len(site.of(TrailersReceived, sid)), 1)

    def test_headerFlood_closed(self) -> None:
        """[A4] Headers beyond the header list limit close the connection
        with a protocol error; the others are served."""
        site = Site(maxHeaderListSize=2048)
        index = site.connect()
        _proxy, transport, client, events = site.clients[index]
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, [*grpcHeaders(), (b"x-flood", b"a" * 4000)])
        site.pump()
        self.assertTrue(transport.disconnecting)
        [goaway] = [e for e in events if isinstance(e, ConnectionTerminated)]
        self.assertNotEqual(goaway.error_code, ErrorCodes.NO_ERROR)
        other = site.call()
        site.answer(site.upstreamSid(0))
        self.assertEqual(len(site.of(TrailersReceived, other)), 1)

    def test_continuationFlood_closed(self) -> None:
        """[A4] A HEADERS frame followed by endless CONTINUATION frames is
        cut off (a bounded number is buffered) with GOAWAY; others served."""
        site = Site()
        index = site.connect()
        proxy, transport, _, _ = site.clients[index]
        start = HeadersFrame(1)
        start.data = b"\x00"
        proxy.dataReceived(start.serialize())
        sent = 0
        while not transport.disconnecting and sent < 1000:
            more = ContinuationFrame(1)
            more.data = b"\x40\x05aaaaa\x05bbbbb" * 100
            proxy.dataReceived(more.serialize())
            sent += 1
        self.assertTrue(transport.disconnecting)
        self.assertLess(sent, 100)
        probe = H2Connection(H2Configuration(client_side=True))
        probe.initiate_connection()
        events = probe.receive_data(transport.value())
        [goaway] = [e for e in events if isinstance(e, ConnectionTerminated)]
        self.assertNotEqual(goaway.error_code, ErrorCodes.NO_ERROR)
        other = site.call()
        site.answer(site.upstreamSid(0))
        self.assertEqual(len(site.of(TrailersReceived, other)), 1)

    def test_upstreamDown_unavailable(self) -> None:
        """[A4] Upstream refusing connections: UNAVAILABLE, Trailers-Only."""
        site = Site()
        site.upstreamDown = True
        sid = site.call()
        [response] = site.of(ResponseReceived, sid)
        self.assertEqual(dict(response.headers)[b"grpc-status"], b"14")
        self.assertIsNotNone(response.stream_ended)
        self.assertEqual(
            site.metrics.upstreamErrors.labels("connect")._value.get(), 1.0
        )

    def test_upstreamDown_logRateLimited(self) -> None:
        """Nothing per stream is logged without a rate limit: 50 calls while
        tink-server is down give at most 10 lines a window, the next one
        counting those suppressed."""
        site = Site()
        site.upstreamDown = True
        with capturedLogs() as events:
            for _ in range(50):
                site.call()
            site.clock.advance(11)
            site.call()
        lines = [e for e in events if "tink.upstream" in e.get("log_format", "")]
        self.assertEqual(len(lines), 11)
        self.assertEqual(lines[-1]["suppressed"], 40)
        self.assertEqual(
            site.metrics.upstreamErrors.labels("connect")._value.get(), 51.0
        )

    def test_streamEnded_checked(self) -> None:
        """Sanity: a plain call ends with trailers and one StreamEnded."""
        site = Site()
        sid = site.call()
        site.answer(site.upstreamSid(0))
        self.assertEqual(len(site.of(StreamEnded, sid)), 1)


class WriteCoalescingTests(SynchronousTestCase):
    def test_oneWritePerConnectionPerBatch(self) -> None:
        """[A4] Bytes received on one connection make each connection they
        touch write once, all frames together (one TLS record, one socket
        write), not once per frame: the request's HEADERS and DATA leave for
        tink-server in one write, the answer's HEADERS, DATA and trailers
        leave for the client in one write."""
        site = Site()
        site.call()
        site.answer(site.upstreamSid(0))
        proxy, downstream, client, _ = site.clients[0]
        upstreamProtocol, upstream, server, _ = site.upstreams[-1]
        writes: dict[str, list[bytes]] = {"down": [], "up": []}

        def counting(transport: StringTransport, key: str) -> None:
            write = transport.write

            def counted(data: bytes) -> None:
                writes[key].append(data)
                write(data)

            transport.write = counted  # type: ignore[method-assign]

        counting(downstream, "down")
        counting(upstream, "up")
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, grpcHeaders())
        client.send_data(sid, grpcMessage(b"x" * 100), end_stream=True)
        proxy.dataReceived(client.data_to_send())
        self.assertEqual(len(writes["up"]), 1)
        site.pump()
        usid = site.upstreamSid(1)
        writes["down"].clear()
        server.send_headers(
            usid, [(b":status", b"200"), (b"content-type", b"application/grpc")]
        )
        server.send_data(usid, grpcMessage(b"y" * 100))
        server.send_headers(usid, OK_TRAILERS, end_stream=True)
        upstreamProtocol.dataReceived(server.data_to_send())
        self.assertEqual(len(writes["down"]), 1)
        site.pump()
        [trailers] = site.of(TrailersReceived, sid)
        self.assertEqual(trailers.headers, OK_TRAILERS)
        self.assertEqual(
            b"".join(e.data for e in site.of(DataReceived, sid)),
            grpcMessage(b"y" * 100),
        )


class QuietLibrariesTests(SynchronousTestCase):
    def test_hpack_logsNothing(self) -> None:
        """hpack's per-header debug lines, which would carry header values
        (tokens, metadata), never reach the stdlib logging even at DEBUG;
        also the proxy's CPU: ~60 of those calls per proxied call."""
        records: list[logging.LogRecord] = []

        class Recording(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record)

        handler = Recording(logging.DEBUG)
        hpackLog = logging.getLogger("hpack")
        hpackLog.addHandler(handler)
        self.addCleanup(hpackLog.removeHandler, handler)
        self.patch(hpackLog, "level", logging.DEBUG)
        self.patch(hpackLog, "propagate", False)
        headers = [(b"authorization", b"Bearer s3cret"), (b"te", b"trailers")]
        encoded = Encoder().encode(headers)
        self.assertEqual(Decoder().decode(encoded, raw=True), headers)
        self.assertEqual(len(records), 0)

    def test_receivedFrame_noRepr(self) -> None:
        """A received frame is not turned into a trace string (h2 builds
        one for every frame, for a logger that drops it)."""
        built: list[object] = []

        def counting(frame: object) -> str:
            built.append(frame)
            return "frame"

        self.patch(PingFrame, "__repr__", counting)
        client = H2Connection(H2Configuration(client_side=True))
        client.initiate_connection()
        server = DrainingH2Connection(H2Configuration(client_side=False))
        server.initiate_connection()
        server.receive_data(client.data_to_send())
        client.ping(b"12345678")
        events = server.receive_data(client.data_to_send())
        self.assertEqual([type(e).__name__ for e in events], ["PingReceived"])
        self.assertEqual(len(built), 0)
