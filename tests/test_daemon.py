"""
Integration tests: the whole daemon on loopback with real TLS clients.

Each test builds L{FleetdService} from a temporary dev-style config with
port 0 everywhere, starts it on the real reactor and talks to it with
Python's C{ssl} (in a thread, so the reactor keeps serving).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rdatatype
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase

from fleetd.pki.dev import ensureDevPKI
from fleetd.reactors import fleetdReactor
from fleetd.readiness import notifySystemd
from fleetd.service import FleetdService, StartupError, prepare
from fleetd.vault import VaultError
from tests.daemonsupport import DaemonTestMixin, httpsGet
from tests.support import OPTIONAL_METRICS, exposedMetrics, ruleMetrics


def peerCertificate(
    port: int, alpn: list[str] | None = None
) -> tuple[bytes, str | None]:
    """The DER certificate presented on C{port} and the ALPN protocol chosen."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(alpn)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="enroll.lolwtf.ca") as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return der, tls.selected_alpn_protocol()


class FakeCollector:
    """Records what the daemon asks of the garbage collector."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def get_threshold(self) -> tuple[int, int, int]:
        return (700, 10, 10)

    def set_threshold(self, *thresholds: int) -> None:
        self.calls.append(("set_threshold", *thresholds))

    def collect(self, generation: int = 2) -> int:
        self.calls.append(("collect",))
        return 0

    def freeze(self) -> None:
        self.calls.append(("freeze",))

    def disable(self) -> None:
        self.calls.append(("disable",))

    def enable(self) -> None:
        self.calls.append(("enable",))


class DaemonTests(DaemonTestMixin, TestCase):
    def setUp(self) -> None:
        self.makeSettings()

    async def test_collector_tunedAtStart_frozenOnceLoaded(self) -> None:
        """
        The youngest generation is collected less often from the start, no
        cycles are collected while the runs load, and what start-up loaded
        is frozen once they are, with the collector back on.
        """
        collector = FakeCollector()
        service = self.startDaemon(collector)
        start = [("set_threshold", 7000, 10, 10), ("disable",)]
        self.assertEqual(collector.calls, start)
        await service.loading.whenReady()
        self.assertEqual(
            collector.calls, [*start, ("collect",), ("freeze",), ("enable",)]
        )

    async def test_healthz_onAdmin(self) -> None:
        """[A3] /healthz answers on the admin listener over TLS, dev CA verified."""
        service = self.startDaemon()
        await service.loading.whenReady()
        status, ctype, body = await self.get(service, "admin", "/healthz")
        self.assertEqual((status, ctype), (200, b"application/json"))
        self.assertEqual(json.loads(body)["status"], "ok")

    async def test_alertRules_useExposedMetrics(self) -> None:
        """Every fleetd metric an alert rule uses is one fleetd exposes."""

        service = self.startDaemon()
        # The journal's series appear with its first verification, which
        # follows the run load.
        await service.loading.whenReady()
        await service.chain.verify()
        _, _, body = await self.get(service, "admin", "/metrics")
        exposed = exposedMetrics(body.decode())
        used = {
            name
            for name in ruleMetrics()
            if not name.startswith(OPTIONAL_METRICS)
            # The staged time only with [kubernetes]: tests/test_grafana.py's
            # daemon has it (and its dashboard shows it).
            and name != "fleetd_staged_longest_seconds"
        }
        self.assertTrue(used)
        self.assertEqual(used - exposed, set())

    async def test_metrics_onAdmin_promtoolClean(self) -> None:
        """[A3] /metrics is on the admin listener and passes promtool check metrics."""
        service = self.startDaemon()
        status, ctype, body = await self.get(service, "admin", "/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith(b"text/plain"))
        text = body.decode()
        self.assertIn('fleetd_listener_max_connections{listener="boot"} 64.0', text)
        self.assertIn("process_resident_memory_bytes", text)
        result = await deferToThread(
            subprocess.run,
            ["promtool", "check", "metrics"],
            input=body,
            capture_output=True,
            timeout=60,
        )
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    async def test_bootAndDevice_404ForMetrics(self) -> None:
        """[A2][A3] The boot and device listeners answer 404 for /metrics and admin."""
        service = self.startDaemon()
        for listener in ("boot", "device"):
            for path in ("/metrics", "/healthz", "/v1/admin/journal"):
                # The device listener verifies client certificates against the
                # LDevID bundle [T4]: an owner's is refused there at TLS.
                owner = listener == "boot"
                status, _, body = await self.get(service, listener, path, owner=owner)
                self.assertEqual(
                    (status, body), (404, b"not found\n"), (listener, path)
                )

    async def test_adminAPI_needsOwnerCertificate(self) -> None:
        """/v1/admin/* without an owner client certificate is refused with 403."""
        service = self.startDaemon()
        status, _, body = await self.get(service, "admin", "/v1/admin/journal")
        self.assertEqual((status, body), (403, b"owner client certificate required\n"))
        status, _, body = await self.get(
            service, "admin", "/v1/admin/whoami", owner=True
        )
        self.assertEqual(
            (status, json.loads(body)), (200, {"owner": "owner", "role": "owner"})
        )
        status, _, body = await self.get(
            service, "admin", "/v1/admin/journal", owner=True
        )
        self.assertEqual(status, 200)
        events = [e["event"] for e in json.loads(body)["entries"]]
        self.assertIn("fleetd.started", events)

    async def test_adminAPI_foreignCertificateRefused(self) -> None:
        """A client certificate from another CA does not get through the handshake."""
        service = self.startDaemon()
        other = ensureDevPKI(Path(self.mktemp()), "enroll.lolwtf.ca")
        port = self.port(service, "admin")
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            await deferToThread(
                httpsGet,
                port,
                "/v1/admin/journal",
                self.pki.public_ca,
                (other.owner_cert, other.owner_key),
            )

    def test_webListeners_timersAreSweeps(self) -> None:
        """
        Every web listener closes idle connections by its sweep
        (limits.idle_timeout, no Twisted HTTP timer per connection) and
        slow requests by its site's deadline sweep (limits.request_timeout).
        """
        from fleetd.listen.connections import LimitedFactory
        from fleetd.web.site import BoundedSite

        service = self.startDaemon()
        limits = self.settings.limits
        for name in ("boot", "device", "admin"):
            limited = service.listeners[name].factory
            self.assertIsInstance(limited, LimitedFactory, name)
            self.assertEqual(limited.idleTimeout, limits.idle_timeout, name)
            tls = limited.wrappedFactory
            site = tls.wrappedFactory
            self.assertIsInstance(site, BoundedSite, name)
            self.assertIsNone(site.timeOut, name)
            self.assertEqual(site.requestTimeout, limits.request_timeout, name)

    async def test_webListeners_negotiateHTTP11(self) -> None:
        """A client offering h2 (curl, Go) gets HTTP/1.1 on the web listeners."""
        service = self.startDaemon()
        for name in ("boot", "device", "admin"):
            _, alpn = await deferToThread(
                peerCertificate, self.port(service, name), ["h2", "http/1.1"]
            )
            self.assertEqual(alpn, "http/1.1", name)
        status, _, _ = await self.get(service, "boot", "/metrics")
        self.assertEqual(status, 404)

    async def test_tink_sameCertificateAndALPN(self) -> None:
        """[A4] The tink listener presents the boot listener's certificate, ALPN h2."""
        service = self.startDaemon()
        boot, _ = await deferToThread(peerCertificate, self.port(service, "boot"))
        tink, alpn = await deferToThread(
            peerCertificate, self.port(service, "tink"), ["h2", "http/1.1"]
        )
        self.assertEqual(boot, tink)
        self.assertEqual(
            boot, ssl.PEM_cert_to_DER_cert(self.pki.public_cert.read_text())
        )
        self.assertEqual(alpn, "h2")

    async def test_dns_answersEnrollmentName(self) -> None:
        """
        [A5] The running daemon's DNS listener answers the enrollment name
        (dnspython, and dig over UDP and TCP), authoritatively.
        """
        service = self.startDaemon()
        assert service.dns.udpPort is not None and service.dns.tcpPort is not None
        address: Any = service.dns.udpPort.getHost()
        port = int(address.port)
        query = dns.message.make_query("enroll.lolwtf.ca", dns.rdatatype.A)
        answer = await deferToThread(dns.query.udp, query, "127.0.0.1", 5, port)
        self.assertEqual([str(r) for r in answer.answer[0]], ["10.20.0.6"])
        # With port 0 the TCP port is the UDP one only when that was free.
        tcpAddress: Any = service.dns.tcpPort.getHost()
        for transport, p in (("+notcp", port), ("+tcp", int(tcpAddress.port))):
            out, err, code = await getProcessOutputAndValue(
                "dig",
                ["@127.0.0.1", "-p", str(p), "enroll.lolwtf.ca", "A", "+norec",
                 transport, "+time=5", "+tries=1"],
            )  # fmt: skip
            self.assertEqual(code, 0, (transport, out, err))
            self.assertIn(b"status: NOERROR", out)
            self.assertRegex(out, rb"flags: qr aa")
            self.assertRegex(
                out, rb"enroll\.lolwtf\.ca\.\s+\d+\s+IN\s+A\s+10\.20\.0\.6"
            )

    async def test_stop_closesPorts(self) -> None:
        """Stopping the service closes every listening port."""
        service = self.startDaemon()
        ports = {name: self.port(service, name) for name in service.listeners}
        await service.stopService()
        for name, port in ports.items():
            with self.assertRaises(ConnectionRefusedError, msg=name):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()

    async def test_restart_rebuildsVault(self) -> None:
        """[V2] A restart over the same directories rebuilds the vault unchanged."""
        first = self.startDaemon()
        first.vault.put("run-1.yaml", b"machine: {}\n")
        first.vault.put("run-2.yaml", b"cluster: {}\n")
        before = {n: first.vault.get(n) for n in first.vault.names()}
        await first.stopService()
        second = self.startDaemon()
        self.assertEqual({n: second.vault.get(n) for n in second.vault.names()}, before)
        status, _, body = await self.get(
            second, "admin", "/v1/admin/journal", owner=True
        )
        self.assertEqual(status, 200)
        events = [e["event"] for e in json.loads(body)["entries"]]
        self.assertEqual(events.count("fleetd.started"), 2)
        _, _, body = await self.get(
            second, "admin", "/v1/admin/journal/verify", owner=True
        )
        self.assertTrue(json.loads(body)["ok"])


class ReadinessTests(DaemonTestMixin, TestCase):
    """
    /healthz, fleetd_ready and systemd's READY=1 follow the run load
    (design.md, Listeners), on the real daemon and a real AF_UNIX socket.
    """

    def setUp(self) -> None:
        self.makeSettings()
        directory = tempfile.mkdtemp(prefix="fleetd-notify-")  # sun_path is short
        self.addCleanup(shutil.rmtree, directory)
        self.notifyPath = os.path.join(directory, "notify")
        self.systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(self.systemd.close)
        self.systemd.bind(self.notifyPath)
        self.systemd.setblocking(False)

    def received(self) -> list[bytes]:
        messages = []
        while True:
            try:
                messages.append(self.systemd.recv(4096))
            except BlockingIOError:
                return messages

    def startHeld(self, collector: Any = None) -> tuple[FleetdService, Deferred[None]]:
        """A daemon whose run load waits for the returned Deferred."""
        service = FleetdService(
            prepare(self.settings),
            fleetdReactor(reactor),
            notify=lambda m: notifySystemd(m, {"NOTIFY_SOCKET": self.notifyPath}),
            collector=collector,
        )
        held: Deferred[None] = Deferred()
        load = service.runs.load

        async def heldLoad(checkVault: Callable[[], None] | None = None) -> None:
            await held
            await load(checkVault)

        service.runs.load = heldLoad  # type: ignore[method-assign]
        service.privilegedStartService()
        service.startService()
        self.addCleanup(self.stopDaemon, service)
        return service, held

    async def healthz(self, service: FleetdService) -> tuple[int, dict[str, Any]]:
        status, _, body = await self.get(service, "admin", "/healthz")
        return status, json.loads(body)

    async def metric(self, service: FleetdService) -> bytes:
        _, _, body = await self.get(service, "admin", "/metrics")
        return next(
            line for line in body.splitlines() if line.startswith(b"fleetd_ready ")
        )

    async def test_healthz_startingUntilLoaded_thenReadyNotified(self) -> None:
        """
        While the runs load, /healthz is 503 "starting" and fleetd_ready 0;
        once loaded it is 200, fleetd_ready 1, and READY=1 reaches the
        NOTIFY_SOCKET (a real datagram socket) exactly then.
        """
        service, held = self.startHeld()
        status, body = await self.healthz(service)
        self.assertEqual((status, body["status"]), (503, "starting"))
        self.assertEqual(await self.metric(service), b"fleetd_ready 0.0")
        self.assertEqual(self.received(), [])
        held.callback(None)
        await service.loading.whenReady()
        self.assertEqual(self.received(), [b"READY=1\nSTATUS=serving"])
        status, body = await self.healthz(service)
        self.assertEqual((status, body["status"]), (200, "ok"))
        self.assertEqual(await self.metric(service), b"fleetd_ready 1.0")
        await service.stopService()
        self.assertEqual(self.received(), [b"STOPPING=1"])

    async def test_databaseReadFailed_loadFailsWithItsReason(self) -> None:
        """
        The run load asks for its reads at once (issue 17 item 17); the one
        that fails is the reason /healthz gives, not the gathering's
        wrapper (FirstError).
        """
        prepared = prepare(self.settings)
        with prepared.database.transaction() as conn:
            conn.execute("ALTER TABLE runs RENAME TO runs_elsewhere")
        service = FleetdService(prepared, fleetdReactor(reactor))
        service.privilegedStartService()
        service.startService()
        self.addCleanup(self.stopDaemon, service)
        await service.loading.whenReady()
        self.flushLoggedErrors()
        status, body = await self.healthz(service)
        self.assertEqual((status, body["status"]), (503, "failed"))
        self.assertEqual(
            body["reason"],
            "loading the runs failed: OperationalError: no such table: runs",
        )

    async def test_vaultCheckFailed_loadFailsWithItsReason(self) -> None:
        """
        Issue 17 item 17: the vault's entries are checked while the runs
        are read; when that check fails the load fails with its reason
        (not a wrapper's), no run is restored, and fleetd never says ready.
        """
        service = FleetdService(
            prepare(self.settings),
            fleetdReactor(reactor),
            notify=lambda m: notifySystemd(m, {"NOTIFY_SOCKET": self.notifyPath}),
        )
        unchecked = service._uncheckedVault
        assert unchecked is not None

        def unreadable() -> list[str]:
            raise VaultError(
                "cannot load vault /run/fleetd/configs: Input/output error"
            )

        unchecked.inspect = unreadable  # type: ignore[method-assign]
        service.privilegedStartService()
        service.startService()
        self.addCleanup(self.stopDaemon, service)
        await service.loading.whenReady()
        self.flushLoggedErrors(VaultError)
        status, body = await self.healthz(service)
        self.assertEqual((status, body["status"]), (503, "failed"))
        self.assertEqual(
            body["reason"],
            "loading the runs failed: VaultError: cannot load vault"
            " /run/fleetd/configs: Input/output error",
        )
        self.assertFalse(service.runs.loaded)
        self.assertNotIn(b"READY=1", b"\n".join(self.received()).split(b"\n"))

    async def test_healthz_loadFailed_503WithReason_neverReady(self) -> None:
        """
        A run load that failed leaves /healthz at 503 "failed" with the
        reason (not "ok" while every node is refused), fleetd_ready at 0,
        systemd never hears READY=1, and the garbage collector paused for
        the load is on again.
        """
        collector = FakeCollector()
        service, held = self.startHeld(collector)
        held.errback(RuntimeError("the database is gone"))
        await service.loading.whenReady()
        self.flushLoggedErrors(RuntimeError)
        status, body = await self.healthz(service)
        self.assertEqual((status, body["status"]), (503, "failed"))
        self.assertEqual(
            body["reason"],
            "loading the runs failed: RuntimeError: the database is gone",
        )
        self.assertEqual(await self.metric(service), b"fleetd_ready 0.0")
        messages = self.received()
        self.assertNotIn(b"READY=1", b"\n".join(messages).split(b"\n"))
        self.assertEqual(
            messages,
            [b"STATUS=loading the runs failed: RuntimeError: the database is gone"],
        )
        # Nothing to freeze, but cycles are collected again.
        self.assertEqual(collector.calls[-2:], [("disable",), ("enable",)])


class ConnectionLimitTests(DaemonTestMixin, TestCase):
    def setUp(self) -> None:
        self.makeSettings({"limits": {"max_connections": 2}})

    async def test_maxConnections_closesExtra(self) -> None:
        """A connection beyond limits.max_connections is closed at once."""
        service = self.startDaemon()
        port = self.port(service, "boot")

        def third() -> bytes:
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
            try:
                extra = socket.create_connection(("127.0.0.1", port), timeout=5)
                with extra:
                    return extra.recv(10)  # b"" once the server closes it
            finally:
                for s in held:
                    s.close()

        self.assertEqual(await deferToThread(third), b"")


class StartupFailureTests(DaemonTestMixin, TestCase):
    def test_portInUse_oneLineAndNothingLeft(self) -> None:
        """A listener that cannot bind stops start-up and closes the others."""
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        self.addCleanup(busy.close)
        port = busy.getsockname()[1]
        self.makeSettings({"listen": {"admin": f"tcp:{port}:interface=127.0.0.1"}})
        service = FleetdService(prepare(self.settings), fleetdReactor(reactor))
        e = self.assertRaises(StartupError, service.privilegedStartService)
        self.assertIn("listen.admin", str(e))
        self.assertNotIn("\n", str(e))
        boot = service.listeners["boot"]
        self.assertIsNone(boot.port)
