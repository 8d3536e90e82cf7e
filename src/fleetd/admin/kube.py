"""
The owner's Kubernetes credential commands on the admin API (behind the
owner gate; thin adapters over L{ClusterTokens} and L{RetireService}):

  - C{GET /v1/admin/cluster-token}: C{{"pending": [request, ...]}};
  - C{POST /v1/admin/cluster-token/request} C{{"node", "reason"}}: 201,
    the pending request [K5];
  - C{POST /v1/admin/cluster-token/approve} C{{"request"}}: the request
    and the token, shown in this answer only;
  - C{POST /v1/admin/cluster-token/rotate} C{{}}: the new token, the old
    token's id and deletion time, and what to change in Talos [K6];
  - C{POST /v1/admin/retire} C{{"device"}}: what was done and what
    cannot be revoked [R1].

Refusals are one line: 400 bad body, 404 unknown request or device, 409
already decided or no cluster configured, 503 the cluster or the store
could not be reached (nothing changed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.web import http
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource

from fleetd.admin.refusals import kubeRefusal
from fleetd.fleet.retire import RetireService
from fleetd.inventory.model import InventoryError, validateName
from fleetd.kube.cluster import ClusterTokenError, ClusterTokens
from fleetd.web.owner import OwnerOf, ownerOf
from fleetd.web.resources import Endpoint, notFound, renderAsync, textResponse

MAX_REASON = 200
NO_CLUSTER = "no-cluster: [kubernetes] is not configured; fleetd makes no cluster calls"


class _Bad(Exception):
    pass


def _body(request: IRequest, keys: tuple[str, ...]) -> dict[str, str]:
    raw = b"" if request.content is None else request.content.read()
    try:
        doc = json.loads(raw.decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError):
        raise _Bad("body: not JSON") from None
    if not isinstance(doc, dict) or set(doc) != set(keys):
        raise _Bad(f"body: must have exactly {', '.join(keys) or 'no members'}")
    if not all(isinstance(doc[k], str) and doc[k] for k in keys):
        raise _Bad("body: values must be non-empty strings")
    return doc


TALOS_STEPS = [
    "Set cluster.token to the new token in every control plane's Talos"
    " configuration (talosctl patch machineconfig), and in the configs of machines"
    " that join with it (shale); worker templates carry per-node tokens instead.",
    "Run talosctl upgrade-k8s (or let the control planes re-apply their bootstrap"
    " manifests) so the cluster's own bootstrap Secret follows the new value.",
    "The old token is deleted at the time shown; configs still carrying it stop"
    " working for new joins then.",
]


class _Command(Endpoint):
    isLeaf = True

    def __init__(
        self,
        keys: tuple[str, ...],
        action: Callable[[dict[str, str], str], Any],
        owner: OwnerOf,
        created: int = http.OK,
    ) -> None:
        super().__init__()
        self._keys = keys
        self._action = action
        self._owner = owner
        self._created = created

    def render_POST(self, request: IRequest) -> int | bytes:
        owner = self._owner(request)
        if owner is None:
            return textResponse(request, http.FORBIDDEN, "owner certificate required")
        try:
            body = _body(request, self._keys)
        except _Bad as e:
            return textResponse(request, http.BAD_REQUEST, f"invalid: {e}")

        async def work() -> tuple[int, Any]:
            return self._created, await self._action(body, f"owner:{owner}")

        return renderAsync(request, work, kubeRefusal)


class _Pending(Endpoint):
    def __init__(self, tokens: ClusterTokens | None) -> None:
        super().__init__()
        self._tokens = tokens

    def getChild(self, path: bytes, request: IRequest) -> Resource:
        if path == b"" and not request.postpath:
            return self
        return notFound()

    def render_GET(self, request: IRequest) -> int | bytes:
        tokens = self._tokens
        if tokens is None:
            return textResponse(request, http.CONFLICT, NO_CLUSTER)

        async def work() -> tuple[int, Any]:
            pending = await tokens.pending()
            return http.OK, {"pending": [r.toJSON() for r in pending]}

        return renderAsync(request, work, kubeRefusal)


def clusterTokenResource(
    tokens: ClusterTokens | None, owner: OwnerOf = ownerOf
) -> Endpoint:
    """C{/v1/admin/cluster-token} and its commands [K5][K6]."""

    def need() -> ClusterTokens:
        if tokens is None:
            raise ClusterTokenError(NO_CLUSTER.split(": ", 1)[1], "no-cluster")
        return tokens

    async def request(body: dict[str, str], actor: str) -> Any:
        try:
            node = validateName(body["node"])
        except InventoryError as e:
            raise ClusterTokenError(f"node: {e}") from e
        reason = body["reason"]
        if len(reason) > MAX_REASON or not reason.isprintable():
            raise ClusterTokenError(f"reason: 1 to {MAX_REASON} printable characters")
        return (await need().request(node, reason, actor)).toJSON()

    async def approve(body: dict[str, str], actor: str) -> Any:
        decided, token = await need().approve(body["request"], actor)
        return {
            **decided.toJSON(),
            "token": token.bearer,
            "note": "shown once: put it in the node's cluster.token",
        }

    async def rotate(body: dict[str, str], actor: str) -> Any:
        token, old, deadline = await need().rotate(actor)
        return {
            "token_id": token.id,
            "token": token.bearer,
            "old_token_id": old,
            "old_deleted_at": deadline,
            "steps": TALOS_STEPS,
        }

    root = _Pending(tokens)
    root.putChild(b"request", _Command(("node", "reason"), request, owner, 201))
    root.putChild(b"approve", _Command(("request",), approve, owner))
    root.putChild(b"rotate", _Command((), rotate, owner))
    return root


def retireResource(service: RetireService, owner: OwnerOf = ownerOf) -> _Command:
    """C{POST /v1/admin/retire} [R1]."""

    async def retire(body: dict[str, str], actor: str) -> Any:
        try:
            name = validateName(body["device"])
        except InventoryError as e:
            raise ClusterTokenError(f"device: {e}") from e
        return (await service.retire(name, actor)).toJSON()

    return _Command(("device",), retire, owner)
