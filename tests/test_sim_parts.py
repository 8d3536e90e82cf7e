"""
Parts of C{fleetd-sim} on their own: the Talos-like fetch's retry schedule
(docs/design.md, who talks to fleetd: only 200 is success, everything else
is retried with growing gaps) against a loopback TLS server, and the
tink-server stand-in's workflows (L{fleetd.testing.tinkserver.Workflows})
played by the grpcio agent (L{fleetd.testing.tinkagent}).
"""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim.talos import LONGEST_GAP, fetchConfig, gaps
from fleetd.testing.tinkagent import getAction, report
from fleetd.testing.tinkserver import FakeTinkServer, Workflows
from tests.h2support import selfSignedCertificate


class _Answers(BaseHTTPRequestHandler):
    statuses: list[int] = []
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        self.seen.append((self.client_address[0], self.path))
        status = self.statuses.pop(0) if self.statuses else 200
        body = b"machine: {}\n" if status == 200 else b"not yet\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class TalosFetchTests(SynchronousTestCase):
    def serve(self, statuses: list[int]) -> tuple[int, Path, type[_Answers]]:
        key, cert = selfSignedCertificate()
        directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "key.pem").write_bytes(key)
        (directory / "cert.pem").write_bytes(cert)
        handler = type("Answers", (_Answers,), {"statuses": statuses, "seen": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
        server.socket = context.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return server.server_address[1], directory / "cert.pem", handler

    def test_retries_untilOK(self) -> None:
        """Talos retries a 503 and a 410 alike, the gaps doubling and
        divided by the time scale, from the node's own address, and
        stops at the first 200 with its body."""
        port, ca, handler = self.serve([503, 410])
        waited: list[float] = []
        status, body = fetchConfig(
            port=port,
            ca=ca,
            source="127.0.1.7",
            query={"code": "c", "uuid": "u", "serial": "s"},
            timeScale=10,
            sleep=waited.append,
        )
        self.assertEqual((status, body), (200, b"machine: {}\n"))
        self.assertEqual(waited, [0.1, 0.2])
        self.assertEqual(
            handler.seen, [("127.0.1.7", "/config?code=c&uuid=u&serial=s")] * 3
        )

    def test_givesUp_withTheLastAnswer(self) -> None:
        """After the last try the last status is the answer."""
        port, ca, handler = self.serve([503] * 20)
        waited: list[float] = []
        status, _ = fetchConfig(
            port=port, ca=ca, source="127.0.1.8", query={"code": "c"},
            timeScale=1, sleep=waited.append,
        )  # fmt: skip
        self.assertEqual(status, 503)
        self.assertEqual(len(handler.seen), len(waited) + 1)

    def test_gaps_growToAnHour(self) -> None:
        """The gaps double from one second up to about an hour."""
        self.assertEqual(gaps(1, 4), [1.0, 2.0, 4.0])
        self.assertEqual(gaps(1, 20)[-1], LONGEST_GAP)
        self.assertEqual(gaps(60, 3), [1 / 60, 2 / 60])


class WorkflowsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = FakeTinkServer()
        self.addCleanup(self.server.stop, None)
        self.workflows = Workflows(self.server)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.addCleanup(self.channel.close)

    def test_playedOut_thenNotRunning(self) -> None:
        """Each action is served until reported SUCCESS, in order; then
        GetAction ends FAILED_PRECONDITION (workflow not running)."""
        mac = "52:54:00:00:00:01"
        self.workflows.add(mac, "sim/w1", ["attest", "plan"])
        ran = []
        while (action := getAction(self.channel, mac)) is not None:
            report(self.channel, mac, action, True)
            self.assertEqual(getAction(self.channel, mac).action_id, action.action_id)
            report(self.channel, mac, action, False)
            ran.append(action.action_id)
        self.assertEqual(ran, ["attest", "plan"])
        self.assertTrue(self.workflows.finished(mac))

    def test_noWorkflow_notFound(self) -> None:
        """An agent with no workflow is told NOT_FOUND."""
        error = self.assertRaises(
            RuntimeError, getAction, self.channel, "52:54:00:00:00:02"
        )
        self.assertIn("NOT_FOUND", str(error))

    def test_reportOfAnotherAction_refused(self) -> None:
        """A report naming an action other than the one served is refused."""
        mac = "52:54:00:00:00:03"
        self.workflows.add(mac, "sim/w3", ["attest", "plan"])
        action = getAction(self.channel, mac)
        action.action_id = "plan"
        error = self.assertRaises(
            RuntimeError, report, self.channel, mac, action, False
        )
        self.assertIn("INVALID_ARGUMENT", str(error))
        self.assertFalse(self.workflows.finished(mac))
