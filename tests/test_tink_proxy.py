"""The tink proxy with real grpcio peers over TLS on loopback ([A4], issue 10)."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator
from typing import Any, cast
from unittest.mock import ANY

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import crypto
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet import ssl as tssl
from twisted.internet.address import IPv4Address
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.trial.unittest import TestCase

from fleetd.config import UpstreamAddress
from fleetd.h2.listener import TinkListenerFactory, proxyFactory
from fleetd.h2.upstream import UpstreamPool
from fleetd.service import FleetdService
from fleetd.testing.tinkagent import Outcome, channel, streaming, unary
from fleetd.testing.tinkserver import FakeTinkServer
from fleetd.tink.metrics import TinkMetrics
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.proto import tink_v012_pb2 as v012
from tests.daemonsupport import DaemonTestMixin
from tests.h2support import selfSignedCertificate
from tests.tinkpeers import context, provisionedDevice

_shared: FakeTinkServer | None = None


def sharedUpstream() -> FakeTinkServer:
    """One grpcio tink-server for the whole class (keeps CI fast)."""
    global _shared
    if _shared is None:
        _shared = FakeTinkServer()
        atexit.register(_shared.stop, None)
    return _shared


def details(code: int, message: str) -> bytes:
    """A google.rpc.Status-shaped blob (field 1 code, field 2 message)."""
    text = message.encode()
    return bytes([0x08, code, 0x12, len(text)]) + text


class Proxy:
    """fleetd's tink listener over TLS on loopback, proxying to C{port}."""

    def __init__(
        self,
        test: TestCase,
        port: int,
        upstream: str = "tcp:127.0.0.1",
        upstreamCA: bytes | None = None,
        **limits: Any,
    ) -> None:
        from twisted.internet import reactor

        self.reactor = reactor
        keyPEM, self.certPEM = selfSignedCertificate()
        options = tssl.CertificateOptions(
            privateKey=crypto.PKey.from_cryptography_key(
                serialization.load_pem_private_key(keyPEM, None)  # type: ignore[arg-type]
            ),
            certificate=crypto.X509.from_cryptography(
                x509.load_pem_x509_certificate(self.certPEM)
            ),
            acceptableProtocols=[b"h2"],
            raiseMinimumTo=tssl.TLSVersion.TLSv1_2,
        )
        self.registry = CollectorRegistry()
        self.metrics = TinkMetrics(self.registry)
        address = UpstreamAddress.parse(f"{upstream}:{port}")
        self.taps: list[Any] = []
        self.pool = UpstreamPool(
            reactor,
            lambda: address.endpoint(reactor, upstreamCA),
            log=__import__("fleetd.logs", fromlist=["ThrottledLog"]).ThrottledLog(
                reactor
            ),
            metrics=self.metrics,
            connectTimeout=2.0,
        )
        self.factory: TinkListenerFactory = proxyFactory(
            reactor, self.pool, self.metrics, **limits
        )
        self.tls = TLSMemoryBIOFactory(options, False, self.factory)
        self.port = reactor.listenTCP(0, self.tls, interface="127.0.0.1")  # type: ignore[arg-type]
        self.number = cast(IPv4Address, self.port.getHost()).port
        self.channel = channel(self.number, self.certPEM)
        test.addCleanup(self.close)

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def close(self) -> None:
        self.channel.close()
        stopping = self.port.stopListening()
        if stopping is not None:
            await stopping
        await self.factory.drain()
        await self.pool.close()
        for _ in range(500):
            if not self.tls.protocols and not self.factory.protocols:
                break
            await deferLater(self.reactor, 0.01, lambda: None)


class ProxyTests(TestCase):
    """Calls through fleetd reach tink-server unchanged, both ways [A4]."""

    timeout = 60

    def setUp(self) -> None:
        self.upstream = sharedUpstream()
        self.script = self.upstream.script
        self.script.unary.clear()
        self.script.streaming.clear()
        with self.script.lock:
            self.script.received.clear()
        self.proxy = Proxy(self, self.upstream.port)

    async def call(self, method: str, request: bytes, **kw: Any) -> Outcome:
        result: Outcome = await deferToThread(
            unary, self.proxy.channel, method, request, **kw
        )
        return result

    async def test_agentUnary_bytesUnchanged(self) -> None:
        """[A4] tink-agent's GetAction goes through TLS and back; request and
        response bytes, and metadata (-bin included), arrive unchanged."""
        request = agent.ActionRequest(agent_id="52:54:00:aa:bb:cc").SerializeToString()
        response = agent.ActionResponse(
            workflow_id="ns/wf", action_id="a0", name="stream-image"
        ).SerializeToString()
        self.script.unary["GetAction"] = lambda req, ctx: response
        outcome = await self.call(
            "GetAction",
            request,
            metadata=[("x-trace", "t1"), ("x-blob-bin", b"\x00\xff\x01")],
        )
        self.assertEqual(outcome.code, grpc.StatusCode.OK)
        self.assertEqual(outcome.responses, [response])
        [(method, seen, metadata)] = self.script.received
        self.assertEqual((method, seen), ("GetAction", request))
        self.assertEqual(metadata["x-trace"], "t1")
        self.assertEqual(metadata["x-blob-bin"], b"\x00\xff\x01")
        self.assertEqual(
            self.proxy.sample(
                "fleetd_tink_rpcs_total",
                method="/proto.WorkflowService/GetAction",
                code="0",
            ),
            1.0,
        )
        self.assertEqual(
            self.proxy.sample("fleetd_tink_bytes_total", direction="upstream"),
            5.0 + len(request),
        )

    async def test_workerStreaming_allMessages(self) -> None:
        """[A4] tink-worker's server-streaming GetWorkflowContexts delivers
        every message in order, then OK."""
        contexts = [context(f"ns/wf{i}", "w", i, 3) for i in range(3)]
        self.script.streaming["GetWorkflowContexts"] = lambda req, ctx: iter(contexts)
        request = v012.WorkflowContextRequest(worker_id="w").SerializeToString()
        outcome: Outcome = await deferToThread(
            streaming, self.proxy.channel, "GetWorkflowContexts", request
        )
        self.assertEqual(outcome.code, grpc.StatusCode.OK)
        self.assertEqual(outcome.responses, contexts)

    async def test_trailersOnly_statusDetailsIntact(self) -> None:
        """[A4] NOT_FOUND and FAILED_PRECONDITION answers (Trailers-Only)
        keep their message and grpc-status-details-bin byte for byte."""
        blob = details(9, "Workflow not in pending or running state")

        def precondition(req: bytes, ctx: Any) -> bytes:
            ctx.set_trailing_metadata([("grpc-status-details-bin", blob)])
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "not running: ✓ 100%")
            raise AssertionError("abort returns by raising")

        def notFound(req: bytes, ctx: Any) -> bytes:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "no Workflows found")
            raise AssertionError("abort returns by raising")

        self.script.unary["GetAction"] = precondition
        outcome = await self.call("GetAction", b"")
        self.assertEqual(outcome.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(outcome.details, "not running: ✓ 100%")
        self.assertEqual(outcome.trailing["grpc-status-details-bin"], blob)
        self.script.unary["GetAction"] = notFound
        outcome = await self.call("GetAction", b"")
        self.assertEqual(outcome.code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(outcome.details, "no Workflows found")

    async def test_largeMessage_manyFrames(self) -> None:
        """[A4] A 1 MiB message each way crosses many DATA frames and
        flow-control windows and arrives unchanged."""
        payload = os.urandom(1 << 20)
        answer = os.urandom(1 << 20)
        self.script.unary["ReportActionStatus"] = lambda req, ctx: answer
        outcome = await self.call("ReportActionStatus", payload)
        self.assertEqual(outcome.code, grpc.StatusCode.OK)
        self.assertEqual(outcome.responses, [answer])
        self.assertEqual(self.script.received[0][1], payload)

    async def test_concurrentCalls(self) -> None:
        """[A4] Many calls at once on one connection each get their own answer."""
        self.script.unary["GetAction"] = lambda req, ctx: req[::-1]
        requests = [os.urandom(100 + i) for i in range(20)]

        def many() -> list[Outcome]:
            call = self.proxy.channel.unary_unary(
                "/proto.WorkflowService/GetAction",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            futs = [call.future(r, timeout=10) for r in requests]
            return [Outcome(grpc.StatusCode.OK, None, [f.result()], {}) for f in futs]

        outcomes = await deferToThread(many)
        self.assertEqual(
            [o.responses[0] for o in outcomes], [r[::-1] for r in requests]
        )
        self.assertEqual(self.proxy.sample("fleetd_tink_active_streams"), 0.0)

    async def test_noDelay_bothHops(self) -> None:
        """[A4] TCP_NODELAY is set on the client's connection (under TLS) and
        on the upstream connection, so a call's small frames are not held
        back by Nagle until the peer's delayed ACK (tens of ms at p99)."""
        self.script.unary["GetAction"] = lambda req, ctx: b"ok"
        outcome = await self.call("GetAction", b"x")
        self.assertEqual(outcome.code, grpc.StatusCode.OK)
        [downstream] = self.proxy.factory.protocols
        self.assertTrue(downstream.transport.getTcpNoDelay())  # type: ignore[union-attr]
        upstream = self.proxy.pool._current
        assert upstream is not None
        self.assertTrue(upstream.transport.getTcpNoDelay())  # type: ignore[union-attr]


class UpstreamFailureTests(TestCase):
    """tink-server down or restarting [A4]."""

    timeout = 60

    async def test_upstreamDown_unavailable(self) -> None:
        """[A4] With nothing listening upstream, calls end UNAVAILABLE (14),
        and the connect error is counted."""
        server = FakeTinkServer()
        port = server.port
        server.stop(None).wait(5)
        proxy = Proxy(self, port)
        outcome: Outcome = await deferToThread(
            unary, proxy.channel, "GetAction", b"", timeout=10
        )
        self.assertEqual(outcome.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(outcome.details, "fleetd: tink-server is unreachable")
        self.assertGreaterEqual(
            proxy.sample("fleetd_tink_upstream_errors_total", reason="connect"), 1.0
        )

    async def test_tlsUpstream(self) -> None:
        """[A4] A tls: upstream (tink-server with its own TLS): verified
        against upstream_ca for the host named, ALPN h2; calls pass. With
        the wrong CA the upstream is refused and calls get UNAVAILABLE."""
        keyPEM, certPEM = selfSignedCertificate()
        server = FakeTinkServer(tls=(keyPEM, certPEM))
        self.addCleanup(server.stop, None)
        server.script.unary["GetAction"] = lambda req, ctx: b"over tls"
        proxy = Proxy(self, server.port, upstream="tls:localhost", upstreamCA=certPEM)
        outcome: Outcome = await deferToThread(unary, proxy.channel, "GetAction", b"")
        self.assertEqual(outcome.responses, [b"over tls"])
        _, otherPEM = selfSignedCertificate()
        wrong = Proxy(self, server.port, upstream="tls:localhost", upstreamCA=otherPEM)
        outcome = await deferToThread(unary, wrong.channel, "GetAction", b"")
        self.assertEqual(outcome.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(server.script.received, [("GetAction", b"", ANY)])

    async def test_upstreamRestart_midStream(self) -> None:
        """[A4] tink-server stops gracefully (GOAWAY) during a server stream:
        the stream finishes; the next call goes to a fresh connection to the
        restarted server."""
        server = FakeTinkServer()
        release = threading.Event()
        started = threading.Event()

        def slow(req: bytes, ctx: Any) -> Iterator[bytes]:
            yield b"first"
            started.set()
            release.wait(10)
            yield b"second"

        server.script.streaming["GetWorkflowContexts"] = slow
        proxy = Proxy(self, server.port)
        call = deferToThread(
            streaming, proxy.channel, "GetWorkflowContexts", b"", timeout=20
        )
        await deferToThread(started.wait, 10)
        stopped = server.stop(10)  # GOAWAY now, in-flight calls may finish
        await deferLater(proxy.reactor, 0.3, lambda: None)
        release.set()
        outcome: Outcome = await call
        self.assertEqual(outcome.code, grpc.StatusCode.OK)
        self.assertEqual(outcome.responses, [b"first", b"second"])
        await deferToThread(stopped.wait, 10)

        restarted = FakeTinkServer(server.port)
        self.addCleanup(restarted.stop, None)
        restarted.script.unary["GetAction"] = lambda req, ctx: b"again"
        outcome = await deferToThread(unary, proxy.channel, "GetAction", b"")
        self.assertEqual(
            (outcome.code, outcome.responses), (grpc.StatusCode.OK, [b"again"])
        )
        self.assertGreaterEqual(
            proxy.sample("fleetd_tink_upstream_errors_total", reason="goaway"), 1.0
        )


class DaemonTinkTests(DaemonTestMixin, TestCase):
    """The whole daemon: a tink-agent's workflow through fleetd's tink
    listener to a grpcio tink-server, then the node's return [B1] [B2]."""

    timeout = 60

    async def waitFor(self, service: FleetdService, event: str) -> list[str]:
        for _ in range(500):
            entries = await service.journal.query(device="w1")
            events = [e.event for e in entries]
            if event in events:
                return events
            await deferLater(reactor, 0.01, lambda: None)
        self.fail(f"{event} never journaled")

    async def test_agentWorkflow_thenHookOSAgain(self) -> None:
        """[B1] [B2] [A4] Through the running daemon: GetAction, RUNNING and
        SUCCESS reports, FAILED_PRECONDITION: journaled as rebooting; the
        agent back on a new connection with the configuration unread:
        journaled once and FleetNodeBootedHookOSAfterInstall exposed."""
        upstream = FakeTinkServer()
        self.addCleanup(upstream.stop, None)
        script = upstream.script
        served = agent.ActionResponse(workflow_id="ns/wf", action_id="a0")
        calls = {"GetAction": 0}

        def getAction(req: bytes, ctx: Any) -> bytes:
            calls["GetAction"] += 1
            if calls["GetAction"] == 1:
                data: bytes = served.SerializeToString()
                return data
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "Workflow not running")
            raise AssertionError("abort raises")

        script.unary["GetAction"] = getAction
        script.unary["ReportActionStatus"] = lambda req, ctx: b""
        self.makeSettings(
            {"tink": {"upstream": f"tcp:127.0.0.1:{upstream.port}", "min_reboot": 0}}
        )
        service = self.startDaemon()
        mac = "52:54:00:00:00:01"
        await provisionedDevice(service, mac)
        ca = self.pki.public_ca.read_bytes()
        port = self.port(service, "tink")
        request = agent.ActionRequest(agent_id=mac).SerializeToString()

        def workflow() -> list[grpc.StatusCode]:
            ch = channel(port, ca)
            try:
                codes = [unary(ch, "GetAction", request).code]
                for state in (2, 5):  # RUNNING, SUCCESS
                    report = agent.ActionStatusRequest(
                        workflow_id="ns/wf",
                        agent_id=mac,
                        action_id="a0",
                        action_state=state,  # type: ignore[arg-type]
                    ).SerializeToString()
                    codes.append(unary(ch, "ReportActionStatus", report).code)
                codes.append(unary(ch, "GetAction", request).code)
                return codes
            finally:
                ch.close()

        codes = await deferToThread(workflow)
        self.assertEqual(
            codes,
            [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.FAILED_PRECONDITION],
        )
        await self.waitFor(service, "boot.rebooting")

        def poll() -> grpc.StatusCode:
            ch = channel(port, ca)  # a new connection: the agent restarted
            try:
                return unary(ch, "GetAction", request).code
            finally:
                ch.close()

        for _ in range(2):
            self.assertEqual(
                await deferToThread(poll), grpc.StatusCode.FAILED_PRECONDITION
            )
        events = await self.waitFor(service, "boot.hookos-after-install")
        self.assertEqual(events.count("boot.hookos-after-install"), 1)
        self.assertEqual(
            service.alerts.openFor("w1"), ["FleetNodeBootedHookOSAfterInstall"]
        )
        value = service.registry.get_sample_value(
            "fleetd_tink_rpcs_total",
            {"method": "/proto.WorkflowService/GetAction", "code": "9"},
        )
        self.assertEqual(value, 3.0)

    async def test_stop_drainsCallsInFlight(self) -> None:
        """[A4] fleetd stopping sends GOAWAY and lets a call in flight
        finish before its listener closes."""
        upstream = FakeTinkServer()
        self.addCleanup(upstream.stop, None)
        entered = threading.Event()
        release = threading.Event()

        def slow(req: bytes, ctx: Any) -> bytes:
            entered.set()
            release.wait(10)
            return b"finished"

        upstream.script.unary["GetAction"] = slow
        self.makeSettings({"tink": {"upstream": f"tcp:127.0.0.1:{upstream.port}"}})
        service = self.startDaemon()
        ca = self.pki.public_ca.read_bytes()
        ch = channel(self.port(service, "tink"), ca)
        self.addCleanup(ch.close)
        call = deferToThread(unary, ch, "GetAction", b"")
        await deferToThread(entered.wait, 10)
        stopping = service.stopService()
        await deferLater(reactor, 0.2, lambda: None)
        self.assertFalse(stopping.called)  # draining, not cut off
        release.set()
        outcome: Outcome = await call
        self.assertEqual(
            (outcome.code, outcome.responses), (grpc.StatusCode.OK, [b"finished"])
        )
        await stopping
