"""
Resources of the admin listener.

C{/healthz} and C{/metrics} answer anyone who reaches the listener (it is
not the boot listener, so nodes in Talos never see them [A2]).
C{/v1/admin/*} answers only a client that presented a certificate issued by
the owner CA; TLS verified the chain, L{fleetd.web.owner} checks the purpose
(the clientAuth extended key usage must be there [O1]) and the name (the CN
must fit the journal's actor names), and this module refuses a change whose
body is not C{application/json} (C{text/csv} for imports) with 415, or whose JSON has a
key twice with 400 [O3], and a reader's change with 403 [O4]
(L{fleetd.admin.readers}), before any child sees the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from twisted.internet.interfaces import IReactorTime
from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd import jsonbody
from fleetd.admin.console.tree import ConsoleTree
from fleetd.admin.journal import JournalVerifyResource, ReanchorResource
from fleetd.admin.readers import READER_API_POSTS, ReaderRefusals
from fleetd.admin.refusals import journalRefusal
from fleetd.fleet.journal import Verify, checkRun, deviceKey
from fleetd.inventory.model import IInventory
from fleetd.jsonbody import JSONBodyError
from fleetd.logs import ThrottledLog
from fleetd.readiness import Readiness
from fleetd.store.journal import AsyncJournal
from fleetd.web.owner import NO_CERTIFICATE, checkOwner
from fleetd.web.resources import (
    Endpoint,
    Refusal,
    Router,
    jsonResponse,
    renderAsync,
    textResponse,
)


class Health(Endpoint):
    """
    C{/healthz}, a readiness signal: 200 C{"ok"} once fleetd can serve
    nodes, 503 C{"starting"} while its runs load or a listener has not
    passed its TLS self-check, C{"degraded"} when a later self-check
    failed, and C{"failed"} when the load failed, each with the reason
    (design.md, Listeners; L{fleetd.readiness}).
    """

    isLeaf = True

    def __init__(
        self,
        clock: IReactorTime,
        site: str,
        version: str,
        readiness: Readiness | None = None,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._started = clock.seconds()
        self._site = site
        self._version = version
        if readiness is None:  # an admin tree without a run load behind it
            readiness = Readiness()
            readiness.loaded()
        self._readiness = readiness

    def render_GET(self, request: IRequest) -> bytes:
        ready = self._readiness.ready
        if not ready:
            request.setHeader(b"retry-after", b"5")
        return jsonResponse(
            request,
            http.OK if ready else http.SERVICE_UNAVAILABLE,
            {
                **self._readiness.toJSON(),
                "site": self._site,
                "version": self._version,
                "uptime_seconds": round(self._clock.seconds() - self._started, 3),
            },
        )


class MetricsResource(Endpoint):
    """Serve C{registry} in the Prometheus text format."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self._registry = registry

    def render_GET(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        body: bytes = generate_latest(self._registry)
        return body


# Changes (paths below /v1/admin/) whose body is CSV; all others take JSON.
CSV_CHANGES = frozenset({b"devices/import", b"evidence/import"})
# Imports that take either: a supplier's manifest comes as CSV or JSON.
CSV_OR_JSON = frozenset({b"evidence/import"})
READS = frozenset({b"GET", b"HEAD"})


class OwnerGate(resource.Resource):
    """
    Let only operators past this point; everyone else gets a 403 line [O1].

    Changes (any method but GET and HEAD) must then carry the body type
    their path takes, C{application/json} or (imports) C{text/csv} (the
    evidence import takes either), in
    UTF-8: anything else (a browser's C{text/plain} or form encodings) is
    a 415, so a page in the owner's browser cannot forge one. A JSON body
    that is not JSON, or names a key twice, is a 400 [O3]. A well-formed
    change from a reader is then a 403, journaled (L{ReaderRefusals}),
    unless its path is one of L{READER_API_POSTS} [O4]. All of this is
    decided before any child sees the request, so nothing changes.
    """

    def __init__(
        self, inner: resource.Resource, clock: IReactorTime, readers: ReaderRefusals
    ) -> None:
        super().__init__()
        self.inner = inner
        self._log = ThrottledLog(clock)
        self._readers = readers

    def getChildWithDefault(self, path: bytes, request: IRequest) -> resource.Resource:
        checked = checkOwner(request)
        if checked.owner is None:
            if checked.refusal != NO_CERTIFICATE:
                self._log.warn("admin.owner-refused {reason}", reason=checked.refusal)
            return Refusal(http.FORBIDDEN, checked.refusal)
        if request.method not in READS:
            below = b"/".join([path, *request.postpath]).rstrip(b"/")
            csv = below in CSV_CHANGES
            if below in CSV_OR_JSON and _mediaType(request)[0] != "text/csv":
                csv = False
            refusal = _checkBody(request, csv=csv)
            if refusal is not None:
                return refusal
            if not checked.mayChange and below not in READER_API_POSTS:
                return self._readers.refusal(checked.owner)
        child: resource.Resource = self.inner.getChildWithDefault(path, request)
        return child

    def render(self, request: IRequest) -> bytes:
        checked = checkOwner(request)
        if checked.owner is None:
            return Refusal(http.FORBIDDEN, checked.refusal).render(request)
        return Refusal(http.NOT_FOUND, "not found").render(request)


def _mediaType(request: IRequest) -> tuple[str, dict[str, str]]:
    raw = request.getHeader(b"content-type") or b""
    text = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
    kind, *params = (part.strip() for part in text.split(";"))
    parsed = {}
    for param in params:
        key, _, value = param.partition("=")
        parsed[key.strip().lower()] = value.strip().strip('"').lower()
    return kind.lower(), parsed


def _checkBody(request: IRequest, *, csv: bool) -> Refusal | None:
    """A 415 or 400 for a change whose body this API does not take [O3]."""
    kind, params = _mediaType(request)
    wanted = "text/csv" if csv else "application/json"
    charset = params.get("charset", "utf-8")
    if kind != wanted or charset != "utf-8" or set(params) - {"charset"}:
        return Refusal(
            http.UNSUPPORTED_MEDIA_TYPE,
            f"unsupported content-type: this change takes {wanted} (UTF-8)",
        )
    if csv:
        return None
    content = request.content
    raw = b"" if content is None else content.read()
    if content is not None:
        content.seek(0)
    try:
        jsonbody.loads(raw)
    except JSONBodyError as e:
        return Refusal(http.BAD_REQUEST, f"body: {e}")
    return None


def _arg(request: IRequest, name: bytes) -> str | None:
    values = request.args.get(name) if request.args else None
    if not values:
        return None
    if len(values) > 1:
        raise ValueError(f"repeated parameter {name.decode()}")
    value: bytes = values[0]
    return value.decode("utf-8")


class JournalResource(Endpoint):
    """
    C{GET /v1/admin/journal[?device=&run=&since=&limit=]}.

    A C{device} neither the journal nor the inventory knows, or a C{run}
    the journal never named, is a 404 line, not an empty list (issue 19
    item 4): a typo must not look like a quiet device. A retired device
    the inventory no longer holds is known by its history.
    """

    def __init__(
        self,
        journal: AsyncJournal,
        inventory: IInventory | None = None,
        verify: Verify | None = None,
    ) -> None:
        """
        @param inventory: where a device without history is looked up;
            L{None} for a tree without one (then only the journal counts).
        @param verify: verifies the chain and records the verdict (fleetd's
            L{fleetd.store.chain.ChainMonitor.verify}); L{None}: only verify.
        """
        super().__init__()
        self._journal = journal
        self._inventory = inventory
        check: Verify = journal.verify if verify is None else verify
        self.putChild(b"verify", JournalVerifyResource(check))
        self.putChild(b"reanchor", ReanchorResource(journal, check))

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
            key = None
            if device is not None:
                key = await deviceKey(self._journal, self._inventory, device)
            if run is not None:
                await checkRun(self._journal, run)
            entries = await self._journal.query(
                device=key, run=run, since_seq=since, limit=limit
            )
            return http.OK, {"entries": [e.toJSON() for e in entries]}

        return renderAsync(request, work, journalRefusal)


class WhoAmI(Endpoint):
    """C{GET /v1/admin/whoami}: the operator's name and role [O4]."""

    isLeaf = True

    def render_GET(self, request: IRequest) -> bytes:
        checked = checkOwner(request)
        document = {"owner": checked.owner, "role": checked.role}
        return jsonResponse(request, http.OK, document)


def adminRoot(
    *,
    clock: IReactorTime,
    registry: CollectorRegistry,
    journal: AsyncJournal,
    site: str,
    version: str,
    api: Mapping[bytes, resource.Resource] | None = None,
    readiness: Readiness | None = None,
    inventory: IInventory | None = None,
    verify: Verify | None = None,
    console: ConsoleTree | None = None,
) -> resource.Resource:
    """
    The admin listener's resource tree.

    @param api: more children of C{/v1/admin/}, from the subsystems that
        own them (devices, runs, ...); all of them sit behind the owner
        gate, which refuses readers' changes [O4].
    @param readiness: what C{/healthz} reports; L{None} for a tree that
        has no run load behind it (always ready).
    @param inventory: where C{journal?device=} looks up a device without
        history (L{JournalResource}).
    @param verify: see L{JournalResource}.
    @param console: the owner console's pages: the fleet view at C{/} and
        its other children beside C{/v1}; L{None}: no console.
    """
    owner = Router()
    owner.putChild(b"journal", JournalResource(journal, inventory, verify))
    owner.putChild(b"whoami", WhoAmI())
    for name, child in (api or {}).items():
        owner.putChild(name, child)
    v1 = Router()
    readers = ReaderRefusals(journal, clock, via="api")
    v1.putChild(b"admin", OwnerGate(owner, clock, readers))
    root = Router(None if console is None else console.index)
    for name, child in ({} if console is None else console.children).items():
        root.putChild(name, child)
    root.putChild(b"healthz", Health(clock, site, version, readiness))
    root.putChild(b"metrics", MetricsResource(registry))
    root.putChild(b"v1", v1)
    return root
