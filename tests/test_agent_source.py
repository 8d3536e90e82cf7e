"""
C{fleetd-agent --source ADDRESS}: every HTTP path of the agent connects
from that local address (a node with several interfaces; fleetd-sim's
nodes, each on its own loopback address). A loopback TLS server records
the address each request came from: urllib (attest, plan, renew with a
software key), http.client (disks) and the TPM key's child process
(L{fleetd.agent.mtls}, given a software key here: the address travels in
the request the parent sends the child, whatever the key).
"""

from __future__ import annotations

import functools
import http.server
import json
import ssl
import threading
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.agent import client, mtls
from fleetd.agent import disks as agent_disks
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from tests.swtpmsupport import runAgent

SOURCE = "127.0.0.2"  # Linux routes all of 127/8 to lo


@functools.cache
def _pki() -> DevPKIPaths:
    """One dev PKI for the module, in trial's temporary directory."""
    return ensureDevPKI(Path("agent-source-pki").absolute(), "enroll.example.test")


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers C{{}} to any request, noting the address it came from."""

    seen: list[str]

    def answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.seen.append(self.client_address[0])
        body = b"{}"
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class SourceAddressTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.pki = _pki()
        seen: list[str] = []
        self.seen = seen
        handler = type("Handler", (Recorder,), {"seen": seen})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.pki.public_cert, self.pki.public_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(thread.join, 10)
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        self.server = f"https://127.0.0.1:{server.server_address[1]}"
        self.ca = str(self.pki.public_ca)

    def test_call_source_urllibBindsIt(self) -> None:
        """urllib (attest, plan, renew): from C{--source}; without it, from
        the address the kernel chooses (127.0.0.1 towards 127.0.0.1)."""
        context = client.tlsContext(self.ca)
        self.assertEqual(client.call(self.server, "/v1/x", context, {}, SOURCE), {})
        self.assertEqual(client.call(self.server, "/v1/x", context, {}), {})
        self.assertEqual(self.seen, [SOURCE, "127.0.0.1"])

    def test_httpsPost_source_httpClientBindsIt(self) -> None:
        """http.client (disks): from C{--source}."""
        post = agent_disks.httpsPost(self.server, self.ca, source=SOURCE)
        self.assertEqual(post(agent_disks.PATH, b"{}"), (200, b"{}"))
        self.assertEqual(self.seen, [SOURCE])

    def test_tpmSender_source_childBindsIt(self) -> None:
        """The TPM key's child process (plan, disks, renew with a TPM key)
        is sent the address with its request and connects from it."""
        send = mtls.tpmSender(
            "tabrmd:bus_type=session",
            self.ca,
            self.pki.public_cert,
            self.pki.public_key,
            SOURCE,
        )
        self.assertEqual(send("POST", self.server + "/v1/x", b"{}"), (200, b"{}"))
        self.assertEqual(self.seen, [SOURCE])

    def test_disksCommand_source_fromIt(self) -> None:
        """C{fleetd-agent --source ADDRESS disks} with a software LDevID
        key: the report comes from ADDRESS."""
        state = Path(self.mktemp())
        state.mkdir()
        (state / "ldevid.pem").write_bytes(self.pki.public_cert.read_bytes())
        (state / "ldevid.key").write_bytes(self.pki.public_key.read_bytes())
        report = state / "disks.json"
        disk = {"name": "vda", "serial": "S1", "wwn": None, "size": 1 << 34,
                "removable": False}  # fmt: skip
        report.write_text(json.dumps({"disks": [disk]}))
        code, out, err = runAgent(
            ["--server", self.server, "--ca", self.ca, "--source", SOURCE,
             "--state", str(state), "--json", "disks", "--from", str(report)]
        )  # fmt: skip
        self.assertEqual((code, out), (0, "{}\n"), err)
        self.assertEqual(self.seen, [SOURCE])


class BadSourceTests(SynchronousTestCase):
    def test_source_notAnAddress_oneLine(self) -> None:
        """A C{--source} that is no IP address: one line, exit status 1,
        as the agent's other usage errors."""
        code, out, err = runAgent(
            ["--server", "https://127.0.0.1:1", "--source", "node-7", "plan"]
        )
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(
            err,
            "fleetd-agent: argument --source: --source must be an IP address,"
            " not 'node-7'\n",
        )
