"""
The fleet at a glance (the owner console's C{/}, issue 20 item 2): every
device with its status, class, cluster, latest run and that run's state
and its open alerts in words, filtered by status and cluster, searched by
name, serial or MAC, and cut into pages; and the device-flow requests
waiting for the owner.

L{FleetView} knows nothing of HTTP. What one page costs: one listing of
the inventory (on the database thread, or from NetBox), one pass over it
in the reactor thread to filter (under 2 ms at 10,000 devices on an idle
core: C{bench/console_render.py}), and, for the rows of that page only, runs
and alerts from memory and one database read for devices whose runs all
ended (L{fleetd.runs.index.BootIndex.views}), and one for the page's
standing refused attestations (issue 27: L{AttestRefusals}, shown first
among a row's alerts as L{ATTESTATION_REFUSED}, with when, why and the
step back), plus one more when one of them awaits the owner's evidence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from fleetd.deviceflow.flow import DeviceFlow
from fleetd.deviceflow.model import RequestView
from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    IInventory,
    InventoryError,
    validateStatus,
    validateToken,
)
from fleetd.runs.alerts import ATTESTATION_REFUSED, AlertTracker, alertWords
from fleetd.runs.index import RunView
from fleetd.runs.registry import RunRegistry
from fleetd.statuswords import refusalWords, when
from fleetd.trust.refusals import AttestRefusals

PAGE_SIZE = 100
MAX_SEARCH = 64  # a serial's longest; a MAC or a name is shorter
MAX_PAGE = 10**6
PENDING_SHOWN = 50
# A search that may be part of a MAC: hex digits and the separators.
_MAC_PART = re.compile(r"[0-9a-f:.-]*[0-9a-f][0-9a-f:.-]*")


class FleetQueryError(Exception):
    """A filter, search or page number refused, in one line."""


@dataclass(frozen=True)
class FleetQuery:
    """What the owner asked to see: filters, search and page (from 1)."""

    status: DeviceStatus | None = None
    cluster: str | None = None
    search: str = ""
    page: int = 1


def fleetQuery(
    status: str | None = None,
    cluster: str | None = None,
    search: str | None = None,
    page: str | None = None,
) -> FleetQuery:
    """
    A L{FleetQuery} from the text of a request's fields (empty or absent
    means no filter, and page 1).

    @raise FleetQueryError: a field is not what it should be.
    """
    try:
        wanted = validateStatus(status) if status else None
        where = validateToken("cluster", cluster) if cluster else None
    except InventoryError as e:
        raise FleetQueryError(str(e)) from None
    text = (search or "").strip()
    if len(text) > MAX_SEARCH:
        raise FleetQueryError(f"search: at most {MAX_SEARCH} characters")
    number = 1
    if page:
        if not page.isascii() or not page.isdigit() or len(page) > 7:
            raise FleetQueryError(f"page: {page[:20]!r} is not a page number")
        number = int(page)
        if not 1 <= number <= MAX_PAGE:
            raise FleetQueryError(f"page: {number} is not a page number")
    return FleetQuery(wanted, where, text, number)


@dataclass(frozen=True)
class FleetAlert:
    """An open alert: its name (as Prometheus has it) and what it means."""

    name: str
    words: str


@dataclass(frozen=True)
class FleetRow:
    """One device as the fleet view shows it; no code, no body."""

    device: Device
    run: RunView | None
    alerts: tuple[FleetAlert, ...]


@dataclass(frozen=True)
class PendingRequest:
    """
    A device-flow request awaiting the owner, named by its public id:
    without the node's code or its user code (the owner proves presence
    by typing the code the node shows, RFC 8628 section 5.4).
    """

    id: str
    serial: str | None
    uuid: str | None
    mac: str | None
    peer: str
    known: str | None
    age: float


@dataclass(frozen=True)
class FleetPage:
    """
    One page of the fleet: C{rows} of the C{matching} devices (of
    C{total}), page C{page} of C{pages}; the clusters the inventory
    names, and the first L{PENDING_SHOWN} of C{pendingCount} requests.
    """

    query: FleetQuery
    rows: tuple[FleetRow, ...]
    total: int
    matching: int
    page: int
    pages: int
    clusters: tuple[str, ...]
    pending: tuple[PendingRequest, ...]
    pendingCount: int
    listedAt: float | None = None


@dataclass(frozen=True)
class Search:
    """
    A search as it is compared: C{text} case-folded, for names and
    serials; C{mac}, for MACs (L{None}: the search cannot be part of
    one), in the colon form the inventory keeps (C{aa:bb}, C{aa-bb}) or,
    when C{compact}, among a MAC's hex digits (C{aabb}, C{aabb.cc}).
    """

    text: str
    mac: str | None
    compact: bool

    @classmethod
    def of(cls, search: str) -> Search:
        folded = search.casefold()
        if _MAC_PART.fullmatch(folded) is None:
            return cls(folded, None, False)
        if ":" in folded or "-" in folded:
            return cls(folded, folded.replace("-", ":"), False)
        return cls(folded, folded.replace(".", ""), True)

    def matches(self, device: Device) -> bool:
        """Whether C{device}'s name, serial or a MAC contains the search."""
        if self.text in device.name or self.text in device.serial.casefold():
            return True
        mac = self.mac
        if mac is None:
            return False
        # One string of them all: a search has no space, so it cannot
        # span two MACs.
        macs = " ".join(device.macs)
        return mac in (macs.replace(":", "") if self.compact else macs)


def select(
    devices: Sequence[Device], query: FleetQuery
) -> tuple[list[Device], tuple[str, ...]]:
    """
    The devices C{query} matches, in their order, and every cluster
    named: one pass, in the reactor thread (a few milliseconds at 10,000).
    """
    clusters = {d.cluster for d in devices if d.cluster is not None}
    found: Sequence[Device] = devices
    if query.status is not None:
        found = [d for d in found if d.status is query.status]
    if query.cluster is not None:
        found = [d for d in found if d.cluster == query.cluster]
    if query.search:
        search = Search.of(query.search)
        found = [d for d in found if search.matches(d)]
    return list(found), tuple(sorted(clusters))


def refusalAlerts(refusal: dict[str, Any] | None) -> tuple[FleetAlert, ...]:
    """A standing refused attestation as the fleet view shows it (issue 27)."""
    if refusal is None:
        return ()
    words = (
        f"{alertWords(ATTESTATION_REFUSED)} at {when(refusal['at'])}:"
        f" {refusalWords(refusal)}; step back: {refusal['step']}"
    )
    return (FleetAlert(ATTESTATION_REFUSED, words),)


def pendingRequest(view: RequestView, now: float) -> PendingRequest:
    """What the fleet view shows of a request: never a code of it."""
    reported = view.reported
    return PendingRequest(
        id=view.id,
        serial=reported.get("serial"),
        uuid=reported.get("uuid"),
        mac=reported.get("mac"),
        peer=view.peer,
        known=view.known,
        age=max(0.0, now - view.created_at),
    )


class FleetView:
    """Pages of the fleet, read from the inventory, runs, alerts and flow."""

    def __init__(
        self,
        inventory: IInventory,
        runs: RunRegistry,
        alerts: AlertTracker,
        deviceFlow: DeviceFlow,
        clock: IReactorTime,
        pageSize: int = PAGE_SIZE,
        listingAge: float = 0.0,
        refusals: AttestRefusals | None = None,
    ) -> None:
        """
        @param listingAge: seconds a listing of the inventory may serve
            later pages. 0 for the SQLite inventory, whose own listing is
            kept until it changes; more for NetBox, where a listing is a
            walk of NetBox's pages (then the page says when it was read).
            Pages asked for while a listing is read share that one read.
        @param refusals: the standing refused attestations (L{None}: none).
        """
        self._refusals = refusals
        self._listingAge = listingAge
        self._listed: tuple[float, list[Device]] | None = None
        self._reading: list[Deferred[tuple[float, list[Device]]]] | None = None
        self._inventory = inventory
        self._runs = runs
        self._alerts = alerts
        self._deviceFlow = deviceFlow
        self._clock = clock
        self.pageSize = pageSize

    async def page(self, query: FleetQuery) -> FleetPage:
        """
        Page C{query.page} of the devices C{query} selects.

        @raise FleetQueryError: that page is past the last one.
        @raise InventoryError: the inventory cannot be read.
        """
        listedAt, devices = await self._listing()
        page = await self.pageOf(devices, query)
        if self._listingAge > 0:
            page = replace(page, listedAt=listedAt)
        return page

    def _listing(self) -> Deferred[tuple[float, list[Device]]]:
        """The inventory's listing and when it was read, shared (see init)."""
        now = self._clock.seconds()
        if self._listed is not None and now - self._listed[0] < self._listingAge:
            return succeed(self._listed)
        waiter: Deferred[tuple[float, list[Device]]] = Deferred()
        if self._reading is not None:
            self._reading.append(waiter)
            return waiter
        self._reading = waiters = [waiter]

        def done(result: list[Device] | Failure) -> None:
            self._reading = None
            if isinstance(result, Failure):
                for w in waiters:
                    w.errback(result)
                return
            self._listed = (now, result)
            for w in waiters:
                w.callback(self._listed)

        self._inventory.list().addBoth(done)
        return waiter

    async def pageOf(self, devices: Sequence[Device], query: FleetQuery) -> FleetPage:
        """L{page} over C{devices}, an inventory listing (by name)."""
        found, clusters = select(devices, query)
        pages = max(1, math.ceil(len(found) / self.pageSize))
        if query.page > pages:
            raise FleetQueryError(f"page: {query.page} is past the last page ({pages})")
        start = (query.page - 1) * self.pageSize
        shown = found[start : start + self.pageSize]
        runs = await self._runs.views([d.name for d in shown])
        refused = {} if self._refusals is None else await self._refusals.standing(shown)
        rows = tuple(
            FleetRow(
                d,
                runs.get(d.name),
                refusalAlerts(refused.get(d.name))
                + tuple(
                    FleetAlert(name, alertWords(name))
                    for name in self._alerts.openFor(d.name)
                ),
            )
            for d in shown
        )
        now = self._clock.seconds()
        waiting = self._deviceFlow.pending()
        return FleetPage(
            query=query,
            rows=rows,
            total=len(devices),
            matching=len(found),
            page=query.page,
            pages=pages,
            clusters=clusters,
            pending=tuple(pendingRequest(v, now) for v in waiting[:PENDING_SHOWN]),
            pendingCount=len(waiting),
        )
