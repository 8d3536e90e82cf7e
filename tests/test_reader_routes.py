"""
[O4] A reader against every change route of the admin listener, the
owner API's and the console's, found in the code (L{changeRoutes},
L{staticChanges}): each is refused with 403 and one line, journaled with
the reader as actor and the attempted action, and nothing changes; the
reads answer a reader as they answer an owner.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.admin import deviceflow, devices, journal, kube, provision, readers, trust
from fleetd.admin.console import device as consoleDevice
from fleetd.admin.console import deviceactions, gate, login, verify
from fleetd.admin.console import journal as consoleJournal
from fleetd.admin.readers import refusalLine
from fleetd.admin.resource import OwnerGate
from tests.daemonsupport import UUID1, DeliveryMixin
from tests.ownersupport import CSV
from tests.readersupport import (
    Pair,
    adminRoot,
    changeRoutes,
    jsonBody,
    landed,
    reader,
    request,
    staticChanges,
)

EK = "ab" * 32
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"

# Every change route of the owner API: (path, body, type, the class it reaches).
API_CHANGES: list[tuple[str, Any, str, type]] = [
    ("/v1/admin/journal/reanchor", {"reason": "r"}, JSON, journal.ReanchorResource),
    ("/v1/admin/devices", {"name": "w9", "serial": "SN-9", "uuid": UUID1,
                           "class": "worker"}, JSON, devices.DevicesResource),
    ("/v1/admin/devices/w1/forget-identity", {"reason": "r"}, JSON,
     devices.ForgetIdentityResource),
    ("/v1/admin/devices/import", CSV, "text/csv", devices.ImportResource),
    ("/v1/admin/cluster-token/request", {"node": "w1", "reason": "r"}, JSON,
     kube._Command),
    ("/v1/admin/cluster-token/approve", {"request": "ctr-1"}, JSON, kube._Command),
    ("/v1/admin/cluster-token/rotate", {}, JSON, kube._Command),
    ("/v1/admin/retire", {"device": "w1"}, JSON, kube._Command),
    ("/v1/admin/provision", {"devices": ["w1"]}, JSON, provision.ProvisionEndpoint),
    ("/v1/admin/evidence", {"serial": "SN-1", "ek_sha256": EK,
                            "kind": "receiving-scan"}, JSON, trust.EvidenceResource),
    ("/v1/admin/evidence/import", f"serial,ek_sha256\nSN-1,{EK}\n", "text/csv",
     trust.ImportEvidence),
    ("/v1/admin/evidence/1/withdraw", {"reason": "r"}, JSON, trust.WithdrawEvidence),
    ("/v1/admin/bindings/approve", {"serial": "SN-1"}, JSON, trust.ApproveBinding),
    ("/v1/admin/disks/w1/forget", {"reason": "r"}, JSON, trust.ForgetDisks),
    ("/v1/admin/device-flow/approve", {"user_code": "BCDF-GHJK", "device": "w1"},
     JSON, deviceflow._Decision),
    ("/v1/admin/device-flow/deny", {"user_code": "BCDF-GHJK"}, JSON,
     deviceflow._Decision),
]  # fmt: skip
# Every change of the console: (path, form fields, the class it reaches).
CONSOLE_CHANGES: list[tuple[str, dict[str, str], type]] = [
    ("/device", {"user_code": "BCDF-GHJK", "device": "w1", "action": "approve"},
     verify.VerifyPage),
    ("/devices/w1/provision", {"run": ""}, deviceactions.Provision),
    ("/devices/w1/approve-binding", {"ek_sha256": EK}, deviceactions.ApproveBinding),
    ("/devices/w1/deny", {"request": "dfr-1"}, deviceactions.DenyRequest),
    ("/devices/w1/retire", {"confirm_name": "w1"}, deviceactions.Retire),
]  # fmt: skip
# Posts a reader may make, each tested below: (path, the class it reaches).
READER_POSTS: list[tuple[str, type]] = [
    ("/v1/admin/console/login-link", gate.LoginLinkResource),
    ("/journal/verify", consoleJournal.VerifyNow),
    ("/logout", gate.Logout),
    ("/login", login.Login),  # no operator door: the link's role (ConsoleLinkTests)
]
# Classes that answer every method themselves and are no route of their own.
NOT_ROUTES = {
    OwnerGate: "the owner gate (past it: the routes above)",
    gate.Guarded: "the console gate (past it: the routes above)",
    gate._Refused: "a console refusal",
    readers._Refused: "a reader's refusal",
    consoleDevice._NotFound: "a console 404 page",
    consoleDevice.DevicesPages: "/devices alone: a 404 page",
    deviceactions._Action: "the base of the console's device actions above",
}
# The reads a reader may make, answered as an owner's are.
API_READS = [
    "/v1/admin/whoami", "/v1/admin/journal", "/v1/admin/journal/verify",
    "/v1/admin/devices", "/v1/admin/devices/w1", "/v1/admin/status/w1",
    "/v1/admin/evidence", "/v1/admin/bindings", "/v1/admin/device-flow",
    "/v1/admin/cluster-token", "/healthz", "/metrics",
]  # fmt: skip
CONSOLE_READS = ["/", "/devices/w1", "/device", "/journal", "/journal?device=w1"]


class RouteTableTests(DeliveryMixin, TestCase):
    """Every change route found in the code is in the tables above [O4]."""

    timeout = 60

    async def test_everyChangeRoute_classified(self) -> None:
        """
        [O4] Each resource class of fleetd.admin that takes a change, and
        each fixed path of the daemon's admin tree that leads to one, has a
        row in this module's tables, and each row's path reaches its class:
        a change endpoint added later fails here until it is tested.
        """
        await self.startLoaded()
        root = adminRoot(self.service)
        rows = [(p, cls) for p, _, _, cls in API_CHANGES]
        rows += [(p, cls) for p, _, cls in CONSOLE_CHANGES] + READER_POSTS
        for path, cls in rows:
            found = landed(root, "POST", path)
            self.assertIsInstance(found, cls, f"POST {path} reaches {found!r}")
        covered = {cls for _, cls in rows} | set(NOT_ROUTES)
        unclassified = sorted(
            f"{cls.__module__}.{cls.__qualname__} ({', '.join(sorted(m)) or 'render'})"
            for cls, m in changeRoutes().items()
            if cls not in covered
        )
        self.assertEqual(unclassified, [], "change routes no reader test covers")
        paths = {p for p, _ in rows}
        missing = sorted(p for p in staticChanges(root) if p not in paths)
        self.assertEqual(missing, [], "change paths no reader test covers")


class ReaderRoutesTests(DeliveryMixin, TestCase):
    """A reader over TLS against the real daemon [O4]."""

    timeout = 120

    async def setUpDaemon(self) -> None:
        await self.startLoaded()
        await self.addDevice("w1", "SN-1", UUID1)
        self.port_ = self.port(self.service, "admin")

    def call(
        self,
        method: str,
        path: str,
        pair: Pair | None,
        body: bytes | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        sent = dict(headers or {})
        if kind is not None:
            sent["content-type"] = kind
        return deferToThread(
            request, self.port_, method, path, self.pki.public_ca, pair, body, sent
        )

    def owner(self) -> Pair:
        return self.pki.owner_cert, self.pki.owner_key

    async def refusals(self) -> dict[str, list[dict[str, Any]]]:
        """The journal's reader refusals, by actor."""
        found: dict[str, list[dict[str, Any]]] = {}
        for entry in await self.journal():
            if entry["event"] == "admin.reader-refused":
                found.setdefault(entry["actor"], []).append(entry)
        return found

    async def others(self) -> list[tuple[str, str]]:
        """Every journal entry that is not a reader's refusal: (event, actor)."""
        return [
            (e["event"], e["actor"])
            for e in await self.journal()
            if e["event"] != "admin.reader-refused"
        ]

    async def test_api_everyChangeRefused(self) -> None:
        """
        [O4] Each change route of the owner API refuses a reader with 403
        and one line naming the reader and the action; each refusal is
        journaled (actor reader:NAME, action, via api) and nothing else is:
        no device, run, binding, token or decision came of it.
        """
        await self.setUpDaemon()
        before, devicesBefore = (
            await self.others(),
            await self.admin("GET", "/v1/admin/devices", None),
        )
        for index, (path, document, kind, _) in enumerate(API_CHANGES):
            name = f"reader-api-{index}"
            if kind == JSON:
                body, kind = jsonBody(document)
            else:
                body = document.encode()
            code, _, answer = await self.call(
                "POST", path, reader(self.pki, name), body, kind
            )
            self.assertEqual(
                (code, answer.decode()),
                (403, refusalLine(name, f"POST {path}") + "\n"),
                path,
            )
        refused = await self.refusals()
        for index, (path, _, _, _) in enumerate(API_CHANGES):
            (entry,) = refused[f"reader:reader-api-{index}"]
            self.assertEqual(
                entry["fields"],
                {"action": f"POST {path}", "via": "api", "not_journaled": 0},
            )
        self.assertEqual(await self.others(), before)
        devicesAfter = await self.admin("GET", "/v1/admin/devices", None)
        self.assertEqual(devicesAfter, devicesBefore)

    async def test_console_everyChangeRefused(self) -> None:
        """
        [O4] Each change of the console, posted by a reader's browser with
        its own valid CSRF token, is refused with 403 and the reader's line,
        journaled (via console), and changes nothing.
        """
        await self.setUpDaemon()
        sessions = self.service.consoleSessions
        before = await self.others()
        for index, (path, fields, _) in enumerate(CONSOLE_CHANGES):
            name = f"reader-console-{index}"
            form = {**fields, "csrf": sessions.certificateCSRF(name, "reader")}
            code, headers, answer = await self.call(
                "POST", path, reader(self.pki, name), urlencode(form).encode(), FORM
            )
            self.assertEqual(
                (code, answer.decode()),
                (403, refusalLine(name, f"POST {path}") + "\n"),
                path,
            )
            self.assertEqual(headers["x-frame-options"], "DENY")
        refused = await self.refusals()
        for index, (path, _, _) in enumerate(CONSOLE_CHANGES):
            (entry,) = refused[f"reader:reader-console-{index}"]
            self.assertEqual(
                entry["fields"],
                {"action": f"POST {path}", "via": "console", "not_journaled": 0},
            )
        self.assertEqual(await self.others(), before)

    async def test_reads_answerAReader(self) -> None:
        """
        [O4] A reader reads what an owner reads: status, lists, the journal
        and its verification, the device flow's pending list and a backup
        (journaled with the reader as actor); /healthz and /metrics stay
        open without a certificate.
        """
        await self.setUpDaemon()
        pair = reader(self.pki, "auditor")
        for path in API_READS:
            mine = await self.call("GET", path, pair)
            theirs = await self.call("GET", path, self.owner())
            self.assertEqual(mine[0], theirs[0], path)
            self.assertNotEqual(mine[0], 403, path)
        for path in ("/healthz", "/metrics"):
            self.assertEqual((await self.call("GET", path, None))[0], 200, path)
        code, _, body = await self.call("GET", "/v1/admin/whoami", pair)
        self.assertEqual(body, b'{"owner": "auditor", "role": "reader"}\n')
        code, headers, copy = await self.call("GET", "/v1/admin/backup", pair)
        self.assertEqual(code, 200)
        self.assertEqual(headers["content-type"], "application/vnd.sqlite3")
        self.assertTrue(copy.startswith(b"SQLite format 3\x00"))
        events = [(e["event"], e["actor"]) for e in await self.journal()]
        self.assertIn(("backup.taken", "reader:auditor"), events)

    async def test_console_pagesOfferAReaderNoChange(self) -> None:
        """
        [O4] A reader's console pages (the fleet, a device, the verification
        page, the journal) show what an owner's show, without an action, a
        lookup form or a decision; the address of an action's confirmation
        page is a 403 page without its form, and a user code cannot be
        looked up (a lookup spends the owners' budget). The reader may walk
        the chain ("Verify now") and log out, which change nothing.
        """
        await self.setUpDaemon()
        pair = reader(self.pki, "auditor")
        before = await self.others()
        for path in CONSOLE_READS:
            code, _, page = await self.call("GET", path, pair)
            self.assertEqual(code, 200, path)
            text = page.decode()
            self.assertNotIn('method="post" action="/device"', text, path)
            self.assertNotRegex(text, r'href="/devices/w1/[a-z-]+"', path)
            self.assertIn("auditor", text)
        self.assertNotIn(
            'name="user_code"', (await self.call("GET", "/device", pair))[2].decode()
        )
        owned = (await self.call("GET", "/devices/w1", self.owner()))[2].decode()
        self.assertIn('href="/devices/w1/provision"', owned)
        for action in ("provision", "approve-binding", "retire", "deny"):
            code, _, page = await self.call("GET", f"/devices/w1/{action}", pair)
            self.assertEqual(code, 403, action)
            self.assertIn("auditor holds a reader certificate", page.decode())
            self.assertNotIn(
                'method="post"',
                re.sub(r"<header>.*</header>", "", page.decode(), flags=re.S),
            )
        code, _, page = await self.call("GET", "/device?user_code=BCDF-GHJK", pair)
        self.assertEqual(code, 403)
        self.assertIn("looking up a user code is an owner&#39;s step", page.decode())
        csrf = self.service.consoleSessions.certificateCSRF("auditor", "reader")
        form = urlencode({"csrf": csrf}).encode()
        code, headers, _ = await self.call("POST", "/journal/verify", pair, form, FORM)
        self.assertEqual((code, headers["location"]), (303, "/journal"))
        code, _, _ = await self.call("POST", "/logout", pair, form, FORM)
        self.assertEqual(code, 200)
        self.assertEqual(await self.others(), before)
        self.assertEqual(await self.refusals(), {})
