"""
C{POST /v1/node/disks} on the device listener [D1] [A3].

The node (identified by its LDevID through the injected L{Identify})
sends its disk report (L{fleetd.trust.disk_report}); fleetd judges and
records it (L{fleetd.trust.disks.DiskService}). Answers:

  - 200 C{{"device", "target": {...}, "refused": null, "reason": null}};
  - 409 C{"duplicate-disk-serial: ..."}, C{"disk-serial-missing: ..."}
    or C{"no-target-disk: ..."}: one line, the reason code first;
  - 400 a malformed report, 403 no node identity or C{"device-retired:
    ..."} (a device being decommissioned is not checked [R1]; with the
    injected C{admit}), 503 the report could not be recorded (nothing
    changed). Always one line of text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.device.identity import Identify
from fleetd.device.refusals import nodeRefusal
from fleetd.nodes import NodeIdentity
from fleetd.trust.disk_report import DiskReportError, parseDiskReport
from fleetd.trust.disks import DiskService
from fleetd.web.resources import Endpoint, renderAsync, textResponse

NO_IDENTITY = (
    "node identity required: present this node's LDevID client certificate"
    " (fleetd-agent attest first)"
)


class _Refused(Exception):
    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code


def _refusal(error: Exception) -> tuple[int, str] | None:
    if isinstance(error, _Refused):
        return error.code, str(error)
    if isinstance(error, DiskReportError):
        return http.BAD_REQUEST, f"disk report: {error}"
    return nodeRefusal(error)


class NodeDisksResource(Endpoint):
    """C{POST /v1/node/disks}: the calling node's disk report."""

    isLeaf = True

    def __init__(
        self,
        service: DiskService,
        identify: Identify,
        admit: Callable[[NodeIdentity], Awaitable[object]] | None = None,
    ) -> None:
        """
        @param admit: checks the node's device before its report is judged,
            raising L{Refused} (journaled by it) for one that may not report,
            such as a device being decommissioned [R1].
        """
        super().__init__()
        self._service = service
        self._identify = identify
        self._admit = admit

    def render_POST(self, request: IRequest) -> bytes | int:
        identity = self._identify(request)
        if identity is None:
            return textResponse(request, http.FORBIDDEN, NO_IDENTITY)
        content = request.content
        raw = b"" if content is None else content.read()

        async def work() -> tuple[int, Any]:
            if self._admit is not None:
                await self._admit(identity)
            disks = parseDiskReport(raw)
            verdict = await self._service.report(identity, disks)
            if verdict.code is not None:
                raise _Refused(http.CONFLICT, verdict.line)
            return http.OK, verdict.toJSON()

        return renderAsync(request, work, _refusal)
