"""
Resources of the admin listener.

C{/healthz} and C{/metrics} answer anyone who reaches the listener (it is
not the boot listener, so nodes in Talos never see them [A2]).
C{/v1/admin/*} answers only a client that presented a certificate issued by
the owner CA; TLS verified the chain, this module checks the purpose and
names the owner for the journal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, resource, server
from twisted.web.iweb import IRequest

from fleetd.metrics import MetricsResource
from fleetd.store.journal import AsyncJournal
from fleetd.web import Endpoint, Refusal, Router, jsonResponse, textResponse

log = Logger()


def ownerOf(request: IRequest) -> str | None:
    """
    The owner name (certificate CN) of C{request}'s client, or L{None}.

    The TLS layer has already verified the chain against the owner CA; a
    certificate whose extended key usage excludes client authentication is
    still refused here.
    """
    transport = getattr(request, "transport", None)
    getPeer = getattr(transport, "getPeerCertificate", None)
    if getPeer is None:
        return None
    peer = getPeer()
    if peer is None:
        return None
    cert = peer.to_cryptography()
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        eku = None
    if eku is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        return None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[0].value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def renderAsync(
    request: Any,
    work: Callable[[], Awaitable[tuple[int, Any]]],
    refusal: Callable[[Exception], tuple[int, str] | None] | None = None,
) -> int:
    """
    Run C{work} and write its C{(code, document)} as JSON.

    An exception that C{refusal} maps to C{(code, line)} is that one-line
    answer; any other is logged as a bug and answered with a one-line 500.
    Nothing is written after the client went away.
    """
    gone: list[bool] = []
    request.notifyFinish().addErrback(lambda _: gone.append(True))

    async def run() -> None:
        try:
            code, document = await work()
            body = jsonResponse(request, code, document)
        except Exception as e:
            answer = None if refusal is None else refusal(e)
            if answer is None:
                log.failure("admin.request.failed", failure=Failure())
                answer = (http.INTERNAL_SERVER_ERROR, "internal error")
            body = textResponse(request, *answer)
        if not gone:
            request.write(body)
            request.finish()

    Deferred.fromCoroutine(run())
    notDoneYet: int = server.NOT_DONE_YET
    return notDoneYet


class Health(Endpoint):
    isLeaf = True

    def __init__(self, clock: IReactorTime, site: str, version: str) -> None:
        super().__init__()
        self._clock = clock
        self._started = clock.seconds()
        self._site = site
        self._version = version

    def render_GET(self, request: IRequest) -> bytes:
        return jsonResponse(
            request,
            http.OK,
            {
                "status": "ok",
                "site": self._site,
                "version": self._version,
                "uptime_seconds": round(self._clock.seconds() - self._started, 3),
            },
        )


class OwnerGate(resource.Resource):
    """Let only owners past this point; everyone else gets a 403 line."""

    def __init__(self, inner: resource.Resource) -> None:
        super().__init__()
        self._inner = inner

    def getChildWithDefault(self, path: bytes, request: IRequest) -> resource.Resource:
        if ownerOf(request) is None:
            return _ownerRequired()
        child: resource.Resource = self._inner.getChildWithDefault(path, request)
        return child

    def render(self, request: IRequest) -> bytes:
        return _ownerRequired().render(request)


def _ownerRequired() -> Refusal:
    return Refusal(http.FORBIDDEN, "owner client certificate required")


def _arg(request: IRequest, name: bytes) -> str | None:
    values = request.args.get(name) if request.args else None
    if not values:
        return None
    if len(values) > 1:
        raise ValueError(f"repeated parameter {name.decode()}")
    value: bytes = values[0]
    return value.decode("utf-8")


class JournalResource(Endpoint):
    """C{GET /v1/admin/journal[?device=&run=&since=&limit=]}."""

    def __init__(self, journal: AsyncJournal) -> None:
        super().__init__()
        self._journal = journal
        self.putChild(b"verify", JournalVerifyResource(journal))

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if path == b"":
            return self
        return Refusal(http.NOT_FOUND, "not found")

    def render_GET(self, request: IRequest) -> int | bytes:
        try:
            device = _arg(request, b"device")
            run = _arg(request, b"run")
            since = int(_arg(request, b"since") or "0")
            limit = int(_arg(request, b"limit") or "1000")
            if since < 0 or not 1 <= limit <= 10000:
                raise ValueError("since must be >= 0 and limit 1..10000")
        except (ValueError, UnicodeDecodeError) as e:
            return textResponse(request, http.BAD_REQUEST, f"bad query: {e}")

        async def work() -> tuple[int, Any]:
            entries = await self._journal.query(
                device=device, run=run, since_seq=since, limit=limit
            )
            return http.OK, {"entries": [e.toJSON() for e in entries]}

        return renderAsync(request, work)


class JournalVerifyResource(Endpoint):
    """C{GET /v1/admin/journal/verify}: walk the whole chain."""

    isLeaf = True

    def __init__(self, journal: AsyncJournal) -> None:
        super().__init__()
        self._journal = journal

    def render_GET(self, request: IRequest) -> int:
        async def work() -> tuple[int, Any]:
            result = await self._journal.verify()
            return http.OK, {
                "ok": result.ok,
                "entries": result.entries,
                "problem": result.problem,
                "seq": result.seq,
            }

        return renderAsync(request, work)


class WhoAmI(Endpoint):
    isLeaf = True

    def render_GET(self, request: IRequest) -> bytes:
        return jsonResponse(request, http.OK, {"owner": ownerOf(request)})


def adminRoot(
    *,
    clock: IReactorTime,
    registry: CollectorRegistry,
    journal: AsyncJournal,
    site: str,
    version: str,
    api: Mapping[bytes, resource.Resource] | None = None,
) -> resource.Resource:
    """
    The admin listener's resource tree.

    @param api: more children of C{/v1/admin/}, from the subsystems that
        own them (devices, runs, ...); all of them sit behind the owner gate.
    """
    owner = Router()
    owner.putChild(b"journal", JournalResource(journal))
    owner.putChild(b"whoami", WhoAmI())
    for name, child in (api or {}).items():
        owner.putChild(name, child)
    v1 = Router()
    v1.putChild(b"admin", OwnerGate(owner))
    root = Router()
    root.putChild(b"healthz", Health(clock, site, version))
    root.putChild(b"metrics", MetricsResource(registry))
    root.putChild(b"v1", v1)
    return root
