"""
C{/device}: the RFC 8628 verification page [F3] (issue 20 item 1).

A Talos node running the device flow shows a user code, the
C{verification_uri} (this page) and a QR code of
C{verification_uri_complete} (this page with C{?user_code=...}).

  - C{GET /device}: the lookup form (an input C{user_code}) and the pending
    requests, oldest first; while one waits the page reloads every 10 s.
  - C{GET /device?user_code=...[&device=NAME]}: the request looked up
    without deciding it (L{DeviceFlow.lookup}: an unknown code spends the
    same failed-attempt budget as a decision, so the page is no guessing
    oracle, RFC 8628 section 5.1), what the node reported beside the
    chosen device's inventory record (by default the device whose uuid
    and serial the node reported), differences marked.
  - C{POST /device} with C{user_code}, C{device} and C{action}
    (C{approve} or C{deny}): the decision, through the same
    L{DeviceFlow.approve} and L{DeviceFlow.deny} as C{fleetctl approve},
    journaled by the viewer with C{via=console}. Approving a mismatch is
    a second step: a post without the box C{confirm_mismatch} and the
    differences it accepts (C{accept_mismatch}, hidden fields of the 409
    page) is refused (409) with the differences explained, the box shown
    and those fields in its form; with both, exactly the accepted fields
    are the approval's C{acceptMismatch}, which the flow compares again
    (a record that changed since the 409 is refused) and journals as forced.

A reader [O4] sees the pending requests only: a lookup spends from the
same failed-attempt budget as the owners' decisions (overall as well as
per name), so it is refused (403) before it spends, and the gate refuses
a reader's decision.

What the node reported and what the inventory holds are rendered as text
(autoescape). The node's one-time C{code} is never rendered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd.admin.console.page import (
    Page,
    errorPage,
    formValue,
    formValues,
    renderPageAsync,
    viewerOf,
)
from fleetd.admin.readers import readerLookup
from fleetd.admin.refusals import lineOf, statusOf
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.deviceflow.model import DeviceFlowError, RequestView, differences
from fleetd.inventory.model import Device, IInventory, InventoryError, validateMAC
from fleetd.refused import FORBIDDEN, MALFORMED, Refused
from fleetd.web.resources import Endpoint

VIA = "console"
SECOND_STEP = "differs: approving needs a second step"
REFRESH = 10  # seconds between reloads of the page listing pending requests
# Sec-Fetch-Site values of a lookup the page answers: typed or opened from
# a QR code (none), or a link on the console (same-origin); absent for
# clients that do not send it. A lookup another site's page makes the
# browser send (an image, a link) could spend the owner's budget.
LOOKUP_SITES = frozenset({"", "none", "same-origin"})
HINTS: Mapping[str, str] = {
    "unknown-user-code": (
        "check the code on the node's console: each unknown code counts"
        " against a small budget of attempts"
    ),
    "expired": "the node must start the device flow again",
    "too-many-attempts": "wait, then type the code again",
    "already-decided": "a request is decided once",
    "being-decided": "another owner is deciding it; look again in a moment",
    "not-recorded": "nothing changed; try again",
}


@dataclass(frozen=True)
class Row:
    """
    One line of the comparison: what the node reported beside what the
    inventory holds (L{None}: not reported, or not a field of the other
    side), and whether it differs (with a word on what follows).
    """

    label: str
    reported: str | None
    inventory: str | None
    differs: bool = False
    note: str = ""
    fromNode: bool = True


def macAmong(reported: str, macs: tuple[str, ...]) -> bool:
    """Whether the MAC a node reported is one of the record's C{macs}."""
    try:
        return validateMAC(reported) in macs
    except InventoryError:
        return False


def comparison(view: RequestView, record: Device | None) -> list[Row]:
    """
    The rows of C{view} beside C{record}: uuid and serial (a difference
    needs the second step), the MAC (marked when it is not among the
    record's, for information), the hostname beside the device's name, and
    the record's class, cluster and status. Never the node's C{code}.
    """
    reported = view.reported
    if record is None:
        return [
            Row(label, reported.get(name), None)
            for name, label in (
                ("uuid", "UUID"),
                ("serial", "Serial"),
                ("mac", "MAC"),
                ("hostname", "Hostname"),
            )
        ]
    differ = differences(reported, (record.uuid, record.serial))
    mac = reported.get("mac")
    macDiffers = mac is not None and not macAmong(mac, record.macs)

    def compared(name: str, label: str, known: str) -> Row:
        if name in differ:
            return Row(label, reported.get(name), known, True, SECOND_STEP)
        return Row(label, reported.get(name), known, note="same")

    return [
        compared("uuid", "UUID", record.uuid),
        compared("serial", "Serial", record.serial),
        Row(
            "MAC",
            mac,
            ", ".join(record.macs) or "none recorded",
            macDiffers,
            "not among the record's MACs (for information)" if macDiffers else "",
        ),
        Row("Hostname / name", reported.get("hostname"), record.name),
        Row("Class", None, record.device_class, fromNode=False),
        Row("Cluster", None, record.cluster or "none", fromNode=False),
        Row("Status", None, str(record.status), fromNode=False),
    ]


def _refusal(e: Exception) -> tuple[int, str] | None:
    if isinstance(e, DeviceFlowError):
        hint = HINTS.get(e.kind)
        return statusOf(e), lineOf(e) + ("" if hint is None else f" ({hint})")
    return None


class VerifyPage(Endpoint):
    """C{/device} (behind the console gate): lookup, comparison, decision."""

    isLeaf = True

    def __init__(self, flow: DeviceFlow, inventory: IInventory) -> None:
        super().__init__()
        self._flow = flow
        self._inventory = inventory

    def render_GET(self, request: IRequest) -> int | bytes:
        if request.postpath:
            return errorPage(request, http.NOT_FOUND, "not found")
        return renderPageAsync(request, lambda: self._show(request), _refusal)

    def render_POST(self, request: IRequest) -> int | bytes:
        if request.postpath:
            return errorPage(request, http.NOT_FOUND, "not found")
        return renderPageAsync(request, lambda: self._decide(request), _refusal)

    async def _show(self, request: IRequest) -> Page:
        userCode = formValue(request, "user_code", "") or ""
        if not userCode.strip():
            return Page("verify.html", self._landing())
        viewer = viewerOf(request)
        if not viewer.canChange:  # a lookup spends the owners' attempt budget
            raise Refused(FORBIDDEN, readerLookup(viewer.owner))
        site = request.getHeader(b"sec-fetch-site")
        if (b"" if site is None else bytes(site)).decode("latin-1") not in LOOKUP_SITES:
            raise Refused(
                FORBIDDEN,
                "a lookup opened from another site is refused: type the user"
                " code on this page, or open the node's link directly",
            )
        view = self._flow.lookup(userCode, viewerOf(request).owner)
        chosen = formValue(request, "device", "") or view.known or ""
        return await self._compared(view, chosen.strip())

    def _landing(self) -> dict[str, Any]:
        pending = self._flow.pending()
        return {
            "pending": pending,
            "refresh": REFRESH if pending else None,
            "view": None,
        }

    async def _compared(
        self, view: RequestView, chosen: str, step: bool = False
    ) -> Page:
        """
        The comparison of C{view} with the device named C{chosen}; C{step}:
        the refused first approval of a mismatch (409, with the box).
        """
        record = await self._inventory.get(chosen) if chosen else None
        differ: tuple[str, ...] = ()
        if record is not None:
            differ = differences(view.reported, (record.uuid, record.serial))
        context = {
            "pending": [],
            "refresh": None,
            "view": view,
            "chosen": chosen,
            "record": record,
            "rows": comparison(view, record),
            "differ": differ,
            "step": step,
        }
        if step:
            return Page("verify.html", context, http.CONFLICT)
        return Page("verify.html", context, http.OK if record or not chosen else 404)

    async def _decide(self, request: IRequest) -> Page:
        owner = viewerOf(request).owner
        action = formValue(request, "action")
        userCode = formValue(request, "user_code", "") or ""
        if action not in ("approve", "deny"):
            raise Refused(MALFORMED, "action: approve or deny")
        if not userCode.strip():
            raise Refused(MALFORMED, "user_code: type the node's user code")
        if action == "deny":
            view = await self._flow.deny(userCode, owner, via=VIA)
            return Page("verify_done.html", {"view": view, "forced": ()})
        name = (formValue(request, "device", "") or "").strip()
        if not name:
            raise Refused(MALFORMED, "device: name the inventory device to approve as")
        view = self._flow.lookup(userCode, owner)
        record = await self._inventory.get(name)
        if record is None:
            raise DeviceFlowError(
                "unknown-device", f"{name} is no device of the inventory"
            )
        differ = differences(view.reported, (record.uuid, record.serial))
        # The second step's form carries the differences its 409 page
        # showed (accept_mismatch) beside the ticked box; the flow compares
        # them again with the record as it is now.
        accepted = tuple(formValues(request, "accept_mismatch"))
        confirmed = bool(formValue(request, "confirm_mismatch"))
        if differ and not (confirmed and accepted):
            return await self._compared(view, record.name, step=True)
        forced = accepted if confirmed else ()
        view = await self._flow.approve(
            userCode, record.name, owner, acceptMismatch=forced, via=VIA
        )
        return Page("verify_done.html", {"view": view, "forced": forced})


def verifyPage(flow: DeviceFlow, inventory: IInventory) -> resource.Resource:
    """C{/device} over C{flow} and C{inventory} (to be put behind the gate)."""
    return VerifyPage(flow, inventory)
