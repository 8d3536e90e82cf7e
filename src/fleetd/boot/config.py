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

The query is read by L{fleetd.boot.query}. Each request asks the index
of runs one question (L{fleetd.runs.index.BootIndex.decide}, the
uuid/serial check inside it); the decision and the consumed mark happen
in that one call, in one reactor turn [C1]; the
body is written through a producer and the run counts as delivered only
once the operating system has all of it (L{fleetd.boot.handover});
when the connection fails before that, the mark is withdrawn. The
handovers in flight are this resource's own: when the answer is that a
run is still being delivered (busy, or superseded in flight), it checks
that run's handover out of turn, and asks once more if that settled it;
the registry never sees them. A full
vault (the mark cannot be written) is a 503 that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.interfaces import IReactorTime
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

from fleetd.boot.handover import BodyProducer, Handover
from fleetd.boot.query import BadQuery, Identity, parseQuery
from fleetd.deviceflow.model import Grant, sameIdentity
from fleetd.logs import ThrottledLog
from fleetd.ratelimit import RateLimiter
from fleetd.runs.index import Decision, Miss
from fleetd.runs.machine import Outcome
from fleetd.runs.registry import RunRegistry
from fleetd.runs.run import Run
from fleetd.runs.store import RunRecord
from fleetd.sources import sourceKey
from fleetd.web.resources import textResponse

LITERAL_CODE = "${code}"
YAML = b"application/yaml"

BUSY, SUPERSEDED = Outcome.BUSY, Outcome.SUPERSEDED  # may still be in flight

ELSEWHERE = Decision(Miss.WRONG_MACHINE)  # a token for another machine

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
        # The index of current runs, asked directly on every request.
        self._runs = registry.index
        # Per-request warnings are rate-limited: a flood is not a log flood.
        self.log = ThrottledLog(clock)
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
        if not self._runs.loaded:
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
        code = ident.code
        if code is None or code == LITERAL_CODE:
            raise BadQuery("code missing: META 0x0b is not set on this node yet")
        if ident.uuid is None or ident.serial is None:
            raise BadQuery("uuid and serial are required")
        verdict, run, body = self._runs.decide(code, ident.uuid, ident.serial, peer)
        # Inline, not a call: this runs on every request of the boot storm.
        if (verdict is BUSY or verdict is SUPERSEDED) and self._settledNow(
            verdict, run
        ):
            verdict, run, body = self._runs.decide(code, ident.uuid, ident.serial, peer)
        if body is not None and run is not None:  # delivering: marked served
            return self._deliver(request, run, body)
        if verdict is Miss.HISTORY:
            # Superseded history is in the database, not in memory.
            d = self._runs.retired(code)
            d.addCallbacks(
                self._retired,
                self._retiredFailed,
                callbackArgs=(request, peer),
                errbackArgs=(request,),
            )
            return server.NOT_DONE_YET
        if verdict is Miss.UNKNOWN:
            return self._unknown(request, peer)
        if verdict is Miss.WRONG_MACHINE:
            device = None if run is None else run.record.device
            self.log.warn(
                "config.wrong-machine {device} {peer}", device=device, peer=peer
            )
            return self._refuse(
                request, peer, "wrong_machine", FORBIDDEN,
                "this code belongs to another machine",
            )  # fmt: skip
        return self._refuseOutcome(request, verdict)

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
        decision = ELSEWHERE
        if _sameMachine(ident, grant):
            decision = self._runs.decideGrant(
                grant.device, grant.delivered, grant.inventory, peer
            )
            verdict = decision.verdict
            if (verdict is BUSY or verdict is SUPERSEDED) and self._settledNow(
                verdict, decision.run
            ):
                decision = self._runs.decideGrant(
                    grant.device, grant.delivered, grant.inventory, peer
                )
        verdict, run, body = decision
        if verdict is Miss.WRONG_MACHINE:
            return self._refuse(
                request, peer, "wrong_machine", FORBIDDEN,
                "this token belongs to another machine",
            )  # fmt: skip
        if run is None or not isinstance(verdict, Outcome):
            return self._refuse(request, peer, "unknown", NOT_FOUND, "no run")
        if body is None:
            return self._refuseOutcome(request, verdict)
        delivered = run.record.id
        return self._deliver(
            request, run, body,
            onDelivered=lambda: grants.delivered(grant, delivered),
        )  # fmt: skip

    def _settledNow(self, verdict: Outcome | Miss, run: Run | None) -> bool:
        """
        Another request for a run whose delivery this resource still hands
        over: that client may have read it all by now, so the handover is
        checked out of turn. Whether it settled a delivery the answer said
        was in flight (L{Outcome.BUSY}): then the question is asked again.
        A superseded run's delivery settles here too; its answer stands.
        """
        if run is None:
            return False
        held = self._handovers.get(run.record.id)
        if held is None:
            return False
        held.poll()
        return verdict is Outcome.BUSY and run.record.id not in self._handovers

    def _refuseOutcome(self, request: IRequest, outcome: Outcome) -> bytes:
        """A run's machine said no (busy, unavailable, consumed, lost...)."""
        if outcome is Outcome.BUSY or outcome is Outcome.UNAVAILABLE:
            self._count[outcome.value].inc()
            wait = b"5" if outcome is Outcome.BUSY else b"30"
            request.setHeader(b"retry-after", wait)
            return textResponse(request, SERVICE_UNAVAILABLE, REFUSALS[outcome])
        self._count[outcome.value].inc()
        return textResponse(request, GONE, REFUSALS[outcome])

    def _deliver(
        self,
        request: IRequest,
        run: Run,
        body: bytes,
        onDelivered: Callable[[], None] | None = None,
    ) -> int:
        """Hand C{run}'s body over; it counts as delivered once the OS has it."""
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
            self._runs.finished(run, complete=complete)
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


def _gone(request: IRequest) -> bool:
    """Whether the client went away while we looked something up."""
    return bool(getattr(request, "_disconnected", False)) or bool(
        getattr(request, "finished", False)
    )
