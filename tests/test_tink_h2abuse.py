"""
What one HTTP/2 client may cost the tink listener (issue 17, item 5;
[A4], design.md, Listeners): the CVE-2023-44487 rapid-reset budget and its
GOAWAY(ENHANCE_YOUR_CALM), upstream streams only for whole requests, new
streams per source, and the penalty of a source told to calm down.
Control-frame floods and the pause: L{tests.test_tink_h2flood}.
"""

from __future__ import annotations

from typing import Any

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    RequestReceived,
    StreamReset,
)
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.h2.frames import SLICE_FRAMES
from fleetd.h2.grpcwire import GRPCStatus
from fleetd.h2.guard import H2Limits, SourceStreams
from fleetd.h2.listener import TinkListenerFactory
from fleetd.listen.connections import LimitedFactory
from fleetd.tink.metrics import TinkMetrics
from tests.h2support import (
    CALM,
    RecordingHandler,
    Site,
    calm,
    counted,
    grpcHeaders,
    grpcMessage,
    guarded,
)


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
        """A read holding 1000 reset streams is parsed a few frames at a
        time: once the stream budget closed the connection, the rest is
        never parsed; what was parsed past the budget is at most one slice
        (issue 17 item 5, issue 26 item 4). The frame budget is lifted
        here: it would close the connection before any of it is parsed."""
        h = guarded(H2Limits(streamBudget=8, frameBurst=1e9))
        for _ in range(1000):
            sid = h.call(end=False)
            h.client.reset_stream(sid, ErrorCodes.CANCEL)
        flood = h.client.data_to_send()
        h.server.dataReceived(flood)
        self.assertTrue(h.transport.disconnecting)
        streams = (h.server.h2.highest_inbound_stream_id + 1) // 2
        self.assertLessEqual(streams, 8 + SLICE_FRAMES // 2)
        h.close()

    def test_floodPastFrameBudget_nothingParsed(self) -> None:
        """A read whose frames pass the connection's frame budget is dropped
        unparsed: GOAWAY(ENHANCE_YOUR_CALM) names no stream of it, no
        handler was built, and fleetd stops reading (issue 26 item 4)."""
        h = guarded(H2Limits(streamBudget=8, frameBurst=100))
        for _ in range(1000):
            sid = h.call(end=False)
            h.client.reset_stream(sid, ErrorCodes.CANCEL)
        with capturedLogs() as logs:
            h.server.dataReceived(h.client.data_to_send())
        self.assertTrue(h.transport.disconnecting)
        self.assertEqual(h.server.h2.highest_inbound_stream_id, 0)
        self.assertEqual(h.handlers, [])
        self.assertEqual(counted(h.metrics, "frame-budget"), 1)  # type: ignore[attr-defined]
        [line] = [e for e in logs if e.get("log_format") == CALM]
        self.assertEqual(line["reason"], "frame-budget")
        h.pump()
        self.assertEqual(len(calm(h)), 1)
        self.assertEqual(calm(h)[0].last_stream_id, 0)
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
