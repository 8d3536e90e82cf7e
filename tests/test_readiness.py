"""
Readiness (design.md, Listeners): C{/healthz} says C{starting} or C{failed}
with a reason until fleetd can serve, C{fleetd_ready} follows, and
systemd hears C{READY=1} over a real C{AF_UNIX} datagram socket.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd.admin.resource import Health
from fleetd.readiness import Readiness, notifySystemd
from tests.support import REPO


def healthz(readiness: Readiness) -> tuple[int, dict[str, object], DummyRequest]:
    request = DummyRequest([b""])
    resource: Any = Health(Clock(), "site", "1.0", readiness)
    body = resource.render_GET(request)
    return request.responseCode or 200, json.loads(body), request


class HealthzTests(SynchronousTestCase):
    """C{/healthz} is a readiness signal, not a liveness one."""

    def setUp(self) -> None:
        self.registry = CollectorRegistry()
        self.readiness = Readiness(self.registry)

    def ready(self) -> float | None:
        return self.registry.get_sample_value("fleetd_ready")

    def test_starting_503(self) -> None:
        """While the runs load, /healthz is 503 "starting" and fleetd_ready 0."""
        code, body, request = healthz(self.readiness)
        self.assertEqual((code, body["status"]), (503, "starting"))
        self.assertEqual(request.responseHeaders.getRawHeaders(b"retry-after"), [b"5"])
        self.assertEqual(self.ready(), 0.0)

    def test_loaded_200(self) -> None:
        """Once loaded, /healthz is 200 "ok" and fleetd_ready 1."""
        self.readiness.loaded()
        code, body, _ = healthz(self.readiness)
        self.assertEqual((code, body["status"]), (200, "ok"))
        self.assertEqual((body["site"], body["version"]), ("site", "1.0"))
        self.assertEqual(self.ready(), 1.0)

    def test_failed_503WithReason(self) -> None:
        """
        A load that failed is 503 "failed" with the reason, for good: a
        later call to loaded() changes nothing, fleetd_ready stays 0.
        """
        self.readiness.failed("loading the runs failed: StoreError: gone")
        self.readiness.loaded()
        code, body, _ = healthz(self.readiness)
        self.assertEqual(code, 503)
        self.assertEqual(
            {k: body[k] for k in ("status", "reason")},
            {"status": "failed", "reason": "loading the runs failed: StoreError: gone"},
        )
        self.assertEqual(self.ready(), 0.0)

    def test_whenSettled_afterLoadEitherWay(self) -> None:
        """Observers wait for the load to settle, loaded or failed, once."""
        calls: list[str] = []
        self.readiness.whenSettled(lambda: calls.append("early"))
        self.assertEqual(calls, [])
        self.readiness.failed("x")
        self.readiness.failed("y")
        self.readiness.whenSettled(lambda: calls.append("late"))
        self.assertEqual(calls, ["early", "late"])


class NotifyTests(SynchronousTestCase):
    """C{READY=1} reaches the service manager's socket, as sd_notify(3) sends it."""

    def listen(self, address: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(sock.close)
        sock.bind(address)
        sock.setblocking(False)
        return sock

    def test_pathSocket_receivesReady(self) -> None:
        """A NOTIFY_SOCKET that is a path gets the datagram."""
        directory = tempfile.mkdtemp(prefix="fleetd-notify-")  # sun_path is short
        self.addCleanup(os.rmdir, directory)
        path = os.path.join(directory, "notify")
        sock = self.listen(path)
        self.addCleanup(os.unlink, path)
        self.assertTrue(notifySystemd(b"READY=1", {"NOTIFY_SOCKET": path}))
        self.assertEqual(sock.recv(4096), b"READY=1")

    def test_abstractSocket_receivesReady(self) -> None:
        """A leading '@' names the abstract namespace (a NUL byte on the wire)."""
        name = f"fleetd-test-{os.getpid()}-{id(self)}"
        sock = self.listen("\0" + name)
        self.assertTrue(notifySystemd(b"READY=1", {"NOTIFY_SOCKET": "@" + name}))
        self.assertEqual(sock.recv(4096), b"READY=1")

    def test_noSocket_nothingSent(self) -> None:
        """Not under systemd (no NOTIFY_SOCKET): nothing is sent, no error."""
        self.assertFalse(notifySystemd(b"READY=1", {}))
        self.assertFalse(notifySystemd(b"READY=1", {"NOTIFY_SOCKET": ""}))

    def test_goneSocket_loggedNotRaised(self) -> None:
        """A socket nobody listens on is a warning, never an exception."""
        with capturedLogs() as events:
            sent = notifySystemd(b"READY=1", {"NOTIFY_SOCKET": "@fleetd-nobody-here"})
        self.assertFalse(sent)
        self.assertIn(
            "systemd.notify.failed", [e["log_format"].split()[0] for e in events]
        )


class UnitTests(SynchronousTestCase):
    """The shipped systemd unit waits for READY=1."""

    def test_unit_typeNotify(self) -> None:
        """conf/fleetd.service is Type=notify: systemctl start returns once ready."""
        lines = (Path(REPO) / "conf" / "fleetd.service").read_text().splitlines()
        self.assertIn("Type=notify", lines)
        self.assertNotIn("Type=exec", lines)


class SelfCheckReadinessTests(SynchronousTestCase):
    """
    Ready means loaded and every TLS listener passed its self-check
    (issue 27, item 2): until then /healthz says why, a later failure
    drops readiness with the listener named, and a pass restores it.
    """

    def setUp(self) -> None:
        self.registry = CollectorRegistry()
        self.sent: list[bytes] = []
        self.readiness = Readiness(self.registry, self.sent.append)
        self.readiness.expect(["boot", "tink"])

    def gauge(self, listener: str | None = None) -> float | None:
        if listener is None:
            return self.registry.get_sample_value("fleetd_ready")
        return self.registry.get_sample_value(
            "fleetd_listener_selfcheck_ok", {"listener": listener}
        )

    def test_loadedButUnchecked_starting(self) -> None:
        """Loaded, no self-check yet: 503 "starting" with the reason,
        fleetd_ready 0, each listener's gauge 0, nothing sent to systemd."""
        self.readiness.loaded()
        code, body, _ = healthz(self.readiness)
        self.assertEqual(
            (code, body["status"], body["reason"]),
            (503, "starting", "waiting for the first TLS self-check of each listener"),
        )
        self.assertEqual((self.gauge(), self.gauge("boot")), (0.0, 0.0))
        self.assertEqual(self.sent, [])

    def test_brokenListener_neverReady(self) -> None:
        """A listener whose handshake fails keeps fleetd "starting", the
        reason naming it (systemd's STATUS too); never READY=1."""
        self.readiness.loaded()
        self.readiness.checked("boot", None)
        self.readiness.checked("tink", "the connection closed during the TLS handshake")
        code, body, _ = healthz(self.readiness)
        self.assertEqual((code, body["status"]), (503, "starting"))
        self.assertEqual(
            body["reason"],
            "listener tink: the connection closed during the TLS handshake",
        )
        self.assertEqual((self.gauge("boot"), self.gauge("tink")), (1.0, 0.0))
        self.assertEqual(
            self.sent,
            [
                b"STATUS=starting: listener tink: the connection closed"
                b" during the TLS handshake"
            ],
        )

    def test_allPassed_readyOnce(self) -> None:
        """Loaded and every listener passed: 200, fleetd_ready 1, READY=1
        sent once and fleetd.ready logged, in either order of the facts."""
        self.readiness.checked("boot", None)
        self.readiness.checked("tink", None)
        self.assertEqual(self.sent, [])
        with capturedLogs() as events:
            self.readiness.loaded()
        self.assertEqual(healthz(self.readiness)[0], 200)
        self.assertEqual((self.gauge(), self.gauge("tink")), (1.0, 1.0))
        self.assertEqual(self.sent, [b"READY=1\nSTATUS=serving"])
        self.assertEqual([e["log_format"] for e in events], ["fleetd.ready"])
        self.readiness.checked("tink", None)
        self.assertEqual(self.sent, [b"READY=1\nSTATUS=serving"])

    def test_laterFailure_degradedThenBack(self) -> None:
        """After ready, a failed self-check: 503 "degraded" naming the
        listener, fleetd_ready 0 and its gauge 0, systemd told; a pass
        brings "ok" back (STATUS=serving, no second READY=1)."""
        self.readiness.loaded()
        self.readiness.checked("boot", None)
        self.readiness.checked("tink", None)
        self.readiness.checked("tink", "TLS error: tlsv1 alert internal error")
        code, body, _ = healthz(self.readiness)
        self.assertEqual(
            (code, body["status"], body["reason"]),
            (503, "degraded", "listener tink: TLS error: tlsv1 alert internal error"),
        )
        self.assertEqual((self.gauge(), self.gauge("tink")), (0.0, 0.0))
        self.readiness.checked("tink", None)
        self.assertEqual(healthz(self.readiness)[1]["status"], "ok")
        self.assertEqual(self.gauge(), 1.0)
        self.assertEqual(
            self.sent,
            [
                b"READY=1\nSTATUS=serving",
                b"STATUS=degraded: listener tink: TLS error: tlsv1 alert"
                b" internal error",
                b"STATUS=serving",
            ],
        )

    def test_failedLoad_winsOverChecks(self) -> None:
        """A failed load is "failed" with its reason whatever the listeners say."""
        self.readiness.checked("boot", None)
        self.readiness.checked("tink", None)
        self.readiness.failed("loading the runs failed: StoreError: gone")
        self.assertEqual(healthz(self.readiness)[1]["status"], "failed")
        self.assertEqual(
            self.sent, [b"STATUS=loading the runs failed: StoreError: gone"]
        )
