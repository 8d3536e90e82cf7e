"""
C{/}: the fleet view (issue 20 item 2).

Every device with its status, class, cluster, latest run and that run's
state as the run machine names it, and its open alerts in words; the
device-flow requests waiting for the owner. Filters (C{status},
C{cluster}), a search (C{q}: name, serial or MAC) and the page number
(C{page}) come in the query string; the rows come from
L{fleetd.fleet.view.FleetView}, which the admin API's services feed.
"""

from __future__ import annotations

from typing import Any

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.admin.console.page import Page, formValue, renderPageAsync
from fleetd.fleet.view import FleetQueryError, FleetView, fleetQuery
from fleetd.inventory.model import DeviceStatus, InventoryError
from fleetd.refused import MALFORMED, Refused
from fleetd.web.resources import Endpoint

# The page reloads itself this often while a device-flow request waits
# (a node's request lives minutes); otherwise the owner reloads it.
PENDING_REFRESH = 15


def _refusal(error: Exception) -> tuple[int, str] | None:
    if isinstance(error, FleetQueryError):
        return http.BAD_REQUEST, str(error)
    if isinstance(error, InventoryError) and error.kind == "unavailable":
        return http.SERVICE_UNAVAILABLE, f"the inventory cannot be read: {error}"
    return None


class Fleet(Endpoint):
    """C{GET /?status=&cluster=&q=&page=}: one page of the fleet."""

    isLeaf = True

    def __init__(self, view: FleetView) -> None:
        super().__init__()
        self._view = view

    def render_GET(self, request: IRequest) -> Any:
        async def work() -> Page:
            try:
                query = fleetQuery(
                    formValue(request, "status"),
                    formValue(request, "cluster"),
                    formValue(request, "q"),
                    formValue(request, "page"),
                )
            except FleetQueryError as e:
                raise Refused(MALFORMED, str(e)) from None
            fleet = await self._view.page(query)
            return Page(
                "fleet.html",
                {
                    "fleet": fleet,
                    "statuses": [s.value for s in DeviceStatus],
                    "refresh": PENDING_REFRESH if fleet.pendingCount else None,
                },
            )

        return renderPageAsync(request, work, _refusal)
