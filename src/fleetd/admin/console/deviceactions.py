"""
The owner actions of a device's console page (issue 20 item 3).

Each action is two steps at C{/devices/NAME/ACTION}: C{GET} shows a
confirmation page and changes nothing (a reader gets a 403 page instead:
the device page offers readers no action [O4]); its form C{POST}s to the same
path (the console gate has checked the form's CSRF token by then), which
makes the change through the owner API's own service call, journaled
with the viewer's actor and C{via="console"}, and shows the outcome. A
refusal is the owner API's status and line, and nothing changes.

  - C{provision}: a new run (L{Provisioner}); its code is on that
    response only, never in a page, a link or a URL;
  - C{approve-binding}: the EK binding [T1], offered when the evidence
    allows it and pinned to the EK the confirmation showed;
  - C{deny}: a pending device-flow request of this device, named by its
    public id (its user code never leaves the server);
  - C{retire}: confirmed by typing the device's name [R1].
"""

from __future__ import annotations

from typing import Any, Protocol

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.admin.console.page import (
    Page,
    Viewer,
    errorPage,
    formValue,
    renderPageAsync,
    viewerOf,
)
from fleetd.admin.readers import readerPage
from fleetd.admin.refusals import (
    decisionRefusal,
    kubeRefusal,
    ownerRefusal,
    trustRefusal,
)
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.deviceflow.model import RequestView
from fleetd.fleet.provision import Provisioner
from fleetd.fleet.retire import RetireService
from fleetd.fleet.status import DeviceReport, StatusService
from fleetd.inventory.model import InventoryError, validateName
from fleetd.refused import CONFLICT, NOT_FOUND, STALE, UNCONFIRMED, Refused
from fleetd.statuswords import (
    RETIRE_ADVICE,
    approvalLine,
    retirementRows,
    trustRows,
)
from fleetd.trust.service import TrustService
from fleetd.web.resources import Endpoint

VIA = "console"
MAX_ECHO = 64  # of a mistyped confirmation, shown back


class DeviceServices(Protocol):
    """What the device page reads and changes through (L{ConsoleServices})."""

    @property
    def status(self) -> StatusService: ...

    @property
    def trust(self) -> TrustService: ...

    @property
    def deviceFlow(self) -> DeviceFlow: ...

    @property
    def retire(self) -> RetireService: ...

    @property
    def provisioner(self) -> Provisioner: ...


async def deviceReport(services: DeviceServices, name: str) -> DeviceReport:
    """C{name}'s status report; L{Refused} (404) when there is no such device."""
    try:
        wanted = validateName(name)
    except InventoryError:
        raise Refused(NOT_FOUND, f"no device named {name[:MAX_ECHO]}") from None
    report = await services.status.report(wanted)
    if report is None:
        raise Refused(NOT_FOUND, f"no device named {wanted}")
    return report


def pendingFor(services: DeviceServices, name: str) -> list[RequestView]:
    """The undecided device-flow requests whose node reported C{name}'s identity."""
    return [v for v in services.deviceFlow.pending() if name in (v.known, v.device)]


class _Action(Endpoint):
    """GET: the confirmation page; POST: the change and its outcome."""

    isLeaf = True

    def __init__(self, services: DeviceServices, name: str) -> None:
        super().__init__()
        self._services = services
        self._name = name

    def render_GET(self, request: IRequest) -> int | bytes:
        viewer = viewerOf(request)
        if not viewer.canChange:  # its post would be refused [O4]
            return errorPage(request, http.FORBIDDEN, readerPage(viewer.owner))

        async def work() -> Page:
            report = await deviceReport(self._services, self._name)
            return await self.confirm(request, report)

        return renderPageAsync(request, work, self.refusal)

    def render_POST(self, request: IRequest) -> int:
        viewer = viewerOf(request)

        async def work() -> Page:
            report = await deviceReport(self._services, self._name)
            return await self.act(request, report, viewer)

        return renderPageAsync(request, work, self.refusal)

    async def confirm(self, request: IRequest, report: DeviceReport) -> Page:
        raise NotImplementedError

    async def act(
        self, request: IRequest, report: DeviceReport, viewer: Viewer
    ) -> Page:
        raise NotImplementedError

    @staticmethod
    def refusal(error: Exception, /) -> tuple[int, str] | None:
        """The owner API's status and line for C{error} (L{None}: a bug)."""
        return None


def _done(name: str, title: str, **context: Any) -> Page:
    """An outcome page: C{headline}, C{rows} and C{lines} as given."""
    base: dict[str, Any] = {"headline": None, "rows": [], "lines": []}
    return Page("device-done.html", base | context | {"name": name, "title": title})


class Provision(_Action):
    """
    Provision again. The confirmation names the run it supersedes, and
    the form carries that run's id: when another run started meanwhile
    the provision is refused (409, compared in the transaction that starts
    the run), so a second tab, a double click or a resent form never
    supersedes a run its owner has not seen.
    """

    refusal = staticmethod(ownerRefusal)

    async def confirm(self, request: IRequest, report: DeviceReport) -> Page:
        run = report.run
        return Page(
            "device-provision.html",
            {
                "name": report.device.name,
                "run": None if run is None else run.record.id,
                "state": None if run is None else run.state,
            },
        )

    async def act(
        self, request: IRequest, report: DeviceReport, viewer: Viewer
    ) -> Page:
        name = report.device.name
        seen = formValue(request, "run", "") or ""
        current = "" if report.run is None else report.run.record.id
        if seen != current:
            raise Refused(
                STALE,
                f"{name}'s latest run is {current or 'none'} now, not"
                f" {seen[:MAX_ECHO] or 'none'}: confirm again; nothing was provisioned",
            )
        # Compared again where the run starts: a second submit of this
        # confirmation (a double click) finds the first one's run there.
        (run,) = await self._services.provisioner.provision(
            [name], viewer.actor, via=VIA, supersedes={name: current or None}
        )
        return Page(
            "device-provisioned.html",
            {"name": name, "run": run.run, "code": run.code, "superseded": current},
        )


class ApproveBinding(_Action):
    """Approve the EK binding of the device's serial [T1]."""

    refusal = staticmethod(trustRefusal)

    async def confirm(self, request: IRequest, report: DeviceReport) -> Page:
        serial = report.device.serial
        decision = await self._services.trust.decision(serial)
        if decision.code is not None:
            raise Refused(CONFLICT, decision.reason)
        trust = None if report.trust is None else report.trust.toJSON()
        return Page(
            "device-binding.html",
            {
                "name": report.device.name,
                "serial": serial,
                "ek": decision.ek,
                "evidence": decision.evidenceId,
                "rows": trustRows(trust),
            },
        )

    async def act(
        self, request: IRequest, report: DeviceReport, viewer: Viewer
    ) -> Page:
        approval = await self._services.trust.approve(
            report.device.serial,
            actor=viewer.actor,
            ek=formValue(request, "ek_sha256") or None,
            via=VIA,
        )
        line = approvalLine(approval.toJSON())
        return _done(report.device.name, "EK binding", lines=[line])


class DenyRequest(_Action):
    """Deny one of the device's pending device-flow requests."""

    refusal = staticmethod(decisionRefusal)

    def _pending(self, request: IRequest, name: str) -> RequestView:
        wanted = formValue(request, "request") or ""
        for view in pendingFor(self._services, name):
            if view.id == wanted:
                return view
        raise Refused(
            NOT_FOUND,
            f"no pending device-flow request {wanted[:MAX_ECHO] or '(none named)'}"
            f" for {name}: it was decided or has expired",
        )

    async def confirm(self, request: IRequest, report: DeviceReport) -> Page:
        name = report.device.name
        view = self._pending(request, name)
        reported = [(k, view.reported[k]) for k in REPORTED if k in view.reported]
        return Page(
            "device-deny.html",
            {
                "name": name,
                "requestID": view.id,
                "peer": view.peer,
                "created_at": view.created_at,
                "reported": reported,
            },
        )

    async def act(
        self, request: IRequest, report: DeviceReport, viewer: Viewer
    ) -> Page:
        name = report.device.name
        view = self._pending(request, name)
        denied = await self._services.deviceFlow.deny(
            view.user_code, viewer.owner, via=VIA
        )
        line = f"denied request {denied.id} from {denied.peer}: its node stops asking"
        return _done(name, "Request denied", lines=[line])


class Retire(_Action):
    """Retire the device, once its name is typed [R1]."""

    refusal = staticmethod(kubeRefusal)

    async def confirm(self, request: IRequest, report: DeviceReport) -> Page:
        device = report.device
        return Page(
            "device-retire.html",
            {
                "name": device.name,
                "serial": device.serial,
                "deviceStatus": device.status.value,
            },
        )

    async def act(
        self, request: IRequest, report: DeviceReport, viewer: Viewer
    ) -> Page:
        name = report.device.name
        typed = (formValue(request, "confirm_name") or "").strip()
        if typed.lower() != name:  # as fleetctl retire asks at a terminal
            raise Refused(
                UNCONFIRMED,
                f"retire: not confirmed ({typed[:MAX_ECHO] or 'nothing'} typed,"
                f" not {name}); nothing changed",
            )
        doc = (await self._services.retire.retire(name, viewer.actor, via=VIA)).toJSON()
        return _done(
            name,
            "Retired",
            headline=f"{doc['device']}  {doc['status']}",
            rows=retirementRows(doc),
            lines=[RETIRE_ADVICE],
        )


# What a pending request's node reported that a page may show (never its code).
REPORTED = ("uuid", "serial", "mac", "hostname")

ACTIONS: dict[bytes, type[_Action]] = {
    b"provision": Provision,
    b"approve-binding": ApproveBinding,
    b"deny": DenyRequest,
    b"retire": Retire,
}
