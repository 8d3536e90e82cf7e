"""
C{POST /v1/admin/provision}: the owner starts runs, one per device, through
the one L{Provisioner} (L{fleetd.fleet.provision}, which the console's
device page uses too).

Body: C{{"devices": ["w1", ...], "desired_action": null | "netboot"}}.
Answer 201 with C{{"runs": [{"run", "code", "device"}, ...]}}; the codes
appear in this response and nowhere else. A refusal is the provisioner's
L{Refused}, answered with its reason's status (L{fleetd.admin.refusals}):
an unknown device 404; a refused class [T2], an ambiguous serial, a
template that cannot be rendered (naming the device and its cluster), a
retired device, a run that moved on or Tinkerbell's objects in the way
409; the inventory that cannot be asked 503 C{busy: ...}, a full vault or
an unreachable cluster 503, with Retry-After; nothing changes [J1].
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.admin.refusals import lineOf, ownerRefusal, statusOf
from fleetd.fleet.provision import Provisioner
from fleetd.inventory.model import IInventory, InventoryError, validateName
from fleetd.refused import MALFORMED, Refused
from fleetd.runs.provision import ICredentials
from fleetd.runs.registry import RunRegistry
from fleetd.runs.render import TemplateRenderer
from fleetd.store.journal import AsyncJournal
from fleetd.web.owner import ownerOf
from fleetd.web.refusals import Answer, withRetryAfter
from fleetd.web.resources import Endpoint, renderAsync, textResponse

DESIRED_ACTIONS = frozenset({"netboot"})
MAX_DEVICES = 1000


def _answer(request: IRequest) -> Answer:
    """L{ownerRefusal}, with C{Retry-After} on a 503 (busy: retry later)."""
    return withRetryAfter(request, ownerRefusal)


def parseProvision(body: bytes) -> tuple[list[str], str | None]:
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Refused(MALFORMED, "body is not JSON") from e
    if not isinstance(doc, dict) or set(doc) - {"devices", "desired_action"}:
        raise Refused(MALFORMED, "expected {devices, desired_action}")
    names = doc.get("devices")
    if (
        not isinstance(names, list)
        or not names
        or len(names) > MAX_DEVICES
        or not all(isinstance(n, str) and n for n in names)
    ):
        raise Refused(MALFORMED, f"devices: 1 to {MAX_DEVICES} device names")
    try:
        names = [validateName(n) for n in names]  # as the inventory keys them
    except InventoryError as e:
        raise Refused(MALFORMED, f"devices: {e}") from e
    if len(set(names)) != len(names):
        raise Refused(MALFORMED, "devices: a device is named twice")
    action = doc.get("desired_action")
    if action is not None and action not in DESIRED_ACTIONS:
        raise Refused(MALFORMED, f"desired_action: one of {sorted(DESIRED_ACTIONS)}")
    return names, action


class ProvisionEndpoint(Endpoint):
    """C{POST /v1/admin/provision} over a L{Provisioner}."""

    isLeaf = True

    def __init__(
        self,
        provisioner: Provisioner,
        ownerName: Callable[[IRequest], str | None] = ownerOf,
    ) -> None:
        super().__init__()
        self.provisioner = provisioner
        self._ownerName = ownerName

    def render_POST(self, request: IRequest) -> bytes | int:
        body = request.content.read() if request.content is not None else b""
        actor = f"owner:{self._ownerName(request)}"
        try:
            names, action = parseProvision(body)
        except Refused as e:
            return textResponse(request, statusOf(e), lineOf(e))

        async def work() -> tuple[int, Any]:
            runs = await self.provisioner.provision(names, actor, action)
            return http.CREATED, {"runs": [p.toJSON() for p in runs]}

        return renderAsync(request, work, _answer(request))


class ProvisionResource(ProvisionEndpoint):
    """L{ProvisionEndpoint} over a L{Provisioner} of its own."""

    def __init__(
        self,
        registry: RunRegistry,
        inventory: IInventory,
        renderer: TemplateRenderer,
        journal: AsyncJournal,
        ownerName: Callable[[IRequest], str | None] = ownerOf,
        credentials: ICredentials | None = None,
    ) -> None:
        super().__init__(
            Provisioner(registry, inventory, renderer, journal, credentials),
            ownerName,
        )
