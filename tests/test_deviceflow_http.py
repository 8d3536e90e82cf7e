"""
The device flow over HTTP: the boot resources over real TLS with a client
that polls as Talos does (golang.org/x/oauth2), bad bodies, the admin
resources through StubTreq, and C{fleetctl approve} against a real TLS
admin listener with the owner gate.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import treq
from treq.client import HTTPClient
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import (
    Agent,
    HTTPConnectionPool,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.iweb import IPolicyForHTTPS, IRequest
from zope.interface import implementer

from fleetd.admin.deviceflow import deviceFlowAdminResource
from fleetd.admin.resource import adminRoot
from fleetd.boot.deviceflow_resource import deviceCodeResource, tokenResource
from fleetd.config import TLSFiles
from fleetd.deviceflow.flow import GRANT_TYPE, DeviceFlow, Grant
from fleetd.listen.tls import loadTLSOptions
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from fleetd.store import AsyncJournal
from fleetd.web.resources import Endpoint, Router, jsonResponse
from fleetd.web.site import BoundedSite
from tests.deviceflowsupport import IDENTITY, REPORTED, FakeRuns, makeJournal
from tests.fleetctlsupport import fleetctlAgainst
from tests.support import writeConfig

NAME = "enroll.lolwtf.ca"
FORM: dict[bytes | str, list[bytes | str]] = {
    b"content-type": [b"application/x-www-form-urlencoded"]
}


def listenTLS(options: Any, site: BoundedSite) -> tuple[Any, int]:
    """Listen on 127.0.0.1, any port, with TLS in front of C{site}."""
    tcp: Any = reactor
    port = tcp.listenTCP(
        0, TLSMemoryBIOFactory(options, False, site), interface="127.0.0.1"
    )
    return port, int(port.getHost().port)


def makeFlow(
    clock: Clock, runs: FakeRuns, journal: AsyncJournal, **kwargs: Any
) -> DeviceFlow:
    return DeviceFlow(
        clock, runs, journal, verificationURI=f"https://{NAME}/device", **kwargs
    )


@implementer(IPolicyForHTTPS)
class TrustDevCA:
    """Verify the server as the enrollment name against the dev public CA."""

    def __init__(self, ca: Path) -> None:
        self._ca = Certificate.loadPEM(ca.read_bytes())

    def creatorForNetloc(
        self, hostname: bytes, port: int
    ) -> IOpenSSLClientConnectionCreator:
        return optionsForClientTLS(NAME, trustRoot=self._ca)


class TalosClient:
    """
    The polling of golang.org/x/oauth2's C{DeviceAuth} and
    C{DeviceAccessToken}, as Talos configures it: one token request right
    after the code, then one every C{interval} (plus 5 s per slow_down);
    each unsuccessful request is sent twice (auth-style probe: Basic header,
    then parameters only); access_denied and expired_token stop it.
    """

    def __init__(
        self, http: HTTPClient, base: str, sleep: Callable[[int], Awaitable[None]]
    ) -> None:
        self.http = http
        self.base = base
        self.sleep = sleep
        self.answers: list[str] = []
        self.intervals: list[int] = []

    async def post(
        self, path: str, form: dict[str, str], basic: bool = False
    ) -> tuple[int, dict[str, Any]]:
        headers = dict(FORM)
        if basic:
            credentials = base64.b64encode(f"{form['client_id']}:".encode())
            headers[b"authorization"] = [b"Basic " + credentials]
        response = await self.http.post(self.base + path, data=form, headers=headers)
        body = await treq.content(response)
        self.assertHeaders(response)
        return response.code, json.loads(body)

    def assertHeaders(self, response: Any) -> None:
        headers = response.headers
        assert headers.getRawHeaders(b"content-type") == [b"application/json"]
        assert headers.getRawHeaders(b"cache-control") == [b"no-store"]

    async def retrieve(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        status, document = await self.post("/token", form, basic=True)
        if 200 <= status < 300:
            return status, document
        return await self.post("/token", form)

    async def run(self, extra: dict[str, str]) -> tuple[str, dict[str, Any]]:
        status, auth = await self.post("/device/code", {"client_id": "talos", **extra})
        if status != 200:
            return f"device-auth-{status}", auth
        self.auth = auth
        form = {
            "client_id": "talos",
            "grant_type": GRANT_TYPE,
            "device_code": auth["device_code"],
            **extra,
        }
        status, document = await self.retrieve(form)
        if status == 200:
            return "token", document
        interval = int(auth.get("interval") or 5)
        while True:
            self.intervals.append(interval)
            await self.sleep(interval)
            status, document = await self.retrieve(form)
            if status == 200:
                return "token", document
            error = str(document.get("error"))
            self.answers.append(error)
            if error == "slow_down":
                interval += 5
            elif error != "authorization_pending":
                return error, document


class BootTLSTests(TestCase):
    """The boot resources in a BoundedSite over real TLS on 127.0.0.1."""

    def setUp(self) -> None:
        self.pki = ensureDevPKI(Path(self.mktemp()), NAME)
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.runs = FakeRuns()
        self.journal = makeJournal(self, self.clock)

    def serve(self, flow: DeviceFlow, maxBody: int = 4096) -> str:
        root = Router()
        device = Router()
        device.putChild(b"code", deviceCodeResource(flow))
        root.putChild(b"device", device)
        root.putChild(b"token", tokenResource(flow))
        site = BoundedSite(
            root,
            maxHeaderBytes=8192,
            maxHeaders=32,
            maxBodyBytes=maxBody,
            idleTimeout=30,
            clock=reactor,
        )
        options = loadTLSOptions(
            TLSFiles(cert=self.pki.public_cert, key=self.pki.public_key)
        )
        port, number = listenTLS(options, site)
        self.addCleanup(port.stopListening)
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.http = HTTPClient(
            Agent(reactor, contextFactory=TrustDevCA(self.pki.public_ca), pool=pool)
        )
        return f"https://127.0.0.1:{number}"

    def talos(
        self, flow: DeviceFlow, base: str, at: dict[int, Callable[[], object]]
    ) -> TalosClient:
        """A Talos client whose sleeps advance the flow's clock, with hooks."""
        sleeps = [0]

        async def sleep(seconds: int) -> None:
            self.clock.advance(seconds)
            sleeps[0] += 1
            hook = at.get(sleeps[0])
            if hook is not None:
                hook()

        return TalosClient(self.http, base, sleep)

    async def test_talos_approvedMidway_getsToken(self) -> None:
        """
        A client polling as Talos does gets authorization_pending, no
        slow_down, then the token after the owner approves midway; the
        token authorizes the device's ready run; nothing secret is logged.
        """
        flow = makeFlow(self.clock, self.runs, self.journal)
        base = self.serve(flow)
        client = self.talos(flow, base, {})
        client.sleep = self._approvingSleep(flow, client, after=3)
        with capturedLogs() as events:
            outcome, token = await client.run(REPORTED)
        self.assertEqual(outcome, "token")
        self.assertEqual(token["token_type"], "Bearer")
        self.assertEqual(client.answers, ["authorization_pending"] * 2)
        self.assertEqual(client.intervals, [5, 5, 5])
        self.assertEqual(
            flow.authorize(token["access_token"]),
            Grant("w1", REPORTED["uuid"], REPORTED["serial"], IDENTITY),
        )
        entries = await self.journal.query()
        # Requests are not journaled (anyone can make them); decisions are.
        self.assertEqual(
            [e.event for e in entries], ["deviceflow.approved", "deviceflow.issued"]
        )
        self.assertEqual(entries[1].device, "w1")
        text = "\n".join(formatEvent(e) + repr(e) for e in events)
        text += json.dumps([e.toJSON() for e in entries])
        for secret in (client.auth["device_code"], token["access_token"]):
            self.assertNotIn(secret, text)
        self.assertNotIn(REPORTED["code"], text)

    def _approvingSleep(
        self, flow: DeviceFlow, client: TalosClient, after: int
    ) -> Callable[[int], Awaitable[None]]:
        count = [0]

        async def sleep(seconds: int) -> None:
            count[0] += 1
            if count[0] == after:
                await Deferred.fromCoroutine(
                    flow.approve(client.auth["user_code"], "w1", "alice")
                )
            self.clock.advance(seconds)

        return sleep

    async def test_talos_denied_stops(self) -> None:
        """A denied request stops the client with access_denied."""
        flow = makeFlow(self.clock, self.runs, self.journal)
        base = self.serve(flow)
        client = self.talos(flow, base, {})
        client.sleep = self._denyingSleep(flow, client)
        outcome, document = await client.run({})
        self.assertEqual(
            (outcome, document), ("access_denied", {"error": "access_denied"})
        )

    def _denyingSleep(
        self, flow: DeviceFlow, client: TalosClient
    ) -> Callable[[int], Awaitable[None]]:
        async def sleep(seconds: int) -> None:
            if flow.pending():
                await Deferred.fromCoroutine(
                    flow.deny(client.auth["user_code"], "alice")
                )
            self.clock.advance(seconds)

        return sleep

    async def test_talos_expired_stops(self) -> None:
        """A request nobody approves ends with expired_token."""
        flow = makeFlow(self.clock, self.runs, self.journal, expiresIn=30)
        base = self.serve(flow)
        client = self.talos(flow, base, {})
        outcome, _ = await client.run({})
        self.assertEqual(outcome, "expired_token")
        self.assertEqual(client.answers[-1], "expired_token")

    async def test_talos_tooFast_slowDown(self) -> None:
        """
        A client that polls every second is told slow_down, adds 5 s each
        time as the RFC says, and still gets its token.
        """
        flow = makeFlow(self.clock, self.runs, self.journal)
        base = self.serve(flow)
        client = self.talos(flow, base, {})
        count = [0]

        async def sleep(seconds: int) -> None:
            count[0] += 1
            if count[0] == 6:
                await Deferred.fromCoroutine(
                    flow.approve(
                        client.auth["user_code"],
                        "w1",
                        "alice",
                        acceptMismatch=["uuid", "serial"],
                    )
                )
            self.clock.advance(1 if count[0] < 4 else seconds)

        client.sleep = sleep
        outcome, _ = await client.run({})
        self.assertEqual(outcome, "token")
        self.assertIn("slow_down", client.answers)
        self.assertEqual(
            client.intervals[-1], 5 + 5 * client.answers.count("slow_down")
        )

    async def post(
        self,
        base: str,
        path: str,
        body: bytes,
        headers: dict[bytes | str, list[bytes | str]],
    ) -> tuple[int, bytes, Any]:
        response = await self.http.request(
            "POST", base + path, data=body, headers=headers
        )
        return response.code, await treq.content(response), response.headers

    async def test_malformedBodies_400NeverA500(self) -> None:
        """
        Invalid UTF-8, bad percent-encoding, repeated or too many fields, no
        body, another content type: 400 invalid_request on both endpoints.
        """
        flow = makeFlow(self.clock, self.runs, self.journal)
        base = self.serve(flow)
        bodies = [
            b"client_id=%ff%fe",
            b"client_id=\xff\xfe",
            b"client_id=a%zzb",
            b"client_id=a%2",
            b"client_id=a&client_id=b",
            b"client_id",
            b"client_id=a&&x=1",
            b"&".join(b"f%d=1" % n for n in range(17)),
        ]
        for path in ("/device/code", "/token"):
            for body in bodies:
                code, data, _ = await self.post(base, path, body, FORM)
                self.assertEqual(
                    (code, json.loads(data)["error"]), (400, "invalid_request"), body
                )
            others: list[dict[bytes | str, list[bytes | str]]] = [
                {},
                {b"content-type": [b"application/json"]},
            ]
            for headers in others:
                code, data, _ = await self.post(base, path, b"client_id=a", headers)
                self.assertEqual(code, 400, headers)
            code, data, _ = await self.post(base, path, b"", FORM)
            self.assertEqual(
                (code, json.loads(data)["error"]), (400, "invalid_request")
            )
        self.assertEqual(flow.pending(), [])

    async def test_methodsAndPaths(self) -> None:
        """GET is a 405 line; a path below the endpoint is 404."""
        base = self.serve(makeFlow(self.clock, self.runs, self.journal))
        for path in ("/device/code", "/token"):
            response = await self.http.get(base + path)
            self.assertEqual(response.code, 405)
            self.assertEqual(await treq.content(response), b"method not allowed\n")
        code, _, _ = await self.post(base, "/token/x", b"a=1", FORM)
        self.assertEqual(code, 404)

    async def test_oversizedBody_refused(self) -> None:
        """
        A body over the site's limit is refused with 413 (or, if the client
        is still sending when the server closes, a closed connection).
        """
        flow = makeFlow(self.clock, self.runs, self.journal)
        base = self.serve(flow, maxBody=256)
        for size in (300, 64 * 1024):
            try:
                code, _, _ = await self.post(
                    base, "/device/code", b"client_id=" + b"a" * size, FORM
                )
            except (ResponseFailed, ResponseNeverReceived, ConnectionLost):
                pass
            else:
                self.assertEqual(code, 413)
        self.assertEqual(flow.pending(), [])

    async def test_deviceCode_full_429RetryAfter(self) -> None:
        """
        [F4] Over its source's share /device/code is 429 with Retry-After
        (until its oldest request expires); /token stays an RFC answer [F1].
        """
        flow = makeFlow(self.clock, self.runs, self.journal, maxPerSource=1)
        base = self.serve(flow)
        code, _, _ = await self.post(base, "/device/code", b"client_id=t", FORM)
        self.assertEqual(code, 200)
        code, data, headers = await self.post(
            base, "/device/code", b"client_id=t", FORM
        )
        self.assertEqual((code, json.loads(data)["error"]), (429, "rate_limited"))
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"600"])
        for _ in range(5):
            code, data, headers = await self.post(base, "/token", b"client_id=t", FORM)
            self.assertEqual(code, 400)
            self.assertIsNone(headers.getRawHeaders(b"retry-after"))


class FakeDevices(Endpoint):
    """C{/v1/admin/devices/NAME} for w1 only."""

    isLeaf = True

    def render_GET(self, request: IRequest) -> bytes:
        if request.postpath != [b"w1"]:
            return jsonResponse(request, 404, {"error": "not found"})
        return jsonResponse(
            request,
            200,
            {
                "name": "w1",
                "serial": "S1",
                "uuid": REPORTED["uuid"].upper(),
                "macs": [REPORTED["mac"]],
            },
        )


class AdminResourceTests(SynchronousTestCase):
    """/v1/admin/device-flow through StubTreq, with a fake owner."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.journal = makeJournal(self, self.clock)
        self.flow = makeFlow(self.clock, FakeRuns(), self.journal)
        self.owner: str | None = "alice"
        root = Router()
        root.putChild(
            b"device-flow",
            deviceFlowAdminResource(self.flow, lambda _: self.owner),
        )
        self.stub = StubTreq(root)

    def newRequest(self, **extra: str) -> dict[str, Any]:
        reply = self.flow.requestCode(
            {"client_id": "talos", **REPORTED, **extra}, "192.0.2.9"
        )
        assert reply.status == 200
        return reply.document

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = self.successResultOf(
            getattr(self.stub, method.lower())("https://admin" + path, data=data)
        )
        return response.code, self.successResultOf(treq.content(response))

    def test_list_noSecret(self) -> None:
        """GET lists pending requests with what was reported, never the code."""
        document = self.newRequest()
        code, body = self.call("GET", "/device-flow")
        self.assertEqual(code, 200)
        (listed,) = json.loads(body)["pending"]
        self.assertEqual(listed["user_code"], document["user_code"])
        self.assertEqual(listed["reported"]["serial"], "S1")
        self.assertIs(listed["code_sent"], True)
        self.assertNotIn(REPORTED["code"], body.decode())
        self.assertNotIn(document["device_code"], body.decode())

    def test_approve_journaled(self) -> None:
        """Approve answers the request and journals it with the owner as actor."""
        document = self.newRequest()
        code, body = self.call(
            "POST",
            "/device-flow/approve",
            {"user_code": document["user_code"].lower(), "device": "w1"},
        )
        self.assertEqual(code, 200, body)
        view = json.loads(body)
        self.assertEqual((view["state"], view["device"]), ("approved", "w1"))
        (entry,) = self.successResultOf(self.journal.query())
        self.assertEqual(
            (entry.event, entry.actor, entry.device),
            ("deviceflow.approved", "owner:alice", "w1"),
        )
        self.assertEqual(entry.fields["request"], view["id"])
        self.assertNotIn("forced", entry.fields)
        journaled = json.dumps(entry.toJSON())
        self.assertNotIn(REPORTED["code"], journaled)
        self.assertNotIn(document["user_code"], journaled)

    def test_deny_journaled(self) -> None:
        """Deny answers the denied request and journals deviceflow.denied."""
        document = self.newRequest()
        code, body = self.call(
            "POST", "/device-flow/deny", {"user_code": document["user_code"]}
        )
        self.assertEqual((code, json.loads(body)["state"]), (200, "denied"))
        (entry,) = self.successResultOf(self.journal.query())
        self.assertEqual(
            (entry.event, entry.actor), ("deviceflow.denied", "owner:alice")
        )

    def test_refusals_oneLine(self) -> None:
        """
        Refusals are one line, KIND: message: 404 unknown code or device,
        409 mismatch and already decided, 410 expired, 400 invalid bodies.
        """
        document = self.newRequest()
        user = document["user_code"]
        cases: list[tuple[Any, int, bytes]] = [
            ({"user_code": "BBBB-BBBB", "device": "w1"}, 404, b"unknown-user-code: "),
            ({"user_code": user, "device": "w2"}, 404, b"unknown-device: "),
            (
                {"user_code": user, "device": "w1", "accept_mismatch": ["serial"]},
                409,
                b"mismatch: ",
            ),
            (
                {"user_code": user, "device": "w1", "accept_mismatch": ["mac"]},
                400,
                b"invalid: ",
            ),
            ({"user_code": user}, 400, b"invalid: "),
            ({"user_code": user, "device": 3}, 400, b"invalid: "),
            ({"user_code": user, "device": "w1", "x": 1}, 400, b"invalid: "),
            (
                b'{"user_code": "a", "user_code": "b", "device": "w1"}',
                400,
                b"invalid: ",
            ),
            (b"\xff", 400, b"invalid: "),
            (b"[]", 400, b"invalid: "),
        ]
        for body, status, prefix in cases:
            code, text = self.call("POST", "/device-flow/approve", body)
            self.assertEqual(code, status, (body, text))
            self.assertTrue(text.startswith(prefix), text)
            self.assertEqual(text.count(b"\n"), 1)
        self.call("POST", "/device-flow/approve", {"user_code": user, "device": "w1"})
        code, text = self.call("POST", "/device-flow/deny", {"user_code": user})
        self.assertEqual(code, 409)
        self.assertTrue(text.startswith(b"already-decided: request dfr-"), text)
        self.assertTrue(text.endswith(b" is already approved\n"), text)
        other = self.newRequest()
        self.clock.advance(600)
        code, text = self.call(
            "POST", "/device-flow/deny", {"user_code": other["user_code"]}
        )
        self.assertEqual(code, 410)

    def test_tooManyAttempts_429(self) -> None:
        """Too many unknown user codes are answered 429."""
        for _ in range(5):
            self.call("POST", "/device-flow/deny", {"user_code": "BBBB-BBBB"})
        code, text = self.call("POST", "/device-flow/deny", {"user_code": "BBBB-BBBB"})
        self.assertEqual(code, 429)
        self.assertTrue(text.startswith(b"too-many-attempts: "))

    def test_noOwner_403(self) -> None:
        """Without an owner name the decision endpoints answer 403."""
        self.owner = None
        code, _ = self.call("POST", "/device-flow/deny", {"user_code": "BBBB-BBBB"})
        self.assertEqual(code, 403)

    def test_methodsAndPaths(self) -> None:
        """GET on a decision is 405; unknown children are 404."""
        self.assertEqual(self.call("GET", "/device-flow/approve")[0], 405)
        self.assertEqual(self.call("GET", "/device-flow/nope")[0], 404)
        self.assertEqual(self.call("GET", "/device-flow/")[0], 200)


class FleetctlApproveTests(TestCase):
    """C{fleetctl approve} against a real TLS admin listener with the owner gate."""

    def setUp(self) -> None:
        from prometheus_client import CollectorRegistry

        directory = Path(self.mktemp()).resolve()
        self.pki: DevPKIPaths = ensureDevPKI(directory / "pki", NAME)
        self.clock = Clock()
        self.clock.advance(1_000_000)
        journal = makeJournal(self, self.clock)
        self.runs = FakeRuns()
        self.flow = makeFlow(self.clock, self.runs, journal)
        root = adminRoot(
            clock=self.clock,
            registry=CollectorRegistry(),
            journal=journal,
            site="test",
            version="0",
            api={
                b"device-flow": deviceFlowAdminResource(self.flow),
                b"devices": FakeDevices(),
            },
        )
        site = BoundedSite(
            root,
            maxHeaderBytes=8192,
            maxHeaders=32,
            maxBodyBytes=4096,
            idleTimeout=30,
            clock=reactor,
        )
        options = loadTLSOptions(
            TLSFiles(cert=self.pki.public_cert, key=self.pki.public_key),
            clientCA=self.pki.owner_ca,
        )
        port, number = listenTLS(options, site)
        self.addCleanup(port.stopListening)
        self.config = str(
            writeConfig(
                directory,
                {"owner": {"server": f"https://localhost:{number}"}},
            )
        )

    def newRequest(self, **reported: str) -> str:
        reply = self.flow.requestCode(
            {"client_id": "talos", **REPORTED, **reported}, "192.0.2.9"
        )
        assert reply.status == 200
        return str(reply.document["user_code"])

    async def fleetctl(self, *argv: str) -> tuple[int, str, str]:
        return await fleetctlAgainst(self.config, *argv)

    async def test_approve_showsReportedAndInventory(self) -> None:
        """
        approve binds the request and prints reported next to inventory
        values, one line per field; the node's next poll gets its token.
        """
        user = self.newRequest()
        code, out, err = await self.fleetctl("approve", user.lower(), "--device", "w1")
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        self.assertEqual(lines[0], f"approved {user} for w1")
        self.assertIn("S1", next(line for line in lines if line.startswith("serial")))
        self.assertNotIn("MISMATCH", out)
        self.assertIn("code      sent", out)
        self.assertNotIn(REPORTED["code"], out)

    async def test_approve_mismatchRefusedUnlessForced(self) -> None:
        """
        A reported serial unlike the inventory's is a MISMATCH: nothing is
        approved (exit 1) unless --force.
        """
        user = self.newRequest(serial="OTHER")
        code, out, err = await self.fleetctl("approve", user, "--device", "w1")
        self.assertEqual(code, 1)
        self.assertIn(
            "MISMATCH",
            next(line for line in out.splitlines() if line.startswith("serial")),
        )
        self.assertEqual(err.count("\n"), 1)
        self.assertEqual(self.flow.pending()[0].state, "pending")
        code, out, _ = await self.fleetctl("approve", user, "--device", "w1", "--force")
        self.assertEqual(code, 0)
        self.assertEqual(
            out.splitlines()[0], f"approved {user} for w1 (forced: serial differ)"
        )
        self.assertIn("MISMATCH", out)

    async def test_approve_json_andNoInventory(self) -> None:
        """--json prints one object; with no inventory record, reported values only."""
        user = self.newRequest()
        code, out, _ = await self.fleetctl("--json", "approve", user, "--device", "w1")
        self.assertEqual(code, 0)
        document = json.loads(out)
        self.assertEqual((document["device"], document["mismatch"]), ("w1", []))
        self.assertEqual(document["inventory"]["serial"], "S1")
        self.runs.ready["w9"] = "run-9"
        self.runs.identities["w9"] = IDENTITY
        other = self.newRequest()
        code, out, _ = await self.fleetctl("approve", other, "--device", "w9")
        self.assertEqual(code, 0)
        self.assertIn("(no inventory record to compare with)", out)

    async def test_deny_andErrors(self) -> None:
        """--deny denies; an unknown code or no --device is one line, non-zero."""
        user = self.newRequest()
        code, out, _ = await self.fleetctl("approve", user, "--deny")
        self.assertEqual((code, out.splitlines()[0]), (0, f"denied {user}"))
        code, _, err = await self.fleetctl("approve", "BBBB-BBBB", "--device", "w1")
        self.assertEqual(code, 1)
        self.assertIn("404: unknown-user-code", err)
        self.assertEqual(err.count("\n"), 1)
        code, _, err = await self.fleetctl("approve", user)
        self.assertEqual((code, err.count("\n")), (2, 1))
