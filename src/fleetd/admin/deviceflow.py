"""
The admin listener's side of the device flow: the owner's API and the
verification page's address.

Under C{/v1/admin/device-flow} (behind the owner gate):

  - C{GET}: C{{"pending": [...]}}, undecided requests, oldest first;
  - C{POST .../approve} C{{"user_code": "...", "device": "...",
    "accept_mismatch": ["serial"]}} (the last member only to approve
    despite a uuid/serial mismatch) and C{POST .../deny}
    C{{"user_code": "..."}}: the request as JSON, once journaled.

Refusals are one line of text, C{KIND: message}: 400 invalid, 404 unknown
user code or device, 409 already (or being) decided, no ready run or
mismatch, 410 expired, 429 too many failed attempts, 503 not recorded
(the journal refused the decision; nothing changed).

C{/device} is the C{verification_uri} Talos shows [F3], the owner
console's verification page (L{fleetd.admin.console.verify}), which
decides through the same L{DeviceFlow} calls as this API and answers its
refusals alike (L{fleetd.admin.refusals}). L{verificationURI} derives its
address from the admin listener's bound port.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd import jsonbody
from fleetd.admin.refusals import decisionRefusal, lineOf, statusOf
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.deviceflow.model import COMPARED, DeviceFlowError, RequestView
from fleetd.jsonbody import JSONBodyError
from fleetd.web.owner import OwnerOf, ownerOf
from fleetd.web.resources import (
    Endpoint,
    jsonResponse,
    notFound,
    renderAsync,
    textResponse,
)

log = Logger()


def adminBase(host: str, port: int | None) -> str:
    """
    C{https://<host>[:port]}, the admin listener bound to C{port} as a
    browser reaches it by C{host}: the enrollment name, which the public
    certificate covers, unless the site names another (C{owner.console_host},
    e.g. C{localhost} on the dev config). The port is the listener's own
    (left out when 443). A listener without a port (C{unix:}) sits behind a
    proxy fleetd cannot see; it is assumed at port 443.
    """
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if port is None or port == 443:
        return f"https://{host}"
    return f"https://{host}:{port}"


def verificationURI(enrollmentName: str, port: int | None) -> str:
    """The console's verification page [F3] on the admin listener."""
    return adminBase(enrollmentName, port) + "/device"


def followAdminPort(
    flow: DeviceFlow,
    enrollmentName: str,
    alsoBase: Callable[[str], None] | None = None,
    consoleHost: str | None = None,
) -> Callable[[IListeningPort], None]:
    """
    [F3] Once the admin listener is bound, point the device flow's
    C{verification_uri} at its /device page (the port is known only then),
    and tell C{alsoBase} the listener's L{adminBase} under C{consoleHost}
    (the console's links; the enrollment name when L{None}).
    """

    def bound(port: IListeningPort) -> None:
        number = getattr(port.getHost(), "port", None)
        flow.verificationURI = verificationURI(enrollmentName, number)
        if alsoBase is not None:
            alsoBase(adminBase(consoleHost or enrollmentName, number))

    return bound


def requestJSON(view: RequestView) -> dict[str, object]:
    """A request as the admin API shows it: no secret but the user code
    (the owner has it from the console), and only whether the node sent
    its one-time code."""
    return {
        "id": view.id,
        "user_code": view.user_code,
        "state": view.state,
        "device": view.device,
        "known_device": view.known,
        "decided_by": view.decided_by,
        "peer": view.peer,
        "client_id": view.client_id,
        "created_at": view.created_at,
        "expires_at": view.expires_at,
        "reported": {k: v for k, v in view.reported.items() if k != "code"},
        "code_sent": view.code_sent,
    }


def _jsonBody(
    request: IRequest, keys: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A JSON object with the string members C{keys}, and maybe C{optional}."""
    raw = b"" if request.content is None else request.content.read()
    try:
        document = jsonbody.loads(raw)
    except JSONBodyError as e:
        raise DeviceFlowError("invalid", f"body: {e}") from None
    if not isinstance(document, dict) or not (
        set(keys) <= set(document) <= set(keys) | set(optional)
    ):
        raise DeviceFlowError("invalid", f"body: must have exactly {', '.join(keys)}")
    if not all(isinstance(document[k], str) for k in keys):
        raise DeviceFlowError("invalid", "body: values must be strings")
    accepted = document.get("accept_mismatch", [])
    if not (
        isinstance(accepted, list)
        and all(isinstance(a, str) and a in COMPARED for a in accepted)
    ):
        raise DeviceFlowError("invalid", "accept_mismatch: a list of uuid, serial")
    return document


class _Decision(Endpoint):
    """C{POST .../approve} or C{.../deny}."""

    isLeaf = True

    def __init__(self, flow: DeviceFlow, owner: OwnerOf, approve: bool) -> None:
        super().__init__()
        self._flow = flow
        self._owner = owner
        self._approve = approve

    def render_POST(self, request: IRequest) -> int | bytes:
        owner = self._owner(request)
        if owner is None:
            return textResponse(
                request, http.FORBIDDEN, "owner client certificate required"
            )
        try:
            if self._approve:
                body = _jsonBody(
                    request, ("user_code", "device"), optional=("accept_mismatch",)
                )
            else:
                body = _jsonBody(request, ("user_code",))
        except DeviceFlowError as e:
            return textResponse(request, statusOf(e), lineOf(e))

        async def work() -> tuple[int, Any]:
            if self._approve:
                view = await self._flow.approve(
                    body["user_code"],
                    body["device"],
                    owner,
                    acceptMismatch=body.get("accept_mismatch", ()),
                )
            else:
                view = await self._flow.deny(body["user_code"], owner)
            return http.OK, requestJSON(view)

        return renderAsync(request, work, decisionRefusal)


class DeviceFlowAdmin(Endpoint):
    """C{/v1/admin/device-flow}: the pending list and the owner's decisions."""

    def __init__(self, flow: DeviceFlow, owner: OwnerOf = ownerOf) -> None:
        super().__init__()
        self._flow = flow
        self.putChild(b"approve", _Decision(flow, owner, approve=True))
        self.putChild(b"deny", _Decision(flow, owner, approve=False))

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if path == b"" and not request.postpath:
            return self
        return notFound()

    def render_GET(self, request: IRequest) -> bytes:
        pending = [requestJSON(p) for p in self._flow.pending()]
        return jsonResponse(request, http.OK, {"pending": pending})


def deviceFlowAdminResource(
    flow: DeviceFlow, owner: OwnerOf = ownerOf
) -> resource.Resource:
    """
    C{/v1/admin/device-flow}; C{owner} names the request's owner (tests
    pass a fake: L{ownerOf} needs a TLS client certificate).
    """
    return DeviceFlowAdmin(flow, owner)
