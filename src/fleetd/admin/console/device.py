"""
C{/devices/NAME}: one device's page (issue 20 item 3), and the routes of
its owner actions (L{fleetd.admin.console.deviceactions}).

The page says what C{fleetctl status NAME} says, in its words: both
render L{fleetd.statuswords} rows of the same L{StatusService} report
(here a definition list), then the open alerts with the recovery step,
the device's pending device-flow requests and its last journal entries.
It offers the owner actions that are safe from a browser, each a link to
a confirmation page whose form makes the change (L{ACTIONS}). No code,
token or key is on it: the report holds none, and a pending request's
user code and reported code stay on the server.
"""

from __future__ import annotations

from typing import Any

from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd.admin.console.deviceactions import (
    ACTIONS,
    REPORTED,
    DeviceServices,
    deviceReport,
    pendingFor,
)
from fleetd.admin.console.page import Page, errorPage, renderPageAsync
from fleetd.fleet.status import DeviceReport
from fleetd.inventory.model import REFUSED_CLASSES, DeviceStatus
from fleetd.statuswords import entryParts, headline, statusRows
from fleetd.trust.model import TrustError
from fleetd.web.resources import Endpoint


class _NotFound(resource.Resource):
    """A 404 console page."""

    isLeaf = True

    def __init__(self, message: str = "not found") -> None:
        super().__init__()
        self._message = message

    def render(self, request: IRequest) -> bytes:
        return errorPage(request, http.NOT_FOUND, self._message)


class DevicesPages(resource.Resource):
    """
    C{/devices/NAME} and C{/devices/NAME/ACTION}; C{/devices} alone, an
    empty name or an unknown action is a 404 page.
    """

    def __init__(self, services: DeviceServices) -> None:
        super().__init__()
        self._services = services

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        rest = request.postpath or []
        if not path or len(rest) > 1:
            return _NotFound()
        try:
            name = path.decode("utf-8")
        except UnicodeDecodeError:
            return _NotFound()
        if not rest or rest == [b""]:
            request.postpath = []
            return DevicePage(self._services, name)
        action = ACTIONS.get(rest[0])
        if action is None:
            return _NotFound()
        request.postpath = []
        found: resource.Resource = action(self._services, name)
        return found

    def render(self, request: IRequest) -> bytes:
        return errorPage(request, http.NOT_FOUND, "not found: name a device")


class DevicePage(Endpoint):
    """C{GET /devices/NAME}."""

    isLeaf = True

    def __init__(self, services: DeviceServices, name: str) -> None:
        super().__init__()
        self._services = services
        self._name = name

    def render_GET(self, request: IRequest) -> int:
        async def work() -> Page:
            report = await deviceReport(self._services, self._name)
            return Page("device.html", await self._context(report))

        return renderPageAsync(request, work)

    async def _context(self, report: DeviceReport) -> dict[str, Any]:
        doc = report.toJSON()
        device = report.device
        name = device.name
        retired = device.status is DeviceStatus.DECOMMISSIONING
        return {
            "name": name,
            "device": doc["device"],
            "headline": headline(doc),
            "rows": statusRows(doc, journal=False),
            "alerts": doc["alerts"],
            "recovery": doc["recovery"],
            "run": doc["run"],
            "journal": [_entry(e) for e in doc["journal"]],
            "pending": [
                {
                    "id": view.id,
                    "peer": view.peer,
                    "created_at": view.created_at,
                    "expires_at": view.expires_at,
                    "reported": [
                        (k, view.reported[k]) for k in REPORTED if k in view.reported
                    ],
                }
                for view in pendingFor(self._services, name)
            ],
            "provisionable": not retired and device.device_class not in REFUSED_CLASSES,
            "retirable": not retired,
            "approval": await self._approval(report),
        }

    async def _approval(self, report: DeviceReport) -> dict[str, Any]:
        """
        Whether the page offers to approve the EK binding: only when an
        approval would approve (L{TrustService.decision}) something other
        than the binding that holds now; else the line saying why not.
        """
        try:
            decision = await self._services.trust.decision(report.device.serial)
        except TrustError as e:
            return {"offer": False, "why": str(e)}
        if decision.code is not None:
            return {"offer": False, "why": decision.reason}
        binding = None if report.trust is None else report.trust.binding
        if (
            binding is not None
            and binding.state == "approved"
            and binding.ek_sha256 == decision.ek
        ):
            return {"offer": False, "why": None}
        return {"offer": True, "why": None}


def _entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A journal entry's cells: the words of L{fleetd.statuswords.formatEntry}."""
    parts = entryParts(entry)
    return {
        "seq": parts[0].strip(),
        "at": parts[1],
        "event": parts[2],
        "actor": parts[3],
        "details": parts[4:],
    }
