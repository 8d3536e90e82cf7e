"""
One client's unread answers on the tink listener hold back only that
client (issue 26 item 1; design.md, Listeners): the upstream connection's
window is credited on arrival and each stream's once forwarded, and what a
client's own window holds in fleetd counts against its connection, bounded
in bytes and in time. In memory (the proxy between two h2 peers), then
over TLS with a real grpcio agent and tink-server.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Any

import grpc
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
)
from h2.settings import SettingCodes
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.h2.client import CONNECTION_WINDOW, STREAM_WINDOW
from fleetd.h2.guard import H2Limits
from fleetd.testing.tinkagent import unary
from fleetd.testing.tinkserver import realisticAction
from fleetd.tink.proto import tink_agent_pb2 as agent
from tests.h2support import CALM, Site, counted, grpcHeaders, grpcMessage
from tests.test_tink_proxy import Proxy, sharedUpstream

# A realistic GetAction answer: the image2disk action of a Talos install,
# 1,668 bytes, as tink-server sends it.
ACTION = realisticAction()


def stalledClient(site: Site, streams: int, window: int = 0) -> int:
    """A client announcing C{window} as its streams' receive window, with
    C{streams} whole GetAction requests open; returns its index."""
    index = site.connect()
    client = site.clients[index][2]
    client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: window})
    site.pump()
    for _ in range(streams):
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, grpcHeaders())
        client.send_data(sid, grpcMessage(b"poll"), end_stream=True)
    site.pump()
    return index


def answerAll(site: Site, first: int, count: int, payload: bytes = ACTION) -> int:
    """tink-server answers upstream requests C{first}.. as far as its
    windows let it; returns how many it could answer."""
    server = site.server
    message = grpcMessage(payload)
    answered = 0
    for nth in range(first, first + count):
        usid = site.upstreamSid(nth)
        stream = server.streams.get(usid)
        if stream is None or stream.closed:
            continue  # reset by fleetd
        if server.local_flow_control_window(usid) < len(message):
            continue
        site.answer(usid, payload)
        answered += 1
    return answered


class SharedWindowTests(SynchronousTestCase):
    """A stalled downstream stream blocks only itself (issue 26 item 1)."""

    def test_zeroWindowClient_othersAnswered(self) -> None:
        """A client with a zero window and 60 open GetAction streams: all 60
        answers reach fleetd, and another client's call is answered. On a
        shared 64 KiB upstream window, tink-server could not even send the
        40th answer, nor anyone else's."""
        site = Site()
        stalledClient(site, 60)
        self.assertEqual(answerAll(site, 0, 60), 60)
        honest = site.call(b"poll")
        site.answer(site.upstreamSid(60), ACTION)
        self.assertEqual(len(site.of(TrailersReceived, honest)), 1)
        [data] = site.of(DataReceived, honest)
        self.assertEqual(data.data, grpcMessage(ACTION))

    def test_stalledStream_creditedNothing_connectionCredited(self) -> None:
        """What a stalled stream holds is not credited back to tink-server
        on that stream, while the connection's window is given back at
        once: tink-server stops on that stream alone, after
        L{STREAM_WINDOW} bytes."""
        site = Site()
        attacker = stalledClient(site, 1)
        server = site.server
        self.assertGreaterEqual(server.outbound_flow_control_window, CONNECTION_WINDOW)
        usid = site.upstreamSid(0)
        server.send_headers(
            usid, [(b":status", b"200"), (b"content-type", b"application/grpc")]
        )
        sent = 0
        while server.local_flow_control_window(usid) > 0:
            chunk = min(16384, server.local_flow_control_window(usid))
            server.send_data(usid, b"\x00" * chunk)
            sent += chunk
            site.pump()
        self.assertEqual(sent, STREAM_WINDOW)
        self.assertEqual(
            server.outbound_flow_control_window, CONNECTION_WINDOW - STREAM_WINDOW
        )
        self.assertEqual(site.of(DataReceived, index=attacker), [])

    def test_owedPastBound_calmAndPenalized(self) -> None:
        """Answers held for one client's window past C{maxOwedBytes}: GOAWAY
        (ENHANCE_YOUR_CALM), its upstream streams reset, counted
        C{window-held} and against its source; others go on."""
        site = Site(limits=H2Limits(maxOwedBytes=10_000))
        attacker = stalledClient(site, 10)
        with capturedLogs() as logs:
            answerAll(site, 0, 10)
        _proxy, transport, _, events = site.clients[attacker]
        self.assertTrue(transport.disconnecting)
        [goaway] = [e for e in events if isinstance(e, ConnectionTerminated)]
        self.assertEqual(goaway.error_code, ErrorCodes.ENHANCE_YOUR_CALM)
        self.assertEqual(counted(site.metrics, "window-held"), 1)
        self.assertEqual(counted(site.metrics, "penalty"), 1)
        [line] = [e for e in logs if e.get("log_format") == CALM]
        self.assertEqual(line["reason"], "window-held")
        self.assertGreater(line["owed"], 10_000)
        resets = [e for e in site.serverEvents() if isinstance(e, StreamReset)]
        self.assertGreater(len(resets), 3)
        honest = site.call(b"poll")
        site.answer(site.upstreamSid(10), ACTION)
        self.assertEqual(len(site.of(TrailersReceived, honest)), 1)

    def test_noWindowForWindowTimeout_calm(self) -> None:
        """Answers held with no window for C{windowTimeout}: the connection
        is closed with ENHANCE_YOUR_CALM (C{window-timeout}), in seconds,
        not after the 300 s stream timeout."""
        site = Site(limits=H2Limits(windowTimeout=3.0))
        attacker = stalledClient(site, 2)
        answerAll(site, 0, 2)
        transport = site.clients[attacker][1]
        site.clock.advance(2.9)
        self.assertFalse(transport.disconnecting)
        site.clock.advance(0.2)
        site.pump()
        self.assertTrue(transport.disconnecting)
        self.assertEqual(counted(site.metrics, "window-timeout"), 1)
        [goaway] = site.of(ConnectionTerminated, index=attacker)
        self.assertEqual(goaway.error_code, ErrorCodes.ENHANCE_YOUR_CALM)

    def test_slowReader_notClosed(self) -> None:
        """A client whose small window opens now and then is not cut off:
        the deadline counts from the last bytes that left."""
        site = Site(limits=H2Limits(windowTimeout=3.0))
        reader = stalledClient(site, 1, window=500)
        answerAll(site, 0, 1)
        proxy, transport, client, events = site.clients[reader]
        assert proxy.guard is not None
        self.assertEqual(proxy.guard.owed, len(grpcMessage(ACTION)) - 500)
        steps = 0
        while not [e for e in events if isinstance(e, TrailersReceived)]:
            site.clock.advance(2.0)
            self.assertFalse(transport.disconnecting)
            client.increment_flow_control_window(500, 1)
            site.pump()
            steps += 1
        self.assertEqual(steps, 3)  # 8 s in all, past the 3 s deadline
        got = b"".join(e.data for e in events if isinstance(e, DataReceived))
        self.assertEqual(got, grpcMessage(ACTION))
        self.assertEqual(counted(site.metrics, "window-timeout"), 0)
        self.assertEqual(proxy.guard.owed, 0)

    def test_resetStream_owesNothing(self) -> None:
        """A stalled stream the client resets no longer counts against its
        connection (nor does a stream that finished)."""
        site = Site(limits=H2Limits(windowTimeout=3.0))
        attacker = stalledClient(site, 1)
        answerAll(site, 0, 1)
        proxy, _transport, client, _ = site.clients[attacker]
        assert proxy.guard is not None
        self.assertEqual(proxy.guard.owed, len(grpcMessage(ACTION)))
        client.reset_stream(1, ErrorCodes.CANCEL)
        site.pump()
        self.assertEqual(proxy.guard.owed, 0)
        site.clock.advance(10)
        site.pump()
        self.assertEqual(counted(site.metrics, "window-timeout"), 0)


def zeroWindowAttack(
    port: int, caPEM: bytes, streams: int, report: dict[str, Any]
) -> None:
    """A raw TLS client from 127.0.0.2: SETTINGS_INITIAL_WINDOW_SIZE=0,
    C{streams} whole GetAction requests, never a WINDOW_UPDATE; reads (and
    ignores) what comes until fleetd closes the connection."""
    context = ssl.create_default_context(cadata=caPEM.decode())
    context.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
    conn = context.wrap_socket(raw, server_hostname="localhost")
    client = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 0})
    request = agent.ActionRequest(agent_id="52:54:00:66:66:66").SerializeToString()
    for _ in range(streams):
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, grpcHeaders())
        client.send_data(sid, grpcMessage(request), end_stream=True)
    conn.sendall(client.data_to_send())
    report["sent"] = time.monotonic()
    conn.settimeout(30)
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                break
            for event in client.receive_data(data):
                if isinstance(event, ResponseReceived):
                    report["headers"] = report.get("headers", 0) + 1
                if isinstance(event, ConnectionTerminated):
                    report["goaway"] = event.error_code
                    report["closedAt"] = time.monotonic()
            conn.sendall(client.data_to_send())  # SETTINGS and PING ACKs only
    except OSError as e:
        report["error"] = type(e).__name__
    finally:
        report.setdefault("closedAt", time.monotonic())
        conn.close()


class RealZeroWindowTests(TestCase):
    """A zero-window client and a real grpcio agent through fleetd's TLS
    listener and a grpcio tink-server (issue 26 item 1)."""

    timeout = 60

    def setUp(self) -> None:
        self.upstream = sharedUpstream()
        self.script = self.upstream.script
        self.script.unary.clear()
        with self.script.lock:
            self.script.received.clear()
        self.script.unary["GetAction"] = lambda req, ctx: ACTION
        self.proxy = Proxy(self, self.upstream.port, limits=H2Limits(windowTimeout=4.0))

    async def test_zeroWindow60Streams_agentAnsweredWithin1s(self) -> None:
        """With 60 of the attacker's answers held in fleetd, a real grpcio
        agent's GetAction is answered within 1 s; the attacker's connection
        is closed with ENHANCE_YOUR_CALM once its window stayed shut for
        the window timeout, and counted."""
        report: dict[str, Any] = {}
        attacker = threading.Thread(
            target=zeroWindowAttack,
            args=(self.proxy.number, self.proxy.certPEM, 60, report),
            daemon=True,
        )
        attacker.start()
        for _ in range(300):
            with self.script.lock:
                if len(self.script.received) >= 60:
                    break
            await deferToThread(time.sleep, 0.01)
        self.assertEqual(len(self.script.received), 60, report)
        await deferToThread(time.sleep, 0.2)  # tink-server's answers arrive
        request = agent.ActionRequest(agent_id="52:54:00:12:34:56").SerializeToString()
        started = time.monotonic()
        outcome = await deferToThread(
            unary, self.proxy.channel, "GetAction", request, timeout=1.0
        )
        self.assertEqual(outcome.code, grpc.StatusCode.OK, outcome.details)
        self.assertEqual(outcome.responses, [ACTION])
        self.assertLess(time.monotonic() - started, 1.0)
        self.assertNotIn("goaway", report)  # still open: isolation, not closure
        await deferToThread(attacker.join, 15)
        self.assertEqual(report.get("goaway"), ErrorCodes.ENHANCE_YOUR_CALM)
        held = report["closedAt"] - report["sent"]
        self.assertGreater(held, 3.5)
        self.assertLess(held, 8.0)
        self.assertEqual(
            self.proxy.sample("fleetd_tink_h2_abuse_total", kind="window-timeout"), 1
        )
