"""
Readiness proves that a client can connect (issue 27, item 2; design.md,
Listeners), on the real daemon over loopback: fleetd says ready only once
a TLS handshake with ALPN succeeded on each of its listeners, a later
failure drops C{/healthz}, C{fleetd_ready} and the listener's
C{fleetd_listener_selfcheck_ok}, and a pass brings them back.

A listener's TLS is broken the way C{PR_SET_MDWE} breaks it: building its
context raises cffi's C{MemoryError}, so the listener drops every
connection (tests/test_hardening.py does it with the real prctl).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from OpenSSL import SSL
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from fleetd.reactors import fleetdReactor
from fleetd.readiness import State
from fleetd.service import FleetdService, prepare
from tests.daemonsupport import DaemonTestMixin


class UnderMDWE:
    """TLS options whose context cannot be built (cffi under PR_SET_MDWE)."""

    def __init__(self, options: Any) -> None:
        self._options = options

    def __getattr__(self, name: str) -> Any:
        # What the listener serves stays readable (the certificate gauge).
        return getattr(self._options, name)

    def getContext(self) -> SSL.Context:
        raise MemoryError("Cannot allocate write+execute memory for ffi.callback()")


class SelfCheckDaemonTests(DaemonTestMixin, TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.makeSettings()
        self.sent: list[bytes] = []

    def start(self, broken: str | None = None) -> FleetdService:
        service = FleetdService(
            prepare(self.settings), fleetdReactor(reactor), notify=self.sent.append
        )
        if broken is not None:
            self.breakListener(service, broken)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(self.stopDaemon, service)
        return service

    def breakListener(self, service: FleetdService, name: str) -> Callable[[], None]:
        """Break listener C{name}'s TLS; return what mends it."""
        connections = service._listeners.tls[name]
        options = connections.options
        connections.options = UnderMDWE(options)  # type: ignore[assignment]

        def mend() -> None:
            connections.options = options

        return mend

    async def until(self, service: FleetdService, state: State, reason: str) -> None:
        """Wait (bounded) until readiness is C{state} with C{reason} in its reason."""
        for _ in range(500):
            readiness = service.readiness
            if readiness.state is state and reason in (readiness.reason or ""):
                return
            await deferLater(reactor, 0.02, lambda: None)
        raise AssertionError(f"{service.readiness.toJSON()} is not {state} ({reason})")

    async def health(self, service: FleetdService) -> tuple[int, dict[str, Any]]:
        status, _, body = await self.get(service, "admin", "/healthz")
        return status, json.loads(body)

    async def gauges(self, service: FleetdService) -> dict[str, str]:
        _, _, body = await self.get(service, "admin", "/metrics")
        wanted = (b"fleetd_ready ", b"fleetd_listener_selfcheck_ok{")
        return {
            name.decode(): value.decode()
            for name, _, value in (line.rpartition(b" ") for line in body.splitlines())
            if name.startswith(wanted[1]) or name + b" " == wanted[0]
        }

    async def test_brokenListener_neverReady(self) -> None:
        """
        With the tink listener's TLS broken, the runs load but fleetd never
        says ready: /healthz 503 "starting" naming the listener,
        fleetd_ready 0 with that listener's self-check gauge at 0, and
        systemd hears the reason, never READY=1.
        """
        service = self.start(broken="tink")
        await service.loading.whenReady()  # the runs are loaded
        await self.until(service, State.STARTING, "listener tink: ")
        service.selfCheck.checkNow()  # once more: still not
        await self.until(service, State.STARTING, "listener tink: ")
        status, body = await self.health(service)
        self.assertEqual(
            (status, body["status"], body["reason"]),
            (503, "starting", "listener tink: the connection closed during the"
             " TLS handshake"),
        )  # fmt: skip
        self.assertEqual(
            await self.gauges(service),
            {
                "fleetd_ready": "0.0",
                'fleetd_listener_selfcheck_ok{listener="boot"}': "1.0",
                'fleetd_listener_selfcheck_ok{listener="device"}': "1.0",
                'fleetd_listener_selfcheck_ok{listener="admin"}': "1.0",
                'fleetd_listener_selfcheck_ok{listener="tink"}': "0.0",
            },
        )
        self.assertNotIn(b"READY=1", b"\n".join(self.sent).split(b"\n"))
        self.assertIn(
            b"STATUS=starting: listener tink: the connection closed during the"
            b" TLS handshake",
            self.sent,
        )
        self.flushLoggedErrors(MemoryError, AttributeError)

    async def test_laterFailure_dropsReadinessUntilItPasses(self) -> None:
        """
        After READY=1, a self-check that fails on the boot listener drops
        /healthz to 503 "degraded" naming it, fleetd_ready and its gauge
        to 0, and tells systemd; once it passes again all are back.
        """
        service = self.start()
        await service.readiness.whenReady()
        self.assertEqual(self.sent, [b"READY=1\nSTATUS=serving"])
        self.assertEqual((await self.health(service))[0], 200)
        mend = self.breakListener(service, "boot")
        service.selfCheck.checkNow()
        await self.until(service, State.DEGRADED, "listener boot: ")
        status, body = await self.health(service)
        self.assertEqual(
            (status, body["status"], body["reason"]),
            (503, "degraded", "listener boot: the connection closed during the"
             " TLS handshake"),
        )  # fmt: skip
        gauges = await self.gauges(service)
        self.assertEqual(gauges["fleetd_ready"], "0.0")
        self.assertEqual(gauges['fleetd_listener_selfcheck_ok{listener="boot"}'], "0.0")
        self.assertEqual(gauges['fleetd_listener_selfcheck_ok{listener="tink"}'], "1.0")
        mend()
        service.selfCheck.checkNow()
        await self.until(service, State.READY, "")
        self.assertEqual((await self.health(service))[0], 200)
        self.assertEqual((await self.gauges(service))["fleetd_ready"], "1.0")
        self.assertEqual(
            self.sent,
            [
                b"READY=1\nSTATUS=serving",
                b"STATUS=degraded: listener boot: the connection closed during"
                b" the TLS handshake",
                b"STATUS=serving",
            ],
        )
        self.flushLoggedErrors(MemoryError, AttributeError)
