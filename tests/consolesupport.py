"""
The owner console over a real in-process daemon, through
L{treq.testing.StubTreq}: the daemon's own console services and sessions,
with the owner named by a test header instead of a TLS certificate
(C{x-test-owner}; a request without it has no certificate).

    class Tests(ConsoleMixin, TestCase):
        async def test_x(self) -> None:
            await self.startConsole()
            code, headers, body = await self.page("GET", "/")
            code, headers, body = await self.page("POST", "/logout", {"x": "1"})
"""

from __future__ import annotations

import html
import json
import re
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource

from fleetd.admin.console.gate import consoleAPI
from fleetd.admin.console.tree import consoleTree
from fleetd.web.resources import Router
from tests.daemonsupport import DeliveryMixin

BASE = "https://enroll.test:8446"
OWNER = "alice"


def testOwner(request: IRequest) -> str | None:
    """The test's stand-in for a certificate: the C{x-test-owner} header."""
    value = request.getHeader(b"x-test-owner")
    return None if value is None else bytes(value).decode()


def testRole(request: IRequest) -> str | None:
    """The stand-in certificate's role [O4]: the C{x-test-role} header."""
    value = request.getHeader(b"x-test-role")
    return None if value is None else bytes(value).decode()


class ConsoleMixin(DeliveryMixin):
    """A daemon (L{DeliveryMixin}) and its console through L{StubTreq}."""

    stub: StubTreq
    root: Resource

    async def startConsole(self, overrides: dict[str, Any] | None = None) -> None:
        await self.startLoaded(overrides)
        self.consoleRoot()

    def consoleRoot(self) -> Resource:
        """A root of the daemon's console and C{/v1/admin/console} only."""
        service = self.service
        tree = consoleTree(
            service.console, service.consoleSessions, reactor, testOwner, testRole
        )
        root = Router(tree.index)
        for name, child in tree.children.items():
            root.putChild(name, child)
        v1, admin = Router(), Router()
        admin.putChild(
            b"console",
            consoleAPI(service.consoleSessions, service.journal, testOwner, testRole),
        )
        v1.putChild(b"admin", admin)
        root.putChild(b"v1", v1)
        self.root = root
        self.stub = StubTreq(root)
        return root

    async def loginLink(self) -> str:
        """A login link, as C{fleetctl console} asks for one (as L{OWNER})."""
        code, _, body = await self.page(
            "POST", "/v1/admin/console/login-link", None,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        if code != 201:
            raise AssertionError(f"login link refused: {code} {body}")
        url: str = json.loads(body)["url"]
        return url

    async def signIn(
        self, url: str, stub: StubTreq, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, str]:
        """
        Open login link C{url} in C{stub} as a browser does: GET the page,
        then press its "Sign in" button (a POST of the form's token). The
        GET's answer when it shows no button, else the POST's.
        """
        code, got, body = await self.page(
            "GET", "/login?" + urlsplit(url).query, owner=None, stub=stub
        )
        found = re.search(r'name="token" value="([^"]*)"', body)
        if code != 200 or found is None:
            return code, got, body
        sent = {"sec-fetch-site": "same-origin", **(headers or {})}
        return await self.page(
            "POST", "/login", {"token": html.unescape(found.group(1))},
            owner=None, stub=stub, headers=sent,
        )  # fmt: skip

    def csrf(self, owner: str = OWNER, role: str = "owner") -> str:
        """The CSRF token of a browser presenting C{owner}'s certificate."""
        return self.service.consoleSessions.certificateCSRF(owner, role)

    async def page(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        *,
        owner: str | None = OWNER,
        csrf: bool = True,
        stub: StubTreq | None = None,
        headers: dict[str, str] | None = None,
        role: str = "owner",
    ) -> tuple[int, Any, str]:
        """
        One request as C{owner} (L{None}: no certificate) whose certificate
        has C{role}; a form is sent URL-encoded, with the owner's CSRF token
        unless C{csrf} is false. Returns the status, the response headers
        and the body as text.
        """
        client = self.stub if stub is None else stub
        sent: dict[str, str] = dict(headers or {})
        if owner is not None:
            sent["x-test-owner"] = owner
            sent["x-test-role"] = role
        data = None
        if form is not None:
            fields = dict(form)
            if csrf and owner is not None:
                fields.setdefault("csrf", self.csrf(owner, role))
            data = urlencode(fields).encode()
            sent.setdefault("content-type", "application/x-www-form-urlencoded")
        pending = cast(Any, client).request(
            method,
            BASE + path,
            data=data,
            headers={k: [v] for k, v in sent.items()},
        )
        await self._settle(client, pending)
        response = await pending
        body = await self._body(client, response)
        return response.code, response.headers, body

    @staticmethod
    async def _settle(client: StubTreq, pending: Any) -> None:
        """Pump C{client} until C{pending} fires (the page awaits the
        daemon's threads); at most 20 s."""
        done: list[bool] = []

        def fired(result: Any) -> Any:
            done.append(True)  # the whole chain has run, not only its start
            return result

        pending.addBoth(fired)
        for _ in range(4000):
            if done:
                return
            client.flush()
            await deferLater(reactor, 0.005, lambda: None)
        raise AssertionError("the console did not answer within 20 s")

    async def _body(self, client: StubTreq, response: Any) -> str:
        pending = response.content()
        await self._settle(client, pending)
        content: bytes = await pending
        return content.decode("utf-8")


def text(body: str) -> str:
    """A page's visible text, roughly: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", " ", body))
