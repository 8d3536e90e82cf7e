"""
Who may enter the owner console, and what a form must carry (issue 20
item 5, docs/design.md, the owner console): the owner certificate or a
one-time login link, sessions with idle and absolute timeouts, CSRF
tokens, the headers.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from treq.testing import StubTreq
from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.console.sessions import ConsoleSessions
from fleetd.store.db import StoreError
from tests.consolesupport import ConsoleMixin, text

PAGES = ["/", "/logout"]


class SessionTests(SynchronousTestCase):
    """L{ConsoleSessions} on a fake clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.sessions = ConsoleSessions(self.clock, linkLifetime=300, idle=60,
                                        absolute=600)  # fmt: skip

    def test_link_opensOneSessionOnce(self) -> None:
        token, expires = self.sessions.newLink("alice")
        self.assertEqual(expires, 300)
        opened = self.sessions.redeem(token)
        assert opened is not None
        sessionID, session = opened
        self.assertEqual(session.owner, "alice")
        self.assertIs(self.sessions.find(sessionID), session)
        self.assertIsNone(self.sessions.redeem(token))

    def test_link_expires(self) -> None:
        token, _ = self.sessions.newLink("alice")
        self.clock.advance(300)
        self.assertIsNone(self.sessions.redeem(token))

    def test_unknownToken_opensNothing(self) -> None:
        self.sessions.newLink("alice")
        self.assertIsNone(self.sessions.redeem("guess"))

    def test_session_idleTimeout(self) -> None:
        token, _ = self.sessions.newLink("alice")
        opened = self.sessions.redeem(token)
        assert opened is not None
        self.clock.advance(59)
        self.assertIsNotNone(self.sessions.find(opened[0]))
        self.clock.advance(59)  # used a moment ago: still idle under 60 s
        self.assertIsNotNone(self.sessions.find(opened[0]))
        self.clock.advance(60)
        self.assertIsNone(self.sessions.find(opened[0]))

    def test_session_absoluteTimeout(self) -> None:
        token, _ = self.sessions.newLink("alice")
        opened = self.sessions.redeem(token)
        assert opened is not None
        for _ in range(10):
            self.clock.advance(59)
            self.assertIsNotNone(self.sessions.find(opened[0]))
        self.clock.advance(10)  # 600 s after it opened, however busy
        self.assertIsNone(self.sessions.find(opened[0]))

    def test_logout_endsSession(self) -> None:
        token, _ = self.sessions.newLink("alice")
        opened = self.sessions.redeem(token)
        assert opened is not None
        self.sessions.end(opened[0])
        self.assertIsNone(self.sessions.find(opened[0]))

    def test_automaticUse_keepsTheIdleTimer(self) -> None:
        """find(touch=False), a page's own reload, does not count as use."""
        token, _ = self.sessions.newLink("alice")
        opened = self.sessions.redeem(token)
        assert opened is not None
        self.clock.advance(59)
        self.assertIsNotNone(self.sessions.find(opened[0], touch=False))
        self.clock.advance(1)
        self.assertIsNone(self.sessions.find(opened[0], touch=False))

    def test_sessions_cappedPerOwner(self) -> None:
        """An owner's 17th session ends that owner's oldest, not another's."""
        token, _ = self.sessions.newLink("bob")
        bobs = self.sessions.redeem(token)
        assert bobs is not None
        mine = []
        for _ in range(17):
            token, _ = self.sessions.newLink("alice")
            opened = self.sessions.redeem(token)
            assert opened is not None
            mine.append(opened[0])
        self.assertIsNone(self.sessions.find(mine[0]))
        self.assertTrue(all(self.sessions.find(s) for s in mine[1:]))
        self.assertIsNotNone(self.sessions.find(bobs[0]))

    def test_certificateCSRF_boundToOwner(self) -> None:
        self.assertNotEqual(
            self.sessions.certificateCSRF("alice"), self.sessions.certificateCSRF("bob")
        )
        other = ConsoleSessions(self.clock)
        self.assertNotEqual(
            self.sessions.certificateCSRF("alice"), other.certificateCSRF("alice")
        )


class GateTests(ConsoleMixin, TestCase):
    """The gate over a real daemon's console, through StubTreq."""

    async def test_noOwner_403TheAPIsLine(self) -> None:
        await self.startConsole()
        for path in PAGES:
            for method in ("GET", "POST"):
                code, headers, body = await self.page(method, path, owner=None)
                self.assertEqual(
                    (code, body), (403, "owner client certificate required\n")
                )
                self.assertEqual(headers.getRawHeaders("x-frame-options"), ["DENY"])

    async def test_owner_pageWithSecurityHeaders(self) -> None:
        await self.startConsole()
        code, headers, body = await self.page("GET", "/")
        self.assertEqual(code, 200, body)
        self.assertIn("text/html", headers.getRawHeaders("content-type")[0])
        csp = headers.getRawHeaders("content-security-policy")[0]
        self.assertIn("script-src 'self'", csp)
        self.assertNotIn("unsafe-inline", csp)
        self.assertIn("frame-ancestors 'none'", csp)
        self.assertEqual(headers.getRawHeaders("x-frame-options"), ["DENY"])
        self.assertEqual(headers.getRawHeaders("referrer-policy"), ["no-referrer"])
        self.assertEqual(headers.getRawHeaders("cache-control"), ["no-store"])
        self.assertNotIn("<script>", body)  # no inline script
        self.assertNotIn(" style=", body)

    async def test_methodNoPageTakes_405(self) -> None:
        """OPTIONS, PUT, DELETE: a 405 naming the methods, not a form refusal."""
        await self.startConsole()
        for method in ("OPTIONS", "PUT", "DELETE"):
            for path in ("/", "/device", "/devices/w1"):
                code, headers, body = await self.page(method, path)
                self.assertEqual(code, 405, (method, path, body))
                self.assertEqual(headers.getRawHeaders("allow"), ["GET, HEAD, POST"])
        code, _, _ = await self.page("OPTIONS", "/", owner=None)
        self.assertEqual(code, 403, "a non-owner learns nothing more")

    async def test_formWithoutCSRF_refused(self) -> None:
        await self.startConsole()
        code, _, body = await self.page("POST", "/logout", {}, csrf=False)
        self.assertEqual(code, 403)
        self.assertIn("CSRF", body)
        code, _, body = await self.page("POST", "/logout", {"csrf": "x" * 64})
        self.assertEqual(code, 403)
        self.assertIn("CSRF", body)
        code, _, body = await self.page("POST", "/logout", {"csrf": self.csrf("bob")})
        self.assertEqual(code, 403, "another owner's token")
        code, _, _ = await self.page("POST", "/logout", {})
        self.assertEqual(code, 200)

    async def test_formAsJSONOrFromAnotherOrigin_refused(self) -> None:
        await self.startConsole()
        code, _, body = await self.page(
            "POST", "/logout", {}, headers={"content-type": "text/plain"}
        )
        self.assertEqual(code, 403)
        self.assertIn("application/x-www-form-urlencoded", body)
        code, _, body = await self.page(
            "POST", "/logout", {}, headers={"origin": "https://evil.example"}
        )
        self.assertEqual(code, 403)
        self.assertIn("another origin", body)
        for sent in (
            {"origin": "null"},
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site"},
            {"origin": "null", "sec-fetch-site": "same-site"},
        ):
            code, _, body = await self.page("POST", "/logout", {}, headers=sent)
            self.assertEqual(code, 403, sent)
            self.assertIn("another origin", body)

    async def test_formFromOwnPage_noReferrerOriginNull_accepted(self) -> None:
        """
        A browser sends the console's own forms with C{Origin: null} (the
        pages' C{Referrer-Policy: no-referrer}) and C{Sec-Fetch-Site:
        same-origin}: accepted, as is the console's own origin.
        """
        await self.startConsole()
        for sent in (
            {"origin": "null", "sec-fetch-site": "same-origin"},
            {"origin": "https://enroll.test:8446", "sec-fetch-site": "same-origin"},
        ):
            code, _, body = await self.page("POST", "/logout", {}, headers=sent)
            self.assertEqual(code, 200, (sent, body))

    async def test_loginLink_opensSessionOnce(self) -> None:
        await self.startConsole()
        self.service.consoleSessions.setBase("https://enroll.test:8446")
        url = await self.loginLink()
        parts = urlsplit(url)
        self.assertEqual(parts.netloc, "enroll.test:8446")
        self.assertEqual(parts.path, "/login")
        browser = StubTreq(self.root)  # its own cookie jar, no certificate
        code, headers, body = await self.page(
            "GET", f"/login?{parts.query}", owner=None, stub=browser
        )
        self.assertEqual(code, 200, body)
        self.assertIsNone(headers.getRawHeaders("set-cookie"), "the GET opens none")
        self.assertIn('<form method="post" action="/login"', body)
        self.assertIn("Sign in", text(body))
        code, headers, body = await self.signIn(url, browser)
        self.assertEqual(code, 200, body)
        (cookie,) = headers.getRawHeaders("set-cookie")
        self.assertTrue(cookie.startswith("__Host-fleetd_console="), cookie)
        for flag in ("secure", "httponly", "samesite=strict", "path=/"):
            self.assertIn(flag, cookie.lower())
        self.assertNotIn("domain=", cookie.lower())
        self.assertIn('http-equiv="refresh"', body)
        code, _, body = await self.page("GET", "/", owner=None, stub=browser)
        self.assertEqual(code, 200, body)
        self.assertIn("alice", text(body))
        # used once: a second browser cannot open it again
        again = StubTreq(self.root)
        for method in ("GET", "POST"):
            if method == "GET":
                code, headers, body = await self.page(
                    "GET", f"/login?{parts.query}", owner=None, stub=again
                )
            else:
                code, headers, body = await self.page(
                    "POST", "/login", {"token": parts.query.split("=", 1)[1]},
                    owner=None, stub=again,
                )  # fmt: skip
            self.assertEqual(code, 403, method)
            self.assertIsNone(headers.getRawHeaders("set-cookie"))
            self.assertIn("fleetctl console", text(body))
        code, _, _ = await self.page("GET", "/", owner=None, stub=again)
        self.assertEqual(code, 403)
        entries = await self.journal()
        issued = [e for e in entries if e["event"] == "console.link-issued"]
        self.assertEqual([e["actor"] for e in issued], ["owner:alice"])
        opened = [e for e in entries if e["event"] == "console.session-opened"]
        self.assertEqual([e["actor"] for e in opened], ["owner:alice"])
        self.assertNotIn(parts.query.split("=", 1)[1], repr(entries))

    async def test_loginPost_fromAnotherSite_refused_linkKept(self) -> None:
        """
        The sign-in POST must come from the login page itself: another
        site's form (or one not URL-encoded) is refused and spends nothing.
        """
        await self.startConsole()
        url = await self.loginLink()
        token = urlsplit(url).query.split("=", 1)[1]
        browser = StubTreq(self.root)
        for sent in (
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site"},
            {"origin": "https://evil.test"},
            {"origin": "null"},
        ):
            code, headers, body = await self.page(
                "POST", "/login", {"token": token}, owner=None, stub=browser,
                headers=sent,
            )  # fmt: skip
            self.assertEqual(code, 403, (sent, body))
            self.assertIsNone(headers.getRawHeaders("set-cookie"))
        code, _, body = await self.page(
            "POST", "/login", None, owner=None, stub=browser,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        self.assertEqual(code, 403, body)
        code, _, body = await self.signIn(url, browser)
        self.assertEqual(code, 200, "a refused post spent the link: " + body)

    async def test_loginNotJournaled_noSession(self) -> None:
        await self.startConsole()
        url = await self.loginLink()

        def refuse(*args: Any, **kwargs: Any) -> Any:
            return fail(StoreError("journal head is not authentic"))

        self.patch(self.service.journal, "append", refuse)
        browser = StubTreq(self.root)
        code, headers, body = await self.signIn(url, browser)
        self.assertEqual(code, 503, body)
        self.assertIsNone(headers.getRawHeaders("set-cookie"))
        self.assertEqual(self.service.consoleSessions._sessions, {})
        code, _, _ = await self.page("GET", "/", owner=None, stub=browser)
        self.assertEqual(code, 403)

    async def test_sessionForm_needsTheSessionsToken(self) -> None:
        await self.startConsole()
        url = await self.loginLink()
        browser = StubTreq(self.root)
        await self.signIn(url, browser)
        code, _, body = await self.page(
            "POST", "/logout", {"csrf": self.csrf("alice")}, owner=None, stub=browser
        )
        self.assertEqual(code, 403, "the certificate's token is not the session's")
        code, _, body = await self.page("GET", "/", owner=None, stub=browser)
        token = body.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        code, headers, body = await self.page(
            "POST", "/logout", {"csrf": token}, owner=None, stub=browser
        )
        self.assertEqual(code, 200, body)
        self.assertIn("Max-Age=0", headers.getRawHeaders("set-cookie")[0])
        code, _, _ = await self.page("GET", "/", owner=None, stub=browser)
        self.assertEqual(code, 403)

    async def test_expiredLink_refused(self) -> None:
        await self.startConsole()
        self.service.consoleSessions.linkLifetime = 0.0
        url = await self.loginLink()
        browser = StubTreq(self.root)
        code, _, body = await self.page(
            "GET", f"/login?{urlsplit(url).query}", owner=None, stub=browser
        )
        self.assertEqual(code, 403, body)
        code, _, body = await self.page(
            "POST", "/login", {"token": urlsplit(url).query.split("=", 1)[1]},
            owner=None, stub=browser,
        )  # fmt: skip
        self.assertEqual(code, 403, body)

    async def test_linkNotJournaled_noLink(self) -> None:
        await self.startConsole()

        def refuse(*args: Any, **kwargs: Any) -> Any:
            return fail(StoreError("journal head is not authentic"))

        self.patch(self.service.journal, "append", refuse)
        code, _, body = await self.page(
            "POST", "/v1/admin/console/login-link", None,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        self.assertEqual(code, 503, body)
        self.assertNotIn("token", body)
