"""
HTTP edges of the device flow (L{fleetd.deviceflow.flow}) on the boot
listener.

C{POST /device/code} and C{POST /token} take an
C{application/x-www-form-urlencoded} body, parsed strictly: UTF-8, valid
percent-encoding, C{name=value} pairs only, at most 16 fields, none
repeated (RFC 6749 section 3.1); unknown fields are ignored.  Anything
else is a 400 C{invalid_request}.  Answers are JSON with C{Cache-Control:
no-store} and C{Pragma: no-cache}; a refused C{/device/code} (429 or 503)
carries C{Retry-After}. C{/token} answers only RFC 8628's errors [F1].
An C{Authorization: Basic} header (golang.org/x/oauth2 sends one with an
empty secret) is ignored: Talos is a public client.

Requests are not journaled (anyone on the network can make them, and the
journal must not grow at their pace); decisions and tokens are.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, resource, server
from twisted.web.iweb import IRequest

from fleetd.deviceflow.flow import DeviceFlow, Reply
from fleetd.web.resources import Endpoint, jsonResponse, textResponse

log = Logger()

FORM = "application/x-www-form-urlencoded"
MAX_FIELDS = 16
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


class FormError(ValueError):
    """The body is not a strict form; the message says why (no value)."""


def parseForm(request: IRequest) -> dict[str, str]:
    """The body of C{request} as a strict URL-encoded form."""
    header: bytes = request.getHeader(b"content-type") or b""
    ctype = header.split(b";", 1)[0].strip().lower()
    if ctype != FORM.encode("ascii"):
        raise FormError(f"the body must be {FORM}")
    raw = b"" if request.content is None else request.content.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FormError("the body is not UTF-8") from None
    if _BAD_PERCENT.search(text):
        raise FormError("the body has a bad percent-encoding")
    try:
        pairs = urllib.parse.parse_qsl(
            text,
            keep_blank_values=True,
            strict_parsing=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_FIELDS,
        )
    except UnicodeDecodeError:
        raise FormError("a field is not UTF-8 once decoded") from None
    except ValueError:
        raise FormError(
            f"the body is not a form of at most {MAX_FIELDS} fields"
        ) from None
    form: dict[str, str] = {}
    for name, value in pairs:
        if name in form:
            raise FormError("a field is repeated")
        form[name] = value
    return form


def peerOf(request: IRequest) -> str:
    """The client's address, as the rate limits and the journal know it."""
    address = request.getClientAddress()
    return str(getattr(address, "host", None) or address)


class _FormEndpoint(Endpoint):
    """A POST-only boot leaf answering with JSON from the flow."""

    isLeaf = True

    def __init__(self, flow: DeviceFlow) -> None:
        super().__init__()
        self._flow = flow

    def answer(self, form: dict[str, str], peer: str) -> Reply | Deferred[Reply]:
        raise NotImplementedError

    def render_POST(self, request: IRequest) -> bytes | int:
        if request.postpath:
            return textResponse(request, http.NOT_FOUND, "not found")
        try:
            form = parseForm(request)
        except FormError as e:
            return self._write(
                request,
                Reply(400, {"error": "invalid_request", "error_description": str(e)}),
            )
        answer = self.answer(form, peerOf(request))
        if isinstance(answer, Reply):
            return self._write(request, answer)
        gone: list[Failure] = []
        live: Any = request  # a server.Request: it can tell when it is gone
        live.notifyFinish().addErrback(gone.append)

        def write(reply: Reply) -> None:
            if not gone:
                request.write(self._write(request, reply))
                request.finish()

        def failed(failure: Failure) -> None:
            log.failure("deviceflow.poll-failed", failure=failure)
            write(Reply(400, {"error": "authorization_pending"}))

        answer.addCallback(write).addErrback(failed)
        notDoneYet: int = server.NOT_DONE_YET
        return notDoneYet

    def _write(self, request: IRequest, reply: Reply) -> bytes:
        if reply.retryAfter is not None:
            request.setHeader(b"retry-after", b"%d" % (reply.retryAfter,))
        request.setHeader(b"pragma", b"no-cache")
        return jsonResponse(request, reply.status, reply.document)


class DeviceCodeResource(_FormEndpoint):
    """C{POST /device/code} (RFC 8628 section 3.1) [F4]."""

    def answer(self, form: dict[str, str], peer: str) -> Reply:
        return self._flow.requestCode(form, peer)


class TokenResource(_FormEndpoint):
    """C{POST /token} (RFC 8628 section 3.4) [F1]; never a 429."""

    def answer(self, form: dict[str, str], peer: str) -> Deferred[Reply]:
        return Deferred.fromCoroutine(self._flow.poll(form, peer))


def deviceCodeResource(flow: DeviceFlow) -> resource.Resource:
    """The boot listener's C{/device/code}."""
    return DeviceCodeResource(flow)


def tokenResource(flow: DeviceFlow) -> resource.Resource:
    """The boot listener's C{/token}."""
    return TokenResource(flow)
