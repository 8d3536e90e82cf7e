"""
Machine trust on the admin API (behind the owner gate) [T1].

  - C{POST /v1/admin/evidence} C{{"serial", "ek_sha256", "kind", "ref"?}}:
    201 with C{{"recorded": [...], "unchanged": [], "conflicts": [...]}}
    (200 when the same claim was already recorded).
  - C{GET /v1/admin/evidence[?serial=S]}: C{{"evidence": [...]}}, oldest
    first, withdrawn evidence marked.
  - C{POST /v1/admin/evidence/import[?kind=K&ref=R]}: a CSV (C{text/csv})
    or JSON (C{application/json}) manifest (L{fleetd.trust.manifest}),
    parsed in a worker thread (the C{offload} given), recorded all or
    nothing; 200 with counts and conflicts.
  - C{POST /v1/admin/evidence/ID/withdraw} C{{"reason": "..."}}: 200.
  - C{GET /v1/admin/bindings}: C{{"bindings": [...]}} with their state.
  - C{POST /v1/admin/bindings/approve} C{{"serial", "ek_sha256"?}}: 201
    (200 if already approved); a refusal is 409 C{"<code>: <why>"}.
  - C{POST /v1/admin/disks/NAME/forget} C{{"reason": "..."}}: drop a
    device's disk report [D1]; 200 with the report as it was.

Other refusals are one line: 400 invalid, 404 unknown, 503 when the store
could not record the change (nothing changed).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd import jsonbody
from fleetd.admin.devices import Offload
from fleetd.admin.refusals import trustRefusal
from fleetd.jsonbody import JSONBodyError
from fleetd.trust.disks import DiskService
from fleetd.trust.manifest import parseManifest
from fleetd.trust.model import (
    EvidenceInput,
    EvidenceKind,
    TrustError,
    evidence,
    validateKind,
    validateRef,
)
from fleetd.trust.service import TrustService
from fleetd.web.owner import ownerOf
from fleetd.web.resources import Endpoint, notFound, renderAsync

Outcome = tuple[int, Any]


def _actor(request: IRequest) -> str:
    return "owner:" + (ownerOf(request) or "unknown")


def _raw(request: IRequest) -> bytes:
    content = request.content
    return b"" if content is None else content.read()


def jsonObject(raw: bytes, keys: dict[str, bool]) -> dict[str, Any]:
    """A strict JSON object with only C{keys} (name -> required), strings."""
    try:
        document = jsonbody.loads(raw)
    except JSONBodyError as e:
        raise TrustError(f"body: {e}") from None
    if not isinstance(document, dict):
        raise TrustError("body: must be a JSON object")
    for key in document:
        if key not in keys:
            raise TrustError(f"body: unknown key {key!r} (known: {', '.join(keys)})")
    for key, required in keys.items():
        if key not in document or document[key] is None:
            if required:
                raise TrustError(f"{key}: missing")
        elif not isinstance(document[key], str):
            raise TrustError(f"{key}: must be a JSON string")
    return document


def render(request: Any, work: Callable[[], Awaitable[Outcome]]) -> int:
    return renderAsync(request, work, trustRefusal)


def _query(request: IRequest, name: bytes) -> str | None:
    values = (request.args or {}).get(name)
    if not values:
        return None
    if len(values) > 1:
        raise TrustError(f"query: {name.decode()} given twice")
    try:
        value: str = values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise TrustError(f"query: {name.decode()} is not UTF-8") from None
    return value


def parseManifestBody(
    raw: bytes, *, kind: EvidenceKind, ref: str | None
) -> list[EvidenceInput]:
    """Decode and parse an import body: blocking work, for a worker thread."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TrustError(f"body: not UTF-8 (byte {e.start})") from None
    return parseManifest(text, kind=kind, ref=ref)


class EvidenceResource(Endpoint):
    """C{/v1/admin/evidence}."""

    def __init__(self, service: TrustService, offload: Offload[Any]) -> None:
        super().__init__()
        self._service = service
        self._offload = offload

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if path == b"" and not request.postpath:
            return self
        if path == b"import" and not request.postpath:
            return ImportEvidence(self._service, self._offload)
        if request.postpath == [b"withdraw"] and path.isdigit() and len(path) < 19:
            return WithdrawEvidence(self._service, int(path))
        return notFound()

    def render_GET(self, request: IRequest) -> int:
        async def work() -> Outcome:
            records = await self._service.evidence(_query(request, b"serial"))
            return http.OK, {"evidence": [r.toJSON() for r in records]}

        return render(request, work)

    def render_POST(self, request: IRequest) -> int:
        actor, raw = _actor(request), _raw(request)

        async def work() -> Outcome:
            doc = jsonObject(
                raw, {"serial": True, "ek_sha256": True, "kind": True, "ref": False}
            )
            claim = evidence(
                serial=doc["serial"],
                ek_sha256=doc["ek_sha256"],
                kind=doc["kind"],
                ref=doc.get("ref"),
            )
            done = await self._service.record([claim], actor=actor, via="add")
            return (http.CREATED if done.recorded else http.OK), done.toJSON()

        return render(request, work)


class ImportEvidence(Endpoint):
    """C{POST /v1/admin/evidence/import}: a manifest, all or nothing."""

    isLeaf = True

    def __init__(self, service: TrustService, offload: Offload[Any]) -> None:
        super().__init__()
        self._service = service
        self._offload = offload

    def render_POST(self, request: IRequest) -> int:
        actor, raw = _actor(request), _raw(request)

        async def work() -> Outcome:
            kindArg = _query(request, b"kind")
            kind = (
                EvidenceKind.SUPPLIER_RECORD
                if kindArg is None
                else validateKind(kindArg)
            )
            ref = validateRef(_query(request, b"ref"))
            parse = functools.partial(parseManifestBody, kind=kind, ref=ref)
            claims: list[EvidenceInput] = await self._offload(parse, raw)
            done = await self._service.record(claims, actor=actor, via="import")
            return http.OK, {
                "recorded": len(done.recorded),
                "unchanged": len(done.unchanged),
                "conflicts": done.conflicts,
            }

        return render(request, work)


class WithdrawEvidence(Endpoint):
    """C{POST /v1/admin/evidence/ID/withdraw}."""

    isLeaf = True

    def __init__(self, service: TrustService, evidenceId: int) -> None:
        super().__init__()
        self._service = service
        self._id = evidenceId

    def render_POST(self, request: IRequest) -> int:
        actor, raw = _actor(request), _raw(request)

        async def work() -> Outcome:
            doc = jsonObject(raw, {"reason": True})
            record = await self._service.withdraw(
                self._id, actor=actor, reason=doc["reason"]
            )
            return http.OK, record.toJSON()

        return render(request, work)


class BindingsResource(Endpoint):
    """C{/v1/admin/bindings}."""

    def __init__(self, service: TrustService) -> None:
        super().__init__()
        self._service = service

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if request.postpath:
            return notFound()
        if path == b"":
            return self
        if path == b"approve":
            return ApproveBinding(self._service)
        return notFound()

    def render_GET(self, request: IRequest) -> int:
        async def work() -> Outcome:
            views = await self._service.bindings()
            return http.OK, {"bindings": [v.toJSON() for v in views]}

        return render(request, work)


class ApproveBinding(Endpoint):
    """C{POST /v1/admin/bindings/approve}."""

    isLeaf = True

    def __init__(self, service: TrustService) -> None:
        super().__init__()
        self._service = service

    def render_POST(self, request: IRequest) -> int:
        actor, raw = _actor(request), _raw(request)

        async def work() -> Outcome:
            doc = jsonObject(raw, {"serial": True, "ek_sha256": False})
            approval = await self._service.approve(
                doc["serial"], actor=actor, ek=doc.get("ek_sha256")
            )
            return (http.CREATED if approval.changed else http.OK), approval.toJSON()

        return render(request, work)


class DisksAdminResource(Endpoint):
    """C{/v1/admin/disks/NAME/forget}."""

    def __init__(self, service: DiskService) -> None:
        super().__init__()
        self._service = service

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if request.postpath != [b"forget"] or not path:
            return notFound()
        try:
            device = path.decode("ascii")
        except UnicodeDecodeError:
            return notFound()
        return ForgetDisks(self._service, device)


class ForgetDisks(Endpoint):
    isLeaf = True

    def __init__(self, service: DiskService, device: str) -> None:
        super().__init__()
        self._service = service
        self._device = device

    def render_POST(self, request: IRequest) -> int:
        actor, raw = _actor(request), _raw(request)

        async def work() -> Outcome:
            doc = jsonObject(raw, {"reason": True})
            old = await self._service.forget(
                self._device, actor=actor, reason=doc["reason"]
            )
            return http.OK, old.toJSON()

        return render(request, work)
