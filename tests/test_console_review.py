"""
Review of the owner console (issue 20): each test shows a defect at a
seam, and fails until it is fixed. Nothing here changes fleetd's code.
"""

from __future__ import annotations

import json
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

from treq.testing import StubTreq
from twisted.internet.defer import fail, gatherResults
from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from fleetd.inventory.model import InventoryError
from fleetd.store.db import StoreError
from tests.consolesupport import BASE, ConsoleMixin, text

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"
SERIAL = "SN-1"


def words(body: str) -> str:
    return " ".join(text(body).split())


class ReviewMixin(ConsoleMixin):
    async def loginLink(self, owner: str = "alice") -> str:
        code, _, body = await self.page(
            "POST", "/v1/admin/console/login-link", None, owner=owner,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        if code != 201:
            raise AssertionError(f"login link refused: {code} {body}")
        url: str = json.loads(body)["url"]
        return url

    async def session(self, owner: str = "alice") -> StubTreq:
        """A browser without a certificate, signed in with a login link."""
        url = await self.loginLink(owner)
        browser = StubTreq(self.root)
        code, _, body = await self.signIn(url, browser)
        if code != 200:
            raise AssertionError(f"sign-in refused: {code} {body}")
        return browser

    async def concurrently(
        self, *requests: tuple[str, str, dict[str, str]]
    ) -> list[Any]:
        """Send the form posts at once (as a double click does); their answers."""
        pending = []
        for method, path, form in requests:
            fields = dict(form)
            fields.setdefault("csrf", self.csrf())
            pending.append(
                cast(Any, self.stub).request(
                    method,
                    BASE + path,
                    data=urlencode(fields).encode(),
                    headers={
                        "x-test-owner": ["alice"],
                        "content-type": ["application/x-www-form-urlencoded"],
                    },
                )
            )
        together = gatherResults(pending)
        await self._settle(self.stub, together)
        responses = await together
        return [r.code for r in responses]


class ConsoleReviewTests(ReviewMixin, TestCase):
    """Defects: each test fails until its defect is fixed."""

    # -- login links and sessions -------------------------------------------

    async def test_headOfLoginLink_doesNotSpendIt(self) -> None:
        """
        A HEAD of the link (a chat or mail client's link preview, a proxy's
        check) is answered by Login.render_GET: it redeems the link and
        throws the session away, and the owner's own GET is then a 403.
        """
        await self.startConsole()
        url = await self.loginLink()
        query = urlsplit(url).query
        scanner = StubTreq(self.root)
        code, _headers, _ = await self.page(
            "HEAD", f"/login?{query}", owner=None, stub=scanner
        )
        browser = StubTreq(self.root)
        code, _, body = await self.signIn(url, browser)
        self.assertEqual(code, 200, "a HEAD spent the owner's login link: " + body)

    async def test_autoRefresh_doesNotDefeatIdleTimeout(self) -> None:
        """
        /device's landing page reloads itself every 10 s whether or not a
        request waits (data-refresh), and every reload counts as use: a
        browser left open on it is never idle, so the 30 min idle timeout
        never ends the session (only the 12 h absolute one does).
        """
        await self.startConsole()
        clock = Clock()
        sessions = self.service.consoleSessions
        self.patch(sessions, "_clock", clock)
        clock.advance(1000)
        browser = await self.session()
        code, _, body = await self.page("GET", "/device", owner=None, stub=browser)
        self.assertEqual(code, 200, body)
        self.assertNotIn("data-refresh", body, "nothing waits: nothing to reload")
        await self.addDevice("w1", SERIAL, UUID)
        self.service.deviceFlow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": SERIAL}, "127.0.0.9"
        )
        code, _, body = await self.page("GET", "/device", owner=None, stub=browser)
        self.assertIn('data-refresh="10"', body)
        # console.js reloads a data-refresh page at its URL with auto=1
        for _ in range(int(3 * sessions.idle / 10)):  # 1.5 h of unattended reloads
            clock.advance(10)
            code, _, body = await self.page(
                "GET", "/device?auto=1", owner=None, stub=browser
            )
            if code == 403:
                return
        self.fail("1.5 h of automatic reloads kept the session out of its idle timeout")

    async def test_oneOwnersLinks_doNotEvictAnothersLink(self) -> None:
        """
        Unopened links are one global table of 64, oldest out: another
        owner (or a script looping fleetctl console) printing 64 links
        silently kills the link alice just printed.
        """
        await self.startConsole()
        url = await self.loginLink("alice")
        for _ in range(64):
            await self.loginLink("bob")
        browser = StubTreq(self.root)
        code, _, body = await self.signIn(url, browser)
        self.assertEqual(code, 200, "bob's links evicted alice's: " + words(body))

    async def test_csrfToken_notTakenFromTheURL(self) -> None:
        """
        formValue reads request.args, which merges the query string into
        the form: a post whose CSRF token travels in its URL (where
        history, proxies and logs keep it) is accepted.
        """
        await self.startConsole()
        code, _, _body = await self.page(
            "POST", "/logout?" + urlencode({"csrf": self.csrf()}), {"x": "1"},
            csrf=False,
        )  # fmt: skip
        self.assertEqual(code, 403, "a CSRF token in the query string was taken")

    # -- actions racing ------------------------------------------------------

    async def test_provision_doubleSubmit_startsOneRun(self) -> None:
        """
        The confirmation's run id is compared before an await and the run
        started after it: two posts of the same confirmation (a double
        click, a second tab) both pass the check, and the second run
        supersedes the first, whose code the owner was shown.
        """
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)
        await self.provision("w1")
        runs = [
            e["run"] for e in await self.journal() if e["event"] == "run.provisioned"
        ]
        seen = str(runs[-1])
        before = len(await self.journal())
        codes = await self.concurrently(
            ("POST", "/devices/w1/provision", {"run": seen}),
            ("POST", "/devices/w1/provision", {"run": seen}),
        )
        entries = (await self.journal())[before:]
        started = [e for e in entries if e["event"] == "run.provisioned"]
        self.assertEqual(
            len(started), 1, f"one confirmation of run {seen} started"
            f" {len(started)} runs (answers {codes})",
        )  # fmt: skip
        self.assertEqual(sorted(codes), [200, 409], "the second submit is a 409 page")

    # -- a backend down: a page says so, it is no bug ----------------------------

    def down(self, target: Any, name: str, error: Exception) -> None:
        def failing(*args: Any, **kwargs: Any) -> Any:
            return fail(error)

        self.patch(target, name, failing)

    async def test_devicePage_inventoryDown_503NotInternalError(self) -> None:
        """
        DevicePage renders without a refusal mapping: NetBox (or the
        database) down is logged as a bug with a traceback and the owner
        gets "500 internal error" (the fleet view and the API say 503).
        """
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)
        self.down(
            self.service.inventory,
            "get",
            InventoryError("netbox: timeout", "unavailable"),
        )
        code, _, body = await self.page("GET", "/devices/w1")
        self.assertEqual(code, 503, words(body))

    async def test_verifyPage_inventoryDown_503NotInternalError(self) -> None:
        """/device's comparison and decision: the same, through _refusal."""
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)
        await self.provision("w1")
        flow = self.service.deviceFlow
        flow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": SERIAL}, "127.0.0.9"
        )
        (pending,) = flow.pending()
        self.down(
            self.service.inventory,
            "get",
            InventoryError("netbox: timeout", "unavailable"),
        )
        code, _, body = await self.page("GET", f"/device?user_code={pending.user_code}")
        self.assertEqual(code, 503, words(body))

    async def test_fleetView_databaseDown_503NotInternalError(self) -> None:
        """The fleet view maps InventoryError(unavailable), not StoreError."""
        await self.startConsole()
        self.down(self.service.inventory, "list", StoreError("database is locked"))
        code, _, body = await self.page("GET", "/")
        self.assertEqual(code, 503, words(body))

    async def test_journalView_databaseDown_503NotInternalError(self) -> None:
        await self.startConsole()
        self.down(self.service.journal, "query", StoreError("database is locked"))
        code, _, body = await self.page("GET", "/journal")
        self.assertEqual(code, 503, words(body))

    # -- the device flow's secrets and steps -------------------------------------

    async def test_fleetAndVerifyPages_doNotRenderUserCodes(self) -> None:
        """
        The fleet view and /device list every pending request with its user
        code, in the text and in a link (browser history): RequestView calls
        the user code a secret, the device page keeps it on the server, and
        the issue says no page renders a code. Listed codes also let an
        owner approve a request made by any machine on the boot network that
        claims a known uuid and serial, without seeing the node's console
        (RFC 8628 5.4, remote phishing).
        """
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)
        await self.provision("w1")
        self.service.deviceFlow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": SERIAL}, "127.0.0.9"
        )
        (pending,) = self.service.deviceFlow.pending()
        letters = pending.user_code.replace("-", "")
        for path in ["/", "/device"]:
            code, _, body = await self.page("GET", path)
            self.assertEqual(code, 200, body)
            shown = pending.user_code in body or letters in body
            self.assertFalse(shown, f"{path} renders the pending request's user code")

    async def test_mismatchApproval_needsTheSecondStepItShowed(self) -> None:
        """
        The second step is only a form field: a first post carrying
        confirm_mismatch approves a mismatch at once, and the differences
        accepted are those computed at that post, not the ones the 409 page
        showed (the form carries none), so a record that changed between
        the 409 and the tick is approved as forced without being shown.
        """
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)
        await self.provision("w1")
        self.service.deviceFlow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": "SN-OTHER"}, "127.0.0.9"
        )
        (pending,) = self.service.deviceFlow.pending()
        code, _, body = await self.page(
            "POST", "/device",
            {"user_code": pending.user_code, "device": "w1", "action": "approve",
             "confirm_mismatch": "yes"},
        )  # fmt: skip
        self.assertEqual(
            code, 409, "a mismatch approved without its second step: " + words(body)
        )

    async def test_sessionCookie_hostOnlyPrefix(self) -> None:
        """
        The cookie is C{fleetd_console; Path=/}: not C{__Host-}, so any
        service on a sibling name (or another port of this host: cookies
        ignore ports, and the boot and Tink listeners share the name) can
        set it for the console (session fixation / login CSRF into another
        owner's session), and it is sent to every port of the enrollment name.
        """
        await self.startConsole()
        url = await self.loginLink()
        browser = StubTreq(self.root)
        _code, headers, _ = await self.signIn(url, browser)
        (cookie,) = headers.getRawHeaders("set-cookie")
        self.assertTrue(cookie.startswith("__Host-"), cookie.split("=")[0])

    async def test_unknownPathUnderDevice_isTheConsoles404(self) -> None:
        """
        /device/ and /device/x get twisted.web's "No Such Resource" HTML
        page (Guarded asks the leaf VerifyPage for a child), where the
        console answers its own 404 page everywhere else.
        """
        await self.startConsole()
        for path in ["/device/", "/device/x"]:
            code, _, body = await self.page("GET", path)
            self.assertEqual(code, 404)
            self.assertNotIn("No Such Resource", body, path)


class HeldTests(ReviewMixin, TestCase):
    """What the review tried that held (these pass)."""

    async def test_deviceFlowApproval_ofRetiredDevice_refused(self) -> None:
        """
        A node's device-flow request for w1 stays pending while w1 is
        retired from its device page; /device then still approves it as
        w1, giving the node w1's configuration after retirement [R1].
        """
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)
        await self.provision("w1")
        flow = self.service.deviceFlow
        flow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": SERIAL}, "127.0.0.9"
        )
        (pending,) = flow.pending()
        code, _, body = await self.page(
            "POST", "/devices/w1/retire", {"confirm_name": "w1"}
        )
        self.assertEqual(code, 200, body)
        code, _, body = await self.page(
            "POST", "/device",
            {"user_code": pending.user_code, "device": "w1", "action": "approve"},
        )  # fmt: skip
        self.assertNotEqual(
            code, 200, "a retired device's request approved: " + words(body)
        )

    async def test_retire_journalRefuses_saysSoChangesNothing(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            return fail(StoreError("journal head is not authentic"))

        before = await self.service.inventory.get("w1")
        self.patch(self.service.journal, "append", refuse)
        self.patch(self.service.journal, "change", refuse)
        code, _, body = await self.page(
            "POST", "/devices/w1/retire", {"confirm_name": "w1"}
        )
        self.assertEqual(code, 503, words(body))
        self.assertIn("nothing", words(body))
        self.assertEqual(await self.service.inventory.get("w1"), before)

    async def test_provision_journalRefuses_saysSoChangesNothing(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", SERIAL, UUID)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            return fail(StoreError("journal head is not authentic"))

        self.patch(self.service.journal, "append", refuse)
        self.patch(self.service.journal, "change", refuse)
        code, _, body = await self.page("POST", "/devices/w1/provision", {"run": ""})
        self.assertEqual(code, 503, words(body))
        self.assertNotIn("internal error", words(body))
