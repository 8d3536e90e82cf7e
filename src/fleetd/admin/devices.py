"""
The inventory's part of the admin API, under C{/v1/admin/devices}.

  - C{POST /v1/admin/devices}: a JSON object with C{name}, C{serial},
    C{uuid}, C{class} and optionally C{macs} (a list), C{cluster} and
    C{address} (the node's IPv4 or IPv6 address); 201 with the device.
  - C{GET /v1/admin/devices}: C{{"devices": [...]}}, ordered by name.
  - C{GET /v1/admin/devices/NAME}: the device, or a 404 line.
  - C{POST /v1/admin/devices/import}: the body is a device CSV
    (L{fleetd.inventory.csvimport}); all or nothing, C{{"imported": N}}.
    The file (up to the admin body limit, 8 MiB) is decoded and parsed in
    a worker thread (the C{offload} given), never on the reactor thread.

A device's class must be one the site defines and its cluster one with a
template (L{SiteDefinitions}); otherwise 400 with one line saying which
and what was probably meant.  Refusals are one line of text: 400 invalid,
404 unknown, 409 duplicate, 503 inventory unavailable.  These resources
sit behind the owner gate; additions are journaled with the owner as actor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from twisted.logger import Logger
from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd import jsonbody
from fleetd.inventory.csvimport import parseDeviceCSV
from fleetd.inventory.defined import SiteDefinitions
from fleetd.inventory.model import Device, IInventory, InventoryError, validateDevice
from fleetd.jsonbody import JSONBodyError
from fleetd.store.entries import Entry
from fleetd.store.fields import FieldValue
from fleetd.store.journal import AsyncJournal
from fleetd.web.owner import ownerOf
from fleetd.web.refusals import inventoryRefusal
from fleetd.web.resources import Endpoint, notFound, renderAsync

log = Logger()

_FIELDS = {
    # key: (type check, required)
    "name": (str, True),
    "serial": (str, True),
    "uuid": (str, True),
    "class": (str, True),
    "macs": (list, False),
    "cluster": (str, False),
    "address": (str, False),
}

Outcome = tuple[int, Any]
T = TypeVar("T")
# Run a blocking function with one argument elsewhere (a thread pool);
# e.g. functools.partial(deferToThreadPool, reactor, reactor.getThreadPool()).
Offload = Callable[[Callable[[bytes], T], bytes], Awaitable[T]]


def _actor(request: IRequest) -> str:
    return "owner:" + (ownerOf(request) or "unknown")


def _raw(request: IRequest) -> bytes:
    content = request.content
    return b"" if content is None else content.read()


def _text(raw: bytes) -> str:
    """C{raw} as text; invalid UTF-8 is refused."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InventoryError(f"body: not UTF-8 (byte {e.start})") from None


def _body(request: IRequest) -> str:
    """The request body as text; invalid UTF-8 is refused."""
    return _text(_raw(request))


def parseDeviceCSVBody(raw: bytes) -> list[Device]:
    """Decode and parse an import body: blocking work, for a worker thread."""
    return parseDeviceCSV(_text(raw))


def parseDeviceJSON(text: str) -> Device:
    """
    A device from a strict JSON object: known keys only, right types.

    @raise InventoryError: (C{"invalid"}) one line naming the problem.
    """
    try:
        document = jsonbody.loads(text)
    except JSONBodyError as e:
        raise InventoryError(f"body: {e}") from None
    if not isinstance(document, dict):
        raise InventoryError("body: must be a JSON object")
    for key in document:
        if key not in _FIELDS:
            known = ", ".join(_FIELDS)
            raise InventoryError(f"body: unknown key {key!r} (known: {known})")
    for key, (kind, required) in _FIELDS.items():
        if key not in document:
            if required:
                raise InventoryError(f"{key}: missing")
            continue
        value = document[key]
        if key in ("cluster", "address") and value is None:
            continue
        if not isinstance(value, kind):
            raise InventoryError(f"{key}: must be a JSON {kind.__name__}")
    macs = document.get("macs", [])
    for mac in macs:
        if not isinstance(mac, str):
            raise InventoryError("macs: must be a list of strings")
    return validateDevice(
        name=document["name"],
        serial=document["serial"],
        uuid=document["uuid"],
        macs=macs,
        device_class=document["class"],
        cluster=document.get("cluster"),
        address=document.get("address"),
    )


def _refusal(error: Exception) -> tuple[int, str] | None:
    """An L{InventoryError} is its one-line refusal (400, 404, 409 or 503)."""
    if not isinstance(error, InventoryError):
        return None
    log.warn("inventory.refused {kind} {reason}", kind=error.kind, reason=str(error))
    return inventoryRefusal(error)


def renderInventory(request: Any, work: Callable[[], Awaitable[Outcome]]) -> int:
    """L{renderAsync} with inventory refusals as one-line answers."""
    return renderAsync(request, work, _refusal)


class DevicesResource(Endpoint):
    """C{/v1/admin/devices}: list and add; children are single devices."""

    def __init__(
        self,
        inventory: IInventory,
        journal: AsyncJournal,
        offload: Offload[Any],
        defined: SiteDefinitions | None,
    ) -> None:
        super().__init__()
        self._inventory = inventory
        self._journal = journal
        self._offload = offload
        self._defined = defined

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if request.postpath == [b"forget-identity"] and path:
            request.prepath.append(request.postpath.pop())
            try:
                return ForgetIdentityResource(
                    self._inventory, path.decode("utf-8"), self._journal
                )
            except UnicodeDecodeError:
                return notFound()
        if request.postpath:
            return notFound()
        if path == b"":
            return self
        if path == b"import":
            return ImportResource(
                self._inventory, self._journal, self._offload, self._defined
            )
        try:
            name = path.decode("utf-8")
        except UnicodeDecodeError:
            return notFound()
        return DeviceResource(self._inventory, name)

    def render_GET(self, request: IRequest) -> int:
        async def work() -> Outcome:
            devices = await self._inventory.list()
            return http.OK, {"devices": [d.toJSON() for d in devices]}

        return renderInventory(request, work)

    def render_POST(self, request: IRequest) -> int:
        actor = _actor(request)

        async def work() -> Outcome:
            new = parseDeviceJSON(_body(request))
            if self._defined is not None:
                self._defined.check(new)
            device = await self._inventory.add(new, journal=[_added(new, actor)])
            location = f"/v1/admin/devices/{device.name}".encode("ascii")
            request.setHeader(b"location", location)
            return http.CREATED, device.toJSON()

        return renderInventory(request, work)


def _added(device: Device, actor: str, via: str | None = None) -> Entry:
    """The journal entry that goes with adding C{device} [J1]."""
    fields: dict[str, FieldValue] = {
        "serial": device.serial,
        "uuid": device.uuid,
        "class": device.device_class,
        "cluster": device.cluster,
        "macs": len(device.macs),
    }
    if via is not None:
        fields["via"] = via
    return Entry("device.added", actor=actor, device=device.name, fields=fields)


class DeviceResource(Endpoint):
    """C{GET /v1/admin/devices/NAME}."""

    isLeaf = True

    def __init__(self, inventory: IInventory, name: str) -> None:
        super().__init__()
        self._inventory = inventory
        self._name = name

    def render_GET(self, request: IRequest) -> int:
        async def work() -> Outcome:
            device = await self._inventory.get(self._name)
            if device is None:
                raise InventoryError(f"no device named {self._name}", "not-found")
            return http.OK, device.toJSON()

        return renderInventory(request, work)


class ForgetIdentityResource(DeviceResource):
    """
    C{POST /v1/admin/devices/NAME/forget-identity} C{{"reason": "..."}}: a
    retired device's serial, uuid, MACs and address are freed for a new
    record (the machine comes back under a new name); journaled with what
    they were.
    """

    def __init__(self, inventory: IInventory, name: str, journal: AsyncJournal) -> None:
        super().__init__(inventory, name)
        self._journal = journal

    def render_POST(self, request: IRequest) -> int:
        actor = _actor(request)

        async def work() -> Outcome:
            reason = _reason(_body(request))
            device = await self._inventory.get(self._name)
            if device is None:
                raise InventoryError(f"no device named {self._name}", "not-found")
            fields: dict[str, FieldValue] = {
                "serial": device.serial,
                "uuid": device.uuid,
                "macs": " ".join(device.macs),
            }
            if device.address is not None:
                fields["address"] = device.address
            entry = Entry(
                "device.identity-forgotten",
                actor=actor,
                device=device.name,
                fields={**fields, "reason": reason},
            )
            forgotten = await self._inventory.forgetIdentity(
                device.name, journal=[entry]
            )
            return http.OK, forgotten.toJSON()

        return renderInventory(request, work)


def _reason(text: str) -> str:
    try:
        doc = jsonbody.loads(text)
    except JSONBodyError as e:
        raise InventoryError(f"body: {e}") from None
    reason = doc.get("reason") if isinstance(doc, dict) else None
    if not isinstance(reason, str) or not 0 < len(reason) <= 200:
        raise InventoryError("reason: required, 1 to 200 characters")
    if not reason.isprintable():
        raise InventoryError("reason: printable text only")
    return reason


class ImportResource(DeviceResource):
    """
    C{POST /v1/admin/devices/import}: a CSV body, imported all or nothing.

    C{GET} still shows a device that happens to be called C{import}.
    """

    def __init__(
        self,
        inventory: IInventory,
        journal: AsyncJournal,
        offload: Offload[Any],
        defined: SiteDefinitions | None,
    ) -> None:
        super().__init__(inventory, "import")
        self._journal = journal
        self._offload = offload
        self._defined = defined

    def render_POST(self, request: IRequest) -> int:
        actor = _actor(request)
        raw = _raw(request)

        async def work() -> Outcome:
            devices: list[Device] = await self._offload(parseDeviceCSVBody, raw)
            if self._defined is not None:
                self._defined.checkAll(devices)
            count = await self._inventory.importDevices(
                devices, journal=[_added(d, actor, via="import") for d in devices]
            )
            return http.OK, {"imported": count}

        return renderInventory(request, work)


def devicesResource(
    inventory: IInventory,
    journal: AsyncJournal,
    *,
    offload: Offload[Any],
    defined: SiteDefinitions | None,
) -> resource.Resource:
    """
    The C{/v1/admin/devices} subtree, to mount behind the owner gate.

    @param offload: runs the CSV parse of an import off the reactor thread.
    @param defined: the classes and clusters an added device may name;
        L{None} only where the inventory refuses additions itself (NetBox,
        whose devices are created in NetBox).
    """
    return DevicesResource(inventory, journal, offload, defined)
