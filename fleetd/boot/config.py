"""
C{GET /config} on the boot listener: deliver a run's configuration once.

Talos treats only 200 as success and retries everything else, so every
refusal is a cheap one-line answer:

- 400: malformed (missing parts, a literal C{${code}}, repeated or
  undecodable parameters);
- 403: the code is valid for another machine (uuid/serial differ);
- 404: unknown code;
- 410: consumed, lost or superseded (the body says which);
- 429: this source asked too often.

C{HEAD} (and every method but C{GET}) is a 405 with C{Allow: GET}: only a
GET can consume a run, and a HEAD gets the headers of that answer without
a body (L{fleetd.web.BoundedRequest}), so it neither consumes, delivers nor
tells anything about the code.

The decision and the consumed mark happen in one reactor turn [C1]; the
body is written through a producer and the run counts as delivered only
when the response finished on a live connection, otherwise the mark is
withdrawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.interfaces import IPushProducer
from twisted.web import http, resource, server
from twisted.web.iweb import IRequest
from zope.interface import implementer

from fleetd.boot.deviceflow import Grant
from fleetd.boot.ratelimit import RateLimiter, sourceKey
from fleetd.logs import ThrottledLog
from fleetd.runs.codes import wellFormedCode
from fleetd.runs.machine import Outcome
from fleetd.runs.registry import RunRegistry
from fleetd.web import textResponse

LITERAL_CODE = "${code}"
YAML = b"application/yaml"

REFUSALS = {
    Outcome.CONSUMED: "consumed: this configuration was already delivered; "
    "the owner must provision again",
    Outcome.LOST: "lost: fleetd no longer holds this configuration; "
    "the owner must provision again",
    Outcome.SUPERSEDED: "superseded: a newer run replaced this code",
    Outcome.BUSY: "busy: this configuration is being delivered on another "
    "connection; retry",
}


class BadQuery(ValueError):
    """The query cannot be a Talos config request."""


@dataclass(frozen=True)
class Identity:
    """What a node says about itself in the query."""

    code: str | None
    uuid: str | None
    serial: str | None


def parseQuery(request: IRequest) -> Identity:
    """
    Read C{code}, C{uuid} and C{serial}; refuse repeats and bad encodings.
    Other parameters are ignored.
    """
    raw = request.uri.split(b"?", 1)[1] if b"?" in request.uri else b""
    values: dict[str, str] = {}
    for pair in raw.split(b"&") if raw else []:
        key, _, value = pair.partition(b"=")
        try:
            name = unquote_to_bytes(key).decode("utf-8")
            text = unquote_to_bytes(value.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadQuery("query is not UTF-8") from e
        if name not in ("code", "uuid", "serial"):
            continue
        if name in values:
            raise BadQuery(f"repeated parameter {name}")
        if len(text) > 256 or not text.isprintable():
            raise BadQuery(f"bad {name}")
        values[name] = text
    return Identity(values.get("code"), values.get("uuid"), values.get("serial"))


class IGrants(Protocol):
    """What the device flow offers the config resource."""

    def authorize(self, accessToken: str) -> Grant | None: ...


class ConfigResource(resource.Resource):
    """The C{/config} leaf."""

    isLeaf = True

    def __init__(
        self,
        registry: RunRegistry,
        *,
        metrics: CollectorRegistry,
        limiter: RateLimiter | None = None,
        grants: IGrants | None = None,
    ) -> None:
        super().__init__()
        self._registry = registry
        # Per-request warnings are rate-limited: a flood is not a log flood.
        self.log = ThrottledLog(registry.clock)
        self._limiter = limiter
        self._grants = grants
        self._outcomes = Counter(
            "fleetd_config_requests_total",
            "GET /config requests by outcome.",
            ["outcome"],
            registry=metrics,
        )
        self._count = {
            name: self._outcomes.labels(name)
            for name in (
                "delivered", "aborted", "busy", "consumed", "lost", "superseded",
                "unknown", "wrong_machine", "malformed", "rate_limited",
            )
        }  # fmt: skip

    def render(self, request: IRequest) -> bytes | int:
        if request.postpath:  # /config/anything is not /config [A2]
            return textResponse(request, http.NOT_FOUND, "not found")
        if request.method != b"GET":  # HEAD must never consume a run
            request.setHeader(b"allow", b"GET")
            return textResponse(request, http.NOT_ALLOWED, "method not allowed")
        peer = request.getClientAddress().host
        if not self._registry.loaded:
            request.setHeader(b"retry-after", b"5")
            return textResponse(request, http.SERVICE_UNAVAILABLE, "starting")
        limiter = self._limiter
        if limiter is not None and not limiter.peekFailing(sourceKey(peer)):
            self._count["rate_limited"].inc()
            wait = limiter.retryAfter(sourceKey(peer))
            request.setHeader(b"retry-after", b"%d" % (wait,))
            return textResponse(request, 429, "too many requests")
        try:
            return self._render(request, peer)
        except BadQuery as e:
            return self._refuse(request, peer, "malformed", http.BAD_REQUEST, str(e))

    def _refuse(
        self, request: IRequest, peer: str, kind: str, code: int, line: str
    ) -> bytes:
        self._count[kind].inc()
        if self._limiter is not None:  # every refusal here is a failed guess
            self._limiter.charge(sourceKey(peer))
        return textResponse(request, code, line)

    def _render(self, request: IRequest, peer: str) -> bytes | int:
        ident = parseQuery(request)
        auth = request.getHeader(b"authorization")
        if auth is not None:
            return self._renderBearer(request, peer, auth, ident)
        if ident.code is None or ident.code == LITERAL_CODE:
            raise BadQuery("code missing: META 0x0b is not set on this node yet")
        if ident.uuid is None or ident.serial is None:
            raise BadQuery("uuid and serial are required")
        run = self._registry.byCode(ident.code) if wellFormedCode(ident.code) else None
        if run is None:
            return self._refuse(
                request, peer, "unknown", http.NOT_FOUND, "unknown code"
            )
        return self._serve(request, peer, run, ident)

    def _renderBearer(
        self, request: IRequest, peer: str, auth: bytes, ident: Identity
    ) -> bytes | int:
        scheme, _, token = auth.decode("latin-1").partition(" ")
        grant = None
        if scheme.lower() == "bearer" and token and self._grants is not None:
            grant = self._grants.authorize(token.strip())
        if grant is None:
            return self._refuse(
                request, peer, "unknown", http.NOT_FOUND, "unknown or expired token"
            )
        run = self._registry.byId(grant.run)
        if run is None or run.record.device != grant.device:
            return self._refuse(request, peer, "unknown", http.NOT_FOUND, "unknown run")
        return self._serve(request, peer, run, ident, checkIdentity=False)

    def _serve(
        self,
        request: Any,
        peer: str,
        run: Any,
        ident: Identity,
        checkIdentity: bool = True,
    ) -> bytes | int:
        device = run.record.device
        known = self._registry.identity(device)
        if checkIdentity and (
            known is None
            or (ident.uuid or "").strip().lower() != known[0]
            # Serials are unique case-insensitively, as in the inventory.
            or (ident.serial or "").strip().casefold() != known[1].casefold()
        ):
            self.log.warn(
                "config.wrong-machine {device} {peer}", device=device, peer=peer
            )
            return self._refuse(
                request, peer, "wrong_machine", http.FORBIDDEN,
                "this code belongs to another machine",
            )  # fmt: skip
        outcome, body = self._registry.request(run, peer)
        if outcome is Outcome.BUSY:
            self._count["busy"].inc()
            request.setHeader(b"retry-after", b"5")
            return textResponse(request, http.SERVICE_UNAVAILABLE, REFUSALS[outcome])
        if outcome is not Outcome.DELIVER or body is None:
            self._count[outcome.value].inc()
            return textResponse(request, http.GONE, REFUSALS[outcome])
        request.setResponseCode(http.OK)
        request.setHeader(b"content-type", YAML)
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"content-length", b"%d" % (len(body),))

        def done(_: object) -> None:
            self._count["delivered"].inc()
            self._registry.finished(run, complete=True)

        def lost(_: object) -> None:
            self._count["aborted"].inc()
            self._registry.finished(run, complete=False)

        request.notifyFinish().addCallbacks(done, lost)
        BodyProducer(request, body).start()
        notDoneYet: int = server.NOT_DONE_YET
        return notDoneYet


@implementer(IPushProducer)
class BodyProducer:
    """
    Write a body in chunks while the connection takes them, pausing when
    its buffers are full, and finish the response in the same step as the
    last chunk.

    Once the last byte is handed over the client may have everything, so
    the response must count as finished then: a client that closes right
    after reading Content-Length bytes must not make the run deliverable
    again [C1]. A connection lost while chunks are still held back (a slow
    or vanished reader) is a delivery that did not happen.
    """

    chunkSize = 65536

    def __init__(self, request: Any, body: bytes) -> None:
        self._request = request
        self._body = memoryview(body)
        self._offset = 0
        self._paused = False
        self._done = False

    def start(self) -> None:
        if len(self._body) <= self.chunkSize:
            self._done = True
            self._request.write(bytes(self._body))
            self._request.finish()
            return
        self._request.registerProducer(self, True)
        self._pump()

    def _pump(self) -> None:
        while not (self._paused or self._done):
            chunk = bytes(self._body[self._offset : self._offset + self.chunkSize])
            self._offset += len(chunk)
            if self._offset >= len(self._body):
                self._done = True
                self._request.unregisterProducer()
                self._request.write(chunk)
                self._request.finish()
            else:
                self._request.write(chunk)  # may pause us, synchronously

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._pump()

    def stopProducing(self) -> None:
        self._done = True
