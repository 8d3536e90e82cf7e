"""C{GET /v1/admin/status/NAME}: L{fleetd.fleet.status.StatusService} as JSON."""

from __future__ import annotations

from typing import Any

from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd.fleet.status import StatusService
from fleetd.inventory.model import InventoryError
from fleetd.web.refusals import inventoryRefusal
from fleetd.web.resources import Endpoint, notFound, renderAsync


class _NotFound(Exception):
    pass


class DeviceStatusResource(Endpoint):
    isLeaf = True

    def __init__(self, service: StatusService, name: str) -> None:
        super().__init__()
        self._service = service
        self._name = name

    def render_GET(self, request: IRequest) -> int:
        async def work() -> tuple[int, Any]:
            report = await self._service.report(self._name)
            if report is None:
                raise _NotFound(f"no device named {self._name}")
            return http.OK, report.toJSON()

        def refusal(error: Exception) -> tuple[int, str] | None:
            if isinstance(error, _NotFound):
                return http.NOT_FOUND, str(error)
            if isinstance(error, InventoryError):
                return inventoryRefusal(error)
            return None

        return renderAsync(request, work, refusal)


class StatusResource(resource.Resource):
    """C{/v1/admin/status/}: one child per device name."""

    def __init__(self, service: StatusService) -> None:
        super().__init__()
        self._service = service

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        try:
            name = path.decode("ascii")
        except UnicodeDecodeError:
            return notFound()
        if not name or request.postpath:
            return notFound()
        return DeviceStatusResource(self._service, name)
