"""
HTTP edges of the device flow (L{fleetd.boot.deviceflow}).

On the boot listener, C{POST /device/code} and C{POST /token} take an
C{application/x-www-form-urlencoded} body, parsed strictly: UTF-8, valid
percent-encoding, C{name=value} pairs only, at most 16 fields, none
repeated (RFC 6749 section 3.1); unknown fields are ignored.  Anything
else is a 400 C{invalid_request}.  Answers are JSON with C{Cache-Control:
no-store} and C{Pragma: no-cache}; a 429 or 503 carries C{Retry-After}.
An C{Authorization: Basic} header (golang.org/x/oauth2 sends one with an
empty secret) is ignored: Talos is a public client.

On the admin listener, under C{/v1/admin/device-flow}:

  - C{GET}: C{{"pending": [...]}}, undecided requests, oldest first;
  - C{POST .../approve} C{{"user_code": "...", "device": "..."}} and
    C{POST .../deny} C{{"user_code": "..."}}: the request as JSON.

Admin refusals are one line of text, C{KIND: message}: 400 invalid, 404
unknown user code, 409 already decided or no ready run, 410 expired, 429
too many failed attempts.  Decisions are journaled before the answer.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd.admin.resource import ownerOf, renderAsync
from fleetd.boot.deviceflow import DeviceFlow
from fleetd.boot.deviceflow_model import Answer, DeviceFlowError, PendingRequest
from fleetd.store.fields import FieldValue
from fleetd.store.journal import AsyncJournal
from fleetd.web import Endpoint, jsonResponse, notFound, textResponse

log = Logger()

TOO_MANY_REQUESTS = 429  # twisted.web.http has no name for it
FORM = "application/x-www-form-urlencoded"
MAX_FIELDS = 16
STATUS_OF_KIND = {
    "invalid": http.BAD_REQUEST,
    "unknown-user-code": http.NOT_FOUND,
    "already-decided": http.CONFLICT,
    "no-ready-run": http.CONFLICT,
    "mismatch": http.CONFLICT,
    "expired": http.GONE,
    "too-many-attempts": TOO_MANY_REQUESTS,
}
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")

OwnerOf = Callable[[IRequest], str | None]


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


def _reported(value: str) -> str:
    """A node-reported value the journal's secret guard will take."""
    return "(refused: PEM marker)" if "-----BEGIN" in value else value


def _journalFailed(failure: Failure) -> None:
    log.failure("deviceflow.journal-failed", failure=failure)


class _FormEndpoint(Endpoint):
    """A POST-only boot leaf answering with JSON from the flow."""

    isLeaf = True

    def __init__(self, flow: DeviceFlow, journal: AsyncJournal) -> None:
        super().__init__()
        self._flow = flow
        self._journal = journal

    def answer(self, form: dict[str, str], peer: str) -> Answer:
        raise NotImplementedError

    def render_POST(self, request: IRequest) -> bytes:
        if request.postpath:
            return textResponse(request, http.NOT_FOUND, "not found")
        peer = peerOf(request)
        try:
            form = parseForm(request)
        except FormError as e:
            status, document = self._flow.malformed(peer, str(e))
        else:
            status, document = self.answer(form, peer)
        if status in (TOO_MANY_REQUESTS, http.SERVICE_UNAVAILABLE):
            retry = self._flow.retryAfter(peer)
            request.setHeader(b"retry-after", str(retry).encode("ascii"))
        request.setHeader(b"pragma", b"no-cache")
        return jsonResponse(request, status, document)


class DeviceCodeResource(_FormEndpoint):
    """
    C{POST /device/code} (RFC 8628 section 3.1).

    Requests are not journaled: anyone on the network can make them, and
    the persistent journal must not grow at their pace. The owner's
    decisions are journaled with what the node reported.
    """

    def answer(self, form: dict[str, str], peer: str) -> Answer:
        return self._flow.requestCode(form, peer)


class TokenResource(_FormEndpoint):
    """C{POST /token} (RFC 8628 section 3.4); journals issued tokens."""

    def answer(self, form: dict[str, str], peer: str) -> Answer:
        status, document = self._flow.poll(form, peer)
        if status == http.OK:
            grant = self._flow.authorize(str(document["access_token"]))
            if grant is not None:
                self._journal.append(
                    "deviceflow.issued",
                    actor=f"node:{grant.device}",
                    device=grant.device,
                    run=grant.run,
                    fields={"peer": peer},
                ).addErrback(_journalFailed)
        return status, document


def deviceCodeResource(flow: DeviceFlow, journal: AsyncJournal) -> resource.Resource:
    """The boot listener's C{/device/code}."""
    return DeviceCodeResource(flow, journal)


def tokenResource(flow: DeviceFlow, journal: AsyncJournal) -> resource.Resource:
    """The boot listener's C{/token}."""
    return TokenResource(flow, journal)


# The admin side


def requestJSON(view: PendingRequest) -> dict[str, object]:
    """A request as the admin API shows it: no secret, only whether the
    node sent its code."""
    return {
        "user_code": view.user_code,
        "state": view.state,
        "issued": view.issued,
        "device": view.device,
        "run": view.run,
        "decided_by": view.decided_by,
        "peer": view.peer,
        "client_id": view.client_id,
        "created_at": view.created_at,
        "expires_at": view.expires_at,
        "reported": {k: v for k, v in view.reported.items() if k != "code"},
        "code_sent": view.code_sent,
    }


def _strictObject(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DeviceFlowError("invalid", f"body: key {key!r} appears twice")
        result[key] = value
    return result


def _jsonBody(
    request: IRequest, keys: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, str]:
    """A JSON object with the string members C{keys}, and maybe C{optional}."""
    raw = b"" if request.content is None else request.content.read()
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=_strictObject)
    except (UnicodeDecodeError, ValueError):
        raise DeviceFlowError("invalid", "body: not a JSON object") from None
    if not isinstance(document, dict) or not (
        set(keys) <= set(document) <= set(keys) | set(optional)
    ):
        raise DeviceFlowError("invalid", f"body: must have exactly {', '.join(keys)}")
    if not all(isinstance(v, str) for v in document.values()):
        raise DeviceFlowError("invalid", "body: values must be strings")
    return document


class _Decision(Endpoint):
    """C{POST .../approve} or C{.../deny}."""

    isLeaf = True

    def __init__(
        self, flow: DeviceFlow, journal: AsyncJournal, owner: OwnerOf, approve: bool
    ) -> None:
        super().__init__()
        self._flow = flow
        self._journal = journal
        self._owner = owner
        self._approve = approve

    def render_POST(self, request: IRequest) -> int | bytes:
        owner = self._owner(request)
        if owner is None:
            return textResponse(
                request, http.FORBIDDEN, "owner client certificate required"
            )
        try:
            if self._approve:
                body = _jsonBody(request, ("user_code", "device"), optional=("force",))
                view = self._flow.approve(
                    body["user_code"],
                    body["device"],
                    owner,
                    force=body.get("force") == "yes",
                )
            else:
                body = _jsonBody(request, ("user_code",))
                view = self._flow.deny(body["user_code"], owner)
        except DeviceFlowError as e:
            log.warn(
                "deviceflow.decision-refused {kind} {owner}", kind=e.kind, owner=owner
            )
            return textResponse(request, STATUS_OF_KIND[e.kind], f"{e.kind}: {e}")
        return renderAsync(request, lambda: self._journaled(view, owner))

    async def _journaled(self, view: PendingRequest, owner: str) -> tuple[int, Any]:
        fields: dict[str, FieldValue] = {"request": view.user_code, "peer": view.peer}
        if view.state == "approved":
            for name in ("uuid", "serial"):
                if name in view.reported:
                    fields[name] = _reported(view.reported[name])
        await self._journal.append(
            f"deviceflow.{view.state}",
            actor=f"owner:{owner}",
            device=view.device,
            run=view.run,
            fields=fields,
        )
        return http.OK, requestJSON(view)


class DeviceFlowAdmin(Endpoint):
    """C{/v1/admin/device-flow}: the pending list and the owner's decisions."""

    def __init__(
        self, flow: DeviceFlow, journal: AsyncJournal, owner: OwnerOf = ownerOf
    ) -> None:
        super().__init__()
        self._flow = flow
        self.putChild(b"approve", _Decision(flow, journal, owner, approve=True))
        self.putChild(b"deny", _Decision(flow, journal, owner, approve=False))

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if path == b"" and not request.postpath:
            return self
        return notFound()

    def render_GET(self, request: IRequest) -> bytes:
        pending = [requestJSON(p) for p in self._flow.pending()]
        return jsonResponse(request, http.OK, {"pending": pending})


def deviceFlowAdminResource(
    flow: DeviceFlow, journal: AsyncJournal, owner: OwnerOf = ownerOf
) -> resource.Resource:
    """
    C{/v1/admin/device-flow}; C{owner} names the request's owner (tests
    pass a fake: L{ownerOf} needs a TLS client certificate).
    """
    return DeviceFlowAdmin(flow, journal, owner)
