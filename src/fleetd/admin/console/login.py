"""
Signing a browser in with a one-time login link (docs/design.md, the
owner console; L{ConsoleSessions}).

C{GET /login?token=...} only shows a "Sign in" button: a link preview, a
mail scanner or a proxy that fetches the link (GET or HEAD) spends
nothing. The button's form C{POST}s the token in its body to C{/login},
from this page (C{Sec-Fetch-Site: same-origin} where the browser says),
which redeems the link, journals C{console.session-opened} (the operator
as actor, C{owner:NAME} or C{reader:NAME} as the link's role; never the
token), sets the session cookie and goes on to the fleet
view by a meta refresh, not a redirect: a C{SameSite=Strict} cookie is
not sent along a redirect chain that began on another site.
"""

from __future__ import annotations

from twisted.logger import Logger
from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.admin.console.gate import ConsoleGate, crossOrigin, isForm, setCookie
from fleetd.admin.console.page import (
    Page,
    errorPage,
    formValue,
    renderPage,
    renderPageAsync,
    setSecurityHeaders,
)
from fleetd.refused import UNAVAILABLE, Refused
from fleetd.store.journal import AsyncJournal
from fleetd.web.resources import Endpoint

log = Logger()

SPENT = (
    "this login link was used already, has expired or is not one:"
    " run fleetctl console for a new one"
)


class Login(Endpoint):
    """C{GET /login?token=...}: the button; C{POST /login}: the session."""

    isLeaf = True

    def __init__(self, gate: ConsoleGate, journal: AsyncJournal) -> None:
        super().__init__()
        self._sessions = gate.sessions
        self._journal = journal

    @staticmethod
    def _token(request: IRequest) -> str:
        try:
            return formValue(request, "token") or ""
        except Refused:
            return ""

    def render_GET(self, request: IRequest) -> bytes:
        setSecurityHeaders(request)
        token = self._token(request)
        if request.postpath or not self._sessions.linkValid(token):
            return errorPage(request, http.FORBIDDEN, SPENT)
        return renderPage(request, "login-confirm.html", token=token)

    def render_POST(self, request: IRequest) -> int | bytes:
        setSecurityHeaders(request)
        # A post another site's page makes is refused before it spends
        # the link: the button is on this origin's page.
        line = None if isForm(request) else "form refused: sign in with the button"
        line = line or crossOrigin(request)
        if line is not None:
            return errorPage(request, http.FORBIDDEN, line)
        opened = self._sessions.redeem(self._token(request))
        if opened is None:
            return errorPage(request, http.FORBIDDEN, SPENT)
        sessionID, session = opened

        async def work() -> Page:
            try:
                await self._journal.append(
                    "console.session-opened", actor=f"{session.role}:{session.owner}"
                )
            except Exception as e:
                self._sessions.end(sessionID)
                log.error("console.session-not-recorded {reason}", reason=str(e)[:200])
                raise Refused(
                    UNAVAILABLE,
                    "the journal did not record the sign-in, so no session was"
                    " opened: run fleetctl console for a new link",
                ) from None
            setCookie(request, sessionID)
            log.info("console.session-opened {owner}", owner=session.owner)
            return Page("login.html", {"owner": session.owner})

        return renderPageAsync(request, work)
