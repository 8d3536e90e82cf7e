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
a body (L{fleetd.web.site.BoundedRequest}), so it neither consumes, delivers nor
tells anything about the code.

The decision and the consumed mark happen in one reactor turn [C1]; the
body is written through a producer and the run counts as delivered only
once the operating system has all of it (L{fleetd.boot.handover});
when the connection fails before that, the mark is withdrawn. A full
vault (the mark cannot be written) is a 503 that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote_to_bytes

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web import resource, server
from twisted.web.http import (  # bound once: the module is a deprecation proxy
    BAD_REQUEST,
    FORBIDDEN,
    GONE,
    NOT_ALLOWED,
    NOT_FOUND,
    OK,
    SERVICE_UNAVAILABLE,
)
from twisted.web.iweb import IRequest
from zope.interface import implementer

from fleetd.boot.handover import Handover
from fleetd.deviceflow.model import Grant, sameIdentity
from fleetd.logs import ThrottledLog
from fleetd.ratelimit import RateLimiter
from fleetd.runs.codes import wellFormedCode
from fleetd.runs.machine import Outcome
from fleetd.runs.registry import RunRegistry, _Run
from fleetd.runs.store import RunRecord
from fleetd.sources import sourceKey
from fleetd.web.resources import textResponse

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
    Outcome.UNAVAILABLE: "unavailable: fleetd cannot write to its configuration "
    "vault; retry later",
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
    raw = request.uri.partition(b"?")[2]
    values: dict[str, str] = {}
    for pair in raw.split(b"&") if raw else []:
        key, _, value = pair.partition(b"=")
        name = _PLAIN_NAMES.get(key)  # as nodes send them: nothing to decode
        try:
            if name is None:
                name = _unquote(key)
            text = _unquote(value)
        except UnicodeDecodeError as e:
            raise BadQuery("query is not UTF-8") from e
        if name not in _NAMES:
            continue
        if name in values:
            raise BadQuery(f"repeated parameter {name}")
        if len(text) > 256 or not text.isprintable():
            raise BadQuery(f"bad {name}")
        values[name] = text
    return Identity(values.get("code"), values.get("uuid"), values.get("serial"))


_NAMES = frozenset(("code", "uuid", "serial"))
_PLAIN_NAMES = {name.encode("ascii"): name for name in _NAMES}


def _unquote(part: bytes) -> str:
    """A query part decoded as a form does (C{+} is a space); plain ones cheaply."""
    if b"%" in part or b"+" in part:
        part = unquote_to_bytes(part.replace(b"+", b" "))
    return part.decode("utf-8")


class IGrants(Protocol):
    """What the device flow offers the config resource."""

    def authorize(self, accessToken: str) -> Grant | None: ...

    def delivered(self, grant: Grant, run: str) -> None: ...


def _sameMachine(ident: Identity, grant: Grant) -> bool:
    """Whether the query names no other machine than the approved one."""
    for name, asked, approved in (
        ("uuid", ident.uuid, grant.uuid),
        ("serial", ident.serial, grant.serial),
    ):
        if asked and approved is not None and not sameIdentity(asked, approved, name):
            return False
    return True


class ConfigResource(resource.Resource):
    """The C{/config} leaf."""

    isLeaf = True

    def __init__(
        self,
        registry: RunRegistry,
        *,
        clock: IReactorTime,
        metrics: CollectorRegistry,
        limiter: RateLimiter | None = None,
        grants: IGrants | None = None,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._handovers: dict[str, Handover] = {}
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
                "unavailable",
            )
        }  # fmt: skip

    def render(self, request: IRequest) -> bytes | int:
        if request.postpath:  # /config/anything is not /config [A2]
            return textResponse(request, NOT_FOUND, "not found")
        if request.method != b"GET":  # HEAD must never consume a run
            request.setHeader(b"allow", b"GET")
            return textResponse(request, NOT_ALLOWED, "method not allowed")
        peer = request.getClientAddress().host
        if not self._registry.loaded:
            request.setHeader(b"retry-after", b"5")
            return textResponse(request, SERVICE_UNAVAILABLE, "starting")
        limiter = self._limiter
        if limiter is not None and not limiter.peekFailing(sourceKey(peer)):
            self._count["rate_limited"].inc()
            wait = limiter.retryAfter(sourceKey(peer))
            request.setHeader(b"retry-after", b"%d" % (wait,))
            return textResponse(request, 429, "too many requests")
        try:
            return self._render(request, peer)
        except BadQuery as e:
            return self._refuse(request, peer, "malformed", BAD_REQUEST, str(e))

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
        if not wellFormedCode(ident.code):
            return self._unknown(request, peer)
        run = self._registry.byCode(ident.code)
        if run is None:
            # Superseded history is in the database, not in memory.
            d = self._registry.retired(ident.code)
            d.addCallbacks(
                self._retired,
                self._retiredFailed,
                callbackArgs=(request, peer),
                errbackArgs=(request,),
            )
            return server.NOT_DONE_YET
        return self._serve(request, peer, run, ident)

    def _unknown(self, request: IRequest, peer: str) -> bytes:
        return self._refuse(request, peer, "unknown", NOT_FOUND, "unknown code")

    def _retired(self, record: RunRecord | None, request: IRequest, peer: str) -> None:
        if _gone(request):
            return
        if record is None:
            body = self._unknown(request, peer)
        else:
            self._count[Outcome.SUPERSEDED.value].inc()
            body = textResponse(request, GONE, REFUSALS[Outcome.SUPERSEDED])
        request.write(body)
        request.finish()

    def _retiredFailed(self, failure: Failure, request: IRequest) -> None:
        self.log.error(
            "config.history.failed {reason}", reason=failure.getErrorMessage()
        )
        if _gone(request):
            return
        request.setHeader(b"retry-after", b"30")
        self._count["unavailable"].inc()
        request.write(
            textResponse(request, SERVICE_UNAVAILABLE, "unavailable: retry later")
        )
        request.finish()

    def _renderBearer(
        self, request: IRequest, peer: str, auth: bytes, ident: Identity
    ) -> bytes | int:
        """
        [F2] A device-flow token: one delivery of its device's run that is
        ready now, to the machine that was approved, while the inventory
        still holds the identity it held then.
        """
        scheme, _, token = auth.decode("latin-1").partition(" ")
        grants, grant = self._grants, None
        if scheme.lower() == "bearer" and token and grants is not None:
            grant = grants.authorize(token.strip())
        if grants is None or grant is None:
            return self._refuse(
                request, peer, "unknown", NOT_FOUND, "unknown or expired token"
            )
        if not _sameMachine(ident, grant) or (
            self._registry.identity(grant.device) != grant.inventory
        ):
            return self._refuse(
                request, peer, "wrong_machine", FORBIDDEN,
                "this token belongs to another machine",
            )  # fmt: skip
        runId = grant.delivered or self._registry.readyRun(grant.device)
        if runId is None:  # no ready run: answer as the latest one stands
            current = self._registry.current(grant.device)
            runId = None if current is None else current.id
        run = None if runId is None else self._registry.byId(runId)
        if run is None:
            return self._refuse(request, peer, "unknown", NOT_FOUND, "no run")
        delivered = run.record.id
        return self._serve(
            request, peer, run, ident, checkIdentity=False,
            onDelivered=lambda: grants.delivered(grant, delivered),
        )  # fmt: skip

    def _serve(
        self,
        request: IRequest,
        peer: str,
        run: _Run,
        ident: Identity,
        checkIdentity: bool = True,
        onDelivered: Callable[[], None] | None = None,
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
                request, peer, "wrong_machine", FORBIDDEN,
                "this code belongs to another machine",
            )  # fmt: skip
        pending = self._handovers.get(run.record.id)
        if pending is not None:  # settle the previous delivery first, if it can
            pending.poll()
        outcome, body = self._registry.request(run, peer)
        if outcome is Outcome.BUSY or outcome is Outcome.UNAVAILABLE:
            self._count[outcome.value].inc()
            wait = b"5" if outcome is Outcome.BUSY else b"30"
            request.setHeader(b"retry-after", wait)
            return textResponse(request, SERVICE_UNAVAILABLE, REFUSALS[outcome])
        if outcome is not Outcome.DELIVER or body is None:
            self._count[outcome.value].inc()
            return textResponse(request, GONE, REFUSALS[outcome])
        request.setResponseCode(OK)
        request.setHeader(b"content-type", YAML)
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"content-length", b"%d" % (len(body),))
        # The connection ends with this response: requests pipelined behind
        # it are dropped unanswered, so nothing written after the body can
        # sit in fleetd's buffers and make a delivered body look unsent [C1].
        request.setHeader(b"connection", b"close")
        channel = getattr(request, "channel", None)
        if channel is not None:
            channel.persistent = False

        transport = getattr(channel, "transport", None)

        def settle(complete: bool) -> None:
            self._count["delivered" if complete else "aborted"].inc()
            self._registry.finished(run, complete=complete)
            if complete and onDelivered is not None:
                onDelivered()

        def report(complete: bool) -> None:
            self._handovers.pop(run.record.id, None)
            settle(complete)

        handover = Handover(self._clock, transport, report)

        def finished(_: object) -> None:
            # Handed to the connection; delivered once the OS has it all.
            self._handovers[run.record.id] = handover
            handover.start()

        notify = request.notifyFinish()  # type: ignore[attr-defined]
        notify.addCallbacks(finished, lambda _: settle(False))
        BodyProducer(request, body, handover.bodyWritten).start()
        notDoneYet: int = server.NOT_DONE_YET
        return notDoneYet

    def stop(self) -> None:
        """
        Stop watching deliveries in flight: their marks stay in the vault,
        so the next start counts them consumed [C1].
        """
        for handover in list(self._handovers.values()):
            handover.cancel()
        self._handovers.clear()


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

    def __init__(
        self,
        request: IRequest,
        body: bytes,
        lastWritten: Callable[[], None] = lambda: None,
    ) -> None:
        self._request = request
        self._lastWritten = lastWritten  # called between the last write and finish
        self._body = memoryview(body)
        self._offset = 0
        self._paused = False
        self._done = False

    def start(self) -> None:
        if len(self._body) <= self.chunkSize:
            self._done = True
            self._request.write(bytes(self._body))
            self._lastWritten()
            self._request.finish()
            return
        self._request.registerProducer(self, True)  # type: ignore[attr-defined]
        self._pump()

    def _pump(self) -> None:
        while not (self._paused or self._done):
            chunk = bytes(self._body[self._offset : self._offset + self.chunkSize])
            self._offset += len(chunk)
            if self._offset >= len(self._body):
                self._done = True
                self._request.unregisterProducer()  # type: ignore[attr-defined]
                self._request.write(chunk)
                self._lastWritten()
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


def _gone(request: IRequest) -> bool:
    """Whether the client went away while we looked something up."""
    return bool(getattr(request, "_disconnected", False)) or bool(
        getattr(request, "finished", False)
    )
