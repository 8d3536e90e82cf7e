"""
Who may enter the console, and what a form must carry (docs/design.md,
the owner console).

A page answers an owner: a browser that presents the owner client
certificate [O1] (the same check as the owner API's), or one that holds a
live session cookie from a one-time login link (L{ConsoleSessions}).
Everyone else gets the API's 403 line. Pages take GET, HEAD and POST
only (any other method is a 405). A change (a POST) must be an
C{application/x-www-form-urlencoded} form, come from the console's own
origin when the browser names one (C{Origin}, or C{Sec-Fetch-Site:
same-origin} where C{Origin} is C{null}), and carry the viewer's CSRF
token in the form body's field C{csrf} [O3]; otherwise it is refused
with 403 before any page sees it. A reader's post that passes these
checks is refused with 403 too, journaled, unless it is one of
L{READER_CONSOLE_POSTS} (logging out, verifying the journal) [O4]. Every
answer carries the console's security headers (L{SECURITY_HEADERS}).
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd.admin.console.page import (
    HERE,
    VIEWER_ATTRIBUTE,
    Viewer,
    errorPage,
    formValue,
    renderPage,
    setSecurityHeaders,
)
from fleetd.admin.console.sessions import COOKIE, ConsoleSessions
from fleetd.admin.readers import READER_CONSOLE_POSTS, ReaderRefusals
from fleetd.logs import ThrottledLog
from fleetd.pki.owners import OWNER
from fleetd.store.journal import AsyncJournal
from fleetd.web.owner import (
    NO_CERTIFICATE,
    OwnerOf,
    RoleOf,
    checkOwner,
    ownerOf,
    roleOf,
)
from fleetd.web.resources import Endpoint, Router, renderAsync, textResponse

log = Logger()

READS = frozenset({b"GET", b"HEAD"})
METHODS = READS | {b"POST"}  # what console pages take; others are a 405
FORM = "application/x-www-form-urlencoded"


def _cookie(request: IRequest) -> str | None:
    raw = request.getCookie(COOKIE)
    if not raw:
        return None
    try:
        return bytes(raw).decode("ascii")
    except UnicodeDecodeError:
        return None


def _header(request: IRequest, name: bytes) -> str:
    """Header C{name} as text; empty when absent."""
    value = request.getHeader(name)
    if value is None:
        return ""
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def setCookie(request: Any, value: str, maxAge: int | None = None) -> None:
    """The session cookie: C{Secure; HttpOnly; SameSite=Strict}, path C{/}."""
    request.addCookie(
        COOKIE,
        value.encode("ascii"),
        path=b"/",
        max_age=None if maxAge is None else str(maxAge).encode(),
        secure=True,
        httpOnly=True,
        sameSite="Strict",
    )


AUTOMATIC = b"auto"


def isAutomatic(request: IRequest) -> bool:
    """
    Whether C{request} is a page's own reload (console.js adds C{auto=1}
    to the URL of a C{data-refresh} page): it does not count as use, so a
    browser left open on a reloading page still meets the idle timeout.
    """
    return request.method in READS and (request.args or {}).get(AUTOMATIC) == [b"1"]


def isForm(request: IRequest) -> bool:
    """Whether C{request}'s body is an URL-encoded form (as the console's are)."""
    kind = _header(request, b"content-type").split(";")[0].strip()
    return kind.lower() == FORM


def crossOrigin(request: IRequest) -> str | None:
    """
    The refusal of a post that another origin's page made, or L{None}: a
    C{Sec-Fetch-Site} other than C{same-origin}, or an C{Origin} other
    than the console's own (C{null}, which browsers send under
    C{Referrer-Policy: no-referrer}, only with C{Sec-Fetch-Site:
    same-origin}). A client that sends neither (not a browser) passes.
    """
    origin = _header(request, b"origin")
    site = _header(request, b"sec-fetch-site")
    if site and site != "same-origin":
        return "form refused: it came from another origin"
    own = origin == "https://" + _header(request, b"host")
    if origin and not own and not (origin == "null" and site == "same-origin"):
        return "form refused: it came from another origin"
    return None


class _Refused(resource.Resource):
    """A one-line refusal with the console's headers (the API's words)."""

    isLeaf = True

    def __init__(self, code: int, line: str) -> None:
        super().__init__()
        self._code = code
        self._line = line

    def render(self, request: IRequest) -> bytes:
        setSecurityHeaders(request)
        return textResponse(request, self._code, self._line)


class ConsoleGate:
    """Decides, per request, whether and as whom a console page answers."""

    def __init__(
        self,
        sessions: ConsoleSessions,
        clock: IReactorTime,
        owner: OwnerOf | None = None,
        *,
        readers: ReaderRefusals,
        role: RoleOf | None = None,
    ) -> None:
        """
        @param owner: names the request's certificate owner; tests pass a
            fake (the default, L{checkOwner}, needs a TLS client certificate).
        @param readers: journals the refusals of readers' changes [O4].
        @param role: with a fake C{owner}, names its role (default: owner).
        """
        self.sessions = sessions
        self._owner = owner
        self._role = role
        self._readers = readers
        self._log = ThrottledLog(clock)

    def viewer(self, request: IRequest) -> Viewer | str:
        """The viewer of C{request}, or the line saying why there is none."""
        refusal = NO_CERTIFICATE
        if self._owner is not None:
            owner = self._owner(request)
            role = (None if self._role is None else self._role(request)) or OWNER
        else:
            checked = checkOwner(request)
            owner, refusal, role = checked.owner, checked.refusal, checked.role
        if owner is not None:
            csrf = self.sessions.certificateCSRF(owner, role)
            return Viewer(owner, "certificate", csrf, role)
        sessionID = _cookie(request)
        session = None
        if sessionID is not None:
            session = self.sessions.find(sessionID, touch=not isAutomatic(request))
        if session is not None:
            return Viewer(session.owner, "session", session.csrf, session.role)
        return refusal

    def admit(self, request: IRequest) -> resource.Resource | None:
        """
        L{None} when C{request} may go on (its viewer set on it), else the
        refusal to render.
        """
        if isinstance(getattr(request, VIEWER_ATTRIBUTE, None), Viewer):
            return None  # already admitted on the way down
        viewer = self.viewer(request)
        if not isinstance(viewer, Viewer):
            if viewer != NO_CERTIFICATE:
                self._log.warn("console.owner-refused {reason}", reason=viewer)
            return _Refused(http.FORBIDDEN, viewer)
        if request.method not in METHODS:  # no page takes it: no form check
            request.setHeader(b"allow", b"GET, HEAD, POST")
            return _Refused(http.NOT_ALLOWED, "method not allowed")
        if request.method not in READS:
            line = self._formRefusal(request, viewer)
            if line is not None:
                self._log.warn("console.form-refused {reason}", reason=line)
                return _Refused(http.FORBIDDEN, line)
            # After the form's checks: a post another page forged is not
            # the reader's attempt, and is not journaled as one.
            if not viewer.canChange and request.path not in READER_CONSOLE_POSTS:
                return self._readers.refusal(viewer.owner, setSecurityHeaders)
        setattr(request, VIEWER_ATTRIBUTE, viewer)
        setSecurityHeaders(request)
        return None

    def _formRefusal(self, request: IRequest, viewer: Viewer) -> str | None:
        if not isForm(request):
            return f"form refused: a change takes {FORM}"
        line = crossOrigin(request)
        if line is not None:
            return line
        try:
            token = formValue(request, "csrf") or ""
        except Exception:
            token = ""
        if not hmac.compare_digest(token.encode(), viewer.csrf.encode()):
            return "form refused: its CSRF token is missing or wrong; reload the page"
        return None


class Guarded(resource.Resource):
    """C{inner}, and everything below it, behind the console gate."""

    def __init__(self, inner: resource.Resource, gate: ConsoleGate) -> None:
        super().__init__()
        self.inner = inner
        self._gate = gate

    def getChildWithDefault(self, path: bytes, request: IRequest) -> resource.Resource:
        refusal = self._gate.admit(request)
        if refusal is not None:
            return refusal
        if self.inner.isLeaf:  # it answers its own subpaths (a 404 page)
            request.prepath.pop()
            request.postpath.insert(0, path)
            return self.inner
        child: resource.Resource = self.inner.getChildWithDefault(path, request)
        return child

    def render(self, request: IRequest) -> Any:
        refusal = self._gate.admit(request)
        if refusal is not None:
            return refusal.render(request)
        return self.inner.render(request)


class Logout(Endpoint):
    """C{POST /logout} (behind the gate: the form's CSRF token is checked)."""

    isLeaf = True

    def __init__(self, sessions: ConsoleSessions) -> None:
        super().__init__()
        self._sessions = sessions

    def render_POST(self, request: IRequest) -> bytes:
        if request.postpath:
            return errorPage(request, http.NOT_FOUND, "not found")
        sessionID = _cookie(request)
        if sessionID is not None:
            self._sessions.end(sessionID)
        setCookie(request, "", maxAge=0)
        return renderPage(request, "logout.html")


class Static(Endpoint):
    """C{/static/NAME}: the stylesheet and the script, nothing else."""

    TYPES = {
        ".css": b"text/css; charset=utf-8",
        ".js": b"text/javascript; charset=utf-8",
    }

    def __init__(self, directory: Path = HERE / "static") -> None:
        super().__init__()
        self._files = {
            p.name.encode(): (self.TYPES[p.suffix], p.read_bytes())
            for p in directory.iterdir()
            if p.suffix in self.TYPES
        }

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        found = self._files.get(path)
        if found is None or request.postpath:
            return _Refused(http.NOT_FOUND, "not found")
        return _StaticFile(*found)


class _StaticFile(Endpoint):
    isLeaf = True

    def __init__(self, kind: bytes, body: bytes) -> None:
        super().__init__()
        self._kind = kind
        self._body = body

    def render_GET(self, request: IRequest) -> bytes:
        setSecurityHeaders(request)
        request.setHeader(b"content-type", self._kind)
        request.setHeader(b"cache-control", b"no-cache")
        return self._body


class LoginLinkResource(Endpoint):
    """
    C{POST /v1/admin/console/login-link} (behind the owner gate), as
    C{fleetctl console} asks: C{{"url": ..., "expires_at": ..., "role":
    ...}}, a link that opens one console session for the operator who
    asked, with the role of their certificate (a reader's link opens a
    reader's session: it grants nothing the certificate does not [O4]).
    Journaled (without the token) before the link is returned.
    """

    isLeaf = True

    def __init__(
        self,
        sessions: ConsoleSessions,
        journal: AsyncJournal,
        owner: OwnerOf = ownerOf,
        role: RoleOf = roleOf,
    ) -> None:
        super().__init__()
        self._sessions = sessions
        self._journal = journal
        self._owner = owner
        self._role = role

    def render_POST(self, request: IRequest) -> int | bytes:
        owner = self._owner(request)
        if owner is None:
            return textResponse(request, http.FORBIDDEN, NO_CERTIFICATE)
        role = self._role(request) or OWNER

        async def work() -> tuple[int, Any]:
            await self._journal.append(
                "console.link-issued",
                actor=f"{role}:{owner}",
                fields={"expires_in": int(self._sessions.linkLifetime)},
            )
            token, expires = self._sessions.newLink(owner, role)
            url = f"{self._sessions.base}/login?token={token}"
            return http.CREATED, {"url": url, "expires_at": expires, "role": role}

        def refusal(e: Exception) -> tuple[int, str] | None:
            log.error("console.link-not-recorded {reason}", reason=str(e)[:200])
            return http.SERVICE_UNAVAILABLE, "the journal did not take it; try again"

        return renderAsync(request, work, refusal)


def consoleAPI(
    sessions: ConsoleSessions,
    journal: AsyncJournal,
    owner: OwnerOf = ownerOf,
    role: RoleOf = roleOf,
) -> resource.Resource:
    """C{/v1/admin/console}: the login links of C{fleetctl console}."""
    api = Router()
    api.putChild(b"login-link", LoginLinkResource(sessions, journal, owner, role))
    return api
