"""
Rendering console pages: the Jinja2 templates, the viewer, the headers.

Templates live beside this module (C{templates/}); Jinja2 escapes every
value (autoescape on for all of them) and refuses an undefined name
(C{StrictUndefined}), so a field from a node or the inventory renders as
text and a misspelt one fails the test that renders it. Pages are built
from what the services return, after every await: rendering itself is a
short synchronous step over one page of rows.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.admin.refusals import lineOf, statusOf
from fleetd.pki.owners import OWNER
from fleetd.refused import MALFORMED, TOO_LARGE, Refused
from fleetd.web.refusals import readRefusal, storeRefusal
from fleetd.web.resources import answerAsync

if TYPE_CHECKING:
    import jinja2

HERE = Path(__file__).parent
HTML = b"text/html; charset=utf-8"
# No inline script or style anywhere: the one stylesheet and the one
# script come from /static; no frame may hold a console page.
SECURITY_HEADERS: Mapping[bytes, bytes] = {
    b"content-security-policy": (
        b"default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self';"
        b" connect-src 'self'; form-action 'self'; frame-ancestors 'none';"
        b" base-uri 'none'"
    ),
    b"x-frame-options": b"DENY",
    b"referrer-policy": b"no-referrer",
    b"x-content-type-options": b"nosniff",
    b"cache-control": b"no-store",
    b"cross-origin-opener-policy": b"same-origin",
}


@dataclass(frozen=True)
class Viewer:
    """
    Who is looking: the operator's name (C{owner}, whatever the role), how
    they entered (C{certificate} or C{session}), the CSRF token every form
    on their pages carries, and their role (C{owner} or C{reader} [O4]).
    """

    owner: str
    how: str
    csrf: str
    role: str = OWNER

    @property
    def actor(self) -> str:
        """The journal's actor for this operator: the same as fleetctl's."""
        return f"{self.role}:{self.owner}"

    @property
    def canChange(self) -> bool:
        """Whether pages offer this viewer changes: an owner [O4]."""
        return self.role == OWNER


VIEWER_ATTRIBUTE = "fleetdConsoleViewer"


def viewerOf(request: IRequest) -> Viewer:
    """The viewer the console gate admitted for C{request}."""
    viewer = getattr(request, VIEWER_ATTRIBUTE, None)
    if not isinstance(viewer, Viewer):
        raise RuntimeError("a console page was reached past the gate")
    return viewer


def setSecurityHeaders(request: IRequest) -> None:
    for name, value in SECURITY_HEADERS.items():
        request.setHeader(name, value)


def when(seconds: float | None) -> str:
    """A time as the console shows it: UTC, to the second."""
    if seconds is None:
        return "never"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def query(**params: Any) -> str:
    """C{?a=1&b=2} of the params that are not L{None} (URL-encoded)."""
    kept = {k: v for k, v in params.items() if v is not None and v != ""}
    return "?" + urlencode(kept) if kept else ""


@functools.cache
def environment() -> jinja2.Environment:
    """
    The templates' environment, made at the first page: Jinja2 is imported
    then, not while fleetd starts (the console is seldom the first thing
    a restarted fleetd serves; nodes are).
    """
    import jinja2

    made = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    made.filters["when"] = when
    made.globals["query"] = query
    return made


def renderPage(
    request: IRequest, template: str, status: int = http.OK, **context: Any
) -> bytes:
    """Set C{status} and render C{template} for the gate's viewer."""
    viewer = getattr(request, VIEWER_ATTRIBUTE, None)
    body = environment().get_template(template).render(viewer=viewer, **context)
    request.setResponseCode(status)
    request.setHeader(b"content-type", HTML)
    setSecurityHeaders(request)
    return body.encode("utf-8")


def errorPage(request: IRequest, code: int, message: str) -> bytes:
    """A page saying what was refused, in one line, with status C{code}."""
    return renderPage(request, "error.html", code, code=code, message=message)


@dataclass(frozen=True)
class Page:
    """What an async page renders: its template, context and status."""

    template: str
    context: Mapping[str, Any]
    code: int = http.OK


def renderPageAsync(
    request: Any,
    work: Callable[[], Awaitable[Page]],
    refusal: Callable[[Exception], tuple[int, str] | None] | None = None,
) -> int:
    """
    Await C{work} and render the page it returns. What C{refusal} maps to
    C{(code, line)} (first: a page's own words for its family, as the
    device-flow hints), and any other L{Refused}, are an error page; so is the
    inventory or the database down (503: L{readRefusal} for a read,
    L{storeRefusal} for a change, as the owner API answers); anything
    else is logged as a bug and is a 500 page. Nothing is written after the
    client went away (L{answerAsync}).
    """

    async def page() -> tuple[int, Page]:
        done = await work()
        return done.code, done

    def refused(e: Exception) -> tuple[int, str] | None:
        answer = None if refusal is None else refusal(e)
        if answer is None and isinstance(e, Refused):
            answer = statusOf(e), lineOf(e)
        if answer is None:
            reading = request.method in (b"GET", b"HEAD")
            answer = (readRefusal if reading else storeRefusal)(e)
        return answer

    return answerAsync(
        request,
        page,
        lambda code, done: renderPage(request, done.template, code, **done.context),
        lambda code, line: errorPage(request, code, line),
        refused,
        event="console.page.failed",
    )


MAX_FORM = 64 * 1024  # bytes of a form body the console reads
_BODY_ATTRIBUTE = "fleetdConsoleForm"


def formBody(request: IRequest) -> dict[str, list[str]]:
    """
    The fields of C{request}'s C{application/x-www-form-urlencoded} body,
    parsed strictly (never the query string, which Twisted merges into
    C{request.args}); L{Refused} (400) when malformed or not UTF-8, 413
    past L{MAX_FORM} bytes.
    """
    cached = getattr(request, _BODY_ATTRIBUTE, None)
    if cached is not None:
        parsed: dict[str, list[str]] = cached
        return parsed
    content = request.content
    raw = b""
    if content is not None:
        content.seek(0)
        raw = content.read(MAX_FORM + 1)
        content.seek(0)
    if len(raw) > MAX_FORM:
        raise Refused(TOO_LARGE, "the form is too large")
    try:
        parsed = parse_qs(
            raw.decode("ascii"),
            keep_blank_values=True,
            strict_parsing=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=100,
        )
    except (UnicodeDecodeError, ValueError):
        raise Refused(MALFORMED, "the form is malformed") from None
    setattr(request, _BODY_ATTRIBUTE, parsed)
    return parsed


def formValues(request: IRequest, name: str) -> list[str]:
    """
    Every value of field C{name} (from the form body only for a change,
    as L{formValue}); L{Refused} (400) when one is not UTF-8.
    """
    if request.method not in (b"GET", b"HEAD"):
        return list(formBody(request).get(name, []))
    values = (request.args or {}).get(name.encode("ascii"), [])
    try:
        return [v.decode("utf-8") for v in values]
    except UnicodeDecodeError:
        raise Refused(MALFORMED, f"the field {name} is not UTF-8") from None


def formValue(request: IRequest, name: str, default: str | None = None) -> str | None:
    """
    The single value of field C{name} as text: of the query string for a
    read (GET, HEAD), of the form body only for a change (L{formBody}), so
    a change never takes a field (the CSRF token above all) from its URL.
    L{Refused} (400) when it is repeated or not UTF-8.
    """
    values = formValues(request, name)
    if not values:
        return default
    if len(values) > 1:
        raise Refused(MALFORMED, f"the field {name} is repeated")
    return values[0]
