"""
The device listener's attestation, renewal and lookup resources [A3].

Thin adapters over L{AttestationService} and L{LookupService}: JSON in
(C{application/json}, duplicate keys refused), JSON out, refusals as one
line starting with the reason code. Attestation needs no client
certificate; renewal and lookups need an acceptable LDevID (L{LDevIDIdentifier}).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd import jsonbody
from fleetd.attest.identity import LDevIDIdentifier, Peer
from fleetd.attest.lookup import LookupService
from fleetd.attest.service import AttestationService
from fleetd.device.refusals import answerFor
from fleetd.jsonbody import JSONBodyError
from fleetd.nodes import LDEVID_REQUIRED, MALFORMED, Refused
from fleetd.web.peer import peerCertificate
from fleetd.web.resources import Endpoint, Router, renderAsync


def readJSON(request: IRequest) -> dict[str, Any]:
    """The request's JSON object body. @raise Refused: C{malformed}."""
    kind = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
    if kind != b"application/json":
        raise Refused(MALFORMED, "body must be application/json")
    raw = b"" if request.content is None else request.content.read()
    try:
        doc = jsonbody.loads(raw)
    except JSONBodyError as e:
        raise Refused(MALFORMED, f"body: {e}") from e
    if not isinstance(doc, dict):
        raise Refused(MALFORMED, "body must be a JSON object")
    return doc


def _arg(request: IRequest, name: bytes) -> str | None:
    values = (request.args or {}).get(name)
    if not values:
        return None
    value: bytes = values[0]
    return value.decode("utf-8", "replace")


class _Post(Endpoint):
    isLeaf = True

    def __init__(
        self,
        work: Callable[[IRequest, dict[str, Any]], Awaitable[dict[str, Any]]],
        attestation: AttestationService,
    ) -> None:
        super().__init__()
        self._work = work
        self._attestation = attestation

    def render_POST(self, request: IRequest) -> int:
        async def run() -> tuple[int, Any]:
            try:
                doc = readJSON(request)
            except Refused as refusal:
                raise await self._attestation.refuse(refusal) from None
            return http.OK, await self._work(request, doc)

        return renderAsync(request, run, answerFor(request))


class _Get(Endpoint):
    isLeaf = True

    def __init__(self, work: Callable[[IRequest], Awaitable[dict[str, Any]]]) -> None:
        super().__init__()
        self._work = work

    def render_GET(self, request: IRequest) -> int:
        async def run() -> tuple[int, Any]:
            return http.OK, await self._work(request)

        return renderAsync(request, run, answerFor(request))


def deviceAPI(
    attestation: AttestationService,
    identify: LDevIDIdentifier,
    lookups: LookupService | None,
    node: Mapping[bytes, resource.Resource] | None = None,
) -> resource.Resource:
    """
    C{/v1/...} of the device listener; C{node} adds children of
    C{/v1/node/} (e.g. the disk report) beside the lookups.
    """

    async def begin(request: IRequest, doc: dict[str, Any]) -> dict[str, Any]:
        return await attestation.begin(doc)

    async def prove(request: IRequest, doc: dict[str, Any]) -> dict[str, Any]:
        return await attestation.prove(doc)

    async def peer(request: IRequest) -> Peer:
        try:
            return identify.check(peerCertificate(request))
        except Refused as refusal:
            if refusal.reason == LDEVID_REQUIRED:
                raise  # no certificate at all: nothing worth a journal entry
            raise await attestation.refuse(refusal) from None

    async def renew(request: IRequest, doc: dict[str, Any]) -> dict[str, Any]:
        return await attestation.renew(await peer(request), doc)

    attest = Router()
    attest.putChild(b"challenge", _Post(begin, attestation))
    attest.putChild(b"proof", _Post(prove, attestation))
    ldevid = Router()
    ldevid.putChild(b"renew", _Post(renew, attestation))
    v1 = Router()
    v1.putChild(b"attest", attest)
    v1.putChild(b"ldevid", ldevid)
    nodeTree = Router()
    for name, child in (node or {}).items():
        nodeTree.putChild(name, child)
    v1.putChild(b"node", nodeTree)
    if lookups is not None:

        async def record(request: IRequest) -> dict[str, Any]:
            return await lookups.record(await peer(request), _arg(request, b"device"))

        async def plan(request: IRequest) -> dict[str, Any]:
            return await lookups.plan(await peer(request), _arg(request, b"device"))

        nodeTree.putChild(b"record", _Get(record))
        nodeTree.putChild(b"plan", _Get(plan))
    return v1
