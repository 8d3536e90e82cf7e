"""
[O4] How the admin listener's doors refuse a reader: journaled at most
once per reader and window (the rest counted), only once the request
itself is well-formed (a forged form is no attempt of the reader's), the
console's login link carrying the reader's role into its session, and
fleetctl printing the refusal's line.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.readers import refusalLine
from fleetd.admin.resource import adminRoot
from fleetd.attest.throttle import NAMED_EVERY
from fleetd.pki.owners import READER, rolePolicies
from fleetd.store import AsyncJournal, Database, InlineRunner, Journal
from fleetd.web.site import BoundedSite
from tests.consolesupport import ConsoleMixin
from tests.daemonsupport import UUID1, DeliveryMixin
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.ownersupport import OwnerSiteMixin, PKIMixin, issue
from tests.readersupport import reader

PROVISION = b'{"devices": ["w1"]}'


class ThrottleTests(OwnerSiteMixin, PKIMixin, SynchronousTestCase):
    """The owner gate's refusals of readers, journaled per reader [O4]."""

    def setUp(self) -> None:
        self.makePKI()
        db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(db.close)
        self.clock = Clock()
        self.journal = AsyncJournal(InlineRunner(db), Journal(b"k" * 32), self.clock)
        root = adminRoot(
            clock=self.clock, registry=CollectorRegistry(), journal=self.journal,
            site="test", version="0",
        )  # fmt: skip
        self.site = BoundedSite(
            root, maxHeaderBytes=8192, maxHeaders=32, maxBodyBytes=1 << 20,
            idleTimeout=30, clock=self.clock,
        )  # fmt: skip
        self.owner, _, _ = issue(self.pki, "bob", extensions=[rolePolicies(READER)])

    def refusals(self) -> list[tuple[str, Any]]:
        entries = self.successResultOf(self.journal.query())
        return [
            (e.actor, e.fields) for e in entries if e.event == "admin.reader-refused"
        ]

    def test_flood_oneEntryPerReaderAndWindow(self) -> None:
        """
        [O4] [J1] A reader's script posting in a loop gets a 403 every
        time, but the journal takes one entry per window; the next one
        counts those it did not take. Another reader has its own count.
        A forged body is refused (415) before, and is not counted [O3].
        """
        # A body a browser form can send (another page posting through the
        # reader's browser) is a 415 as for an owner: no attempt of bob's.
        status, _ = self.send("POST", "/v1/admin/provision", b"x=1", "text/plain")
        self.assertEqual(status, 415)
        for _ in range(50):
            status, body = self.send("POST", "/v1/admin/provision", PROVISION)
            self.assertEqual(
                (status, body.decode()),
                (403, refusalLine("bob", "POST /v1/admin/provision") + "\n"),
            )
        carol, _, _ = issue(self.pki, "carol", extensions=[rolePolicies(READER)])
        self.assertEqual(
            self.send("POST", "/v1/admin/retire", b"{}", cert=carol)[0], 403
        )
        self.clock.advance(NAMED_EVERY)
        self.send("POST", "/v1/admin/journal/reanchor", b'{"reason": "x"}')
        action = {"action": "POST /v1/admin/provision", "via": "api"}
        self.assertEqual(
            self.refusals(),
            [
                ("reader:bob", {**action, "not_journaled": 0}),
                ("reader:carol", {"action": "POST /v1/admin/retire", "via": "api",
                                  "not_journaled": 0}),
                ("reader:bob", {"action": "POST /v1/admin/journal/reanchor",
                                "via": "api", "not_journaled": 49}),
            ],
        )  # fmt: skip

    def test_query_notJournaled(self) -> None:
        """[O4] The action journaled is the method and path: never the query."""
        self.send("POST", "/v1/admin/provision?token=s3cret", PROVISION)
        ((_, fields),) = self.refusals()
        self.assertEqual(fields["action"], "POST /v1/admin/provision")

    def test_otherMethods_refused(self) -> None:
        """[O4] Any method but GET and HEAD is a change: PUT, DELETE, PATCH."""
        for method in ("PUT", "DELETE", "PATCH"):
            status, _ = self.send(method, "/v1/admin/devices/w1", b"{}")
            self.assertEqual(status, 403, method)
        self.assertEqual(
            self.send("HEAD", "/v1/admin/whoami", contentType=None)[0], 200
        )


class ConsoleDoorTests(ConsoleMixin, TestCase):
    """The console's door for readers, and their login links [O4]."""

    timeout = 60

    async def test_readerLink_opensAReaderSession(self) -> None:
        """
        [O4] fleetctl console as a reader gets a link (journaled with the
        reader as actor) that opens a reader's session: its pages offer no
        change, and a change posted with the session's own CSRF token is
        refused and journaled as the reader's, via the console. The same
        post without the token (a forged form) is refused as any such form
        is [O3], and not journaled as the reader's attempt.
        """
        await self.startConsole()
        await self.addDevice("w1", "SN-1", UUID1)
        code, _, body = await self.page(
            "POST", "/v1/admin/console/login-link", None, role="reader",
            headers={"content-type": "application/json"},
        )  # fmt: skip
        self.assertEqual((code, json.loads(body)["role"]), (201, "reader"))
        browser = self.stub
        code, headers, page = await self.signIn(json.loads(body)["url"], browser)
        self.assertEqual(code, 200)
        cookie = headers.getRawHeaders("set-cookie")[0].split(";")[0]
        sent = {"cookie": cookie}
        code, _, page = await self.page("GET", "/devices/w1", owner=None, headers=sent)
        self.assertEqual(code, 200)
        self.assertNotIn('href="/devices/w1/provision"', page)
        self.assertIn("reader", page)
        code, _, body = await self.page(
            "POST", "/devices/w1/provision", {"run": ""}, owner=None, headers=sent
        )
        self.assertEqual(code, 403)
        self.assertIn("CSRF token is missing or wrong", body)
        found = re.search(r'name="csrf" value="([^"]*)"', page)
        assert found is not None
        form = {"run": "", "csrf": html.unescape(found.group(1))}
        code, _, body = await self.page(
            "POST", "/devices/w1/provision", form, owner=None, headers=sent
        )
        self.assertEqual(
            (code, body),
            (403, refusalLine("alice", "POST /devices/w1/provision") + "\n"),
        )
        entries = [(e["event"], e["actor"]) for e in await self.journal()]
        for event in ("console.link-issued", "console.session-opened"):
            self.assertIn((event, "reader:alice"), entries)
        refused = [e for e in entries if e[0] == "admin.reader-refused"]
        self.assertEqual(refused, [("admin.reader-refused", "reader:alice")])
        self.assertNotIn("run.created", [e for e, _ in entries])


class FleetctlTests(DeliveryMixin, TestCase):
    """fleetctl with a reader's certificate [O4]."""

    timeout = 60

    async def test_reader_printsTheRefusal_readsAndBacksUp(self) -> None:
        """
        [O4] fleetctl as a reader: a change prints fleetd's 403 line and
        exits non-zero; status, a console link (saying it reads only) and a
        backup work.
        """
        await self.startLoaded()
        await self.addDevice("w1", "SN-1", UUID1)
        cert, key = reader(self.pki, "backup")
        port = self.port(self.service, "admin")
        mine = {"client_cert": str(cert), "client_key": str(key)}
        server = {"server": f"https://localhost:{port}"}
        config = ownerConfig(self.directory, port, {"owner": server | mine})
        code, out, err = await fleetctlAgainst(config, "provision", "w1")
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(
            err,
            "fleetctl: fleetd answered 403: "
            + refusalLine("backup", "POST /v1/admin/provision")
            + "\n",
        )
        code, out, err = await fleetctlAgainst(config, "status", "w1")
        self.assertEqual((code, err), (0, ""))
        code, out, _ = await fleetctlAgainst(config, "console")
        self.assertEqual(code, 0)
        self.assertIn("as a reader: the console shows everything and changes", out)
        backup = Path(self.mktemp())
        code, out, err = await fleetctlAgainst(config, "backup", str(backup))
        self.assertEqual((code, err), (0, ""))
        self.assertIn("integrity ok", out)
