"""
How a fleetd device maps onto NetBox's C{dcim.device} (design.md, State,
"NetBox as the inventory").

    name      device name, matched case-insensitively (C{name__ie})
    serial    C{serial}, looked up with C{?serial=} (case-insensitive)
    status    C{status.value}
    cluster   the assigned cluster's name
    macs      MACs of the device's interfaces that are not management-only
    address   C{primary_ip} (NetBox's preferred of C{primary_ip4} and
              C{primary_ip6}, by its C{PREFER_IPV4}), without the prefix length
    uuid      custom field C{fleetd_uuid} (text, the SMBIOS UUID)
    class     custom field C{fleetd_class} (text)
    release   custom field C{fleetd_release} (JSON: run, served_at, digest)

Zero or several devices for one name or serial are errors naming it:
neither names nor serials are unique in NetBox. Lookups check the answer
themselves as well, because NetBox ignores filters it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    InventoryError,
    validateDevice,
)
from fleetd.netbox.client import NetBoxClient

DEVICES = "api/dcim/devices/"
INTERFACES = "api/dcim/interfaces/"
CUSTOM_FIELDS = "api/extras/custom-fields/"
JOURNAL = "api/extras/journal-entries/"
OBJECT_TYPE = "dcim.device"

CF_UUID = "fleetd_uuid"
CF_CLASS = "fleetd_class"
CF_RELEASE = "fleetd_release"
CUSTOM_FIELD_TYPES = {CF_UUID: "text", CF_CLASS: "text", CF_RELEASE: "json"}

FLEETD_STATUSES = frozenset(
    {
        DeviceStatus.PLANNED,
        DeviceStatus.STAGED,
        DeviceStatus.ACTIVE,
        DeviceStatus.DECOMMISSIONING,
    }
)


def detailPath(deviceId: int) -> str:
    return f"{DEVICES}{deviceId}/"


@dataclass(frozen=True)
class RemoteDevice:
    """A NetBox device as fleetd sees it: its id, raw status and custom fields."""

    id: int
    name: str
    status: str
    custom_fields: dict[str, Any]


def remote(data: dict[str, Any]) -> RemoteDevice:
    status = data.get("status")
    value = status.get("value") if isinstance(status, dict) else status
    fields = data.get("custom_fields")
    ident = data.get("id")
    if not isinstance(ident, int) or isinstance(ident, bool):
        raise InventoryError("NetBox sent a device without an id", "unavailable")
    return RemoteDevice(
        id=ident,
        name=str(data.get("name") or ""),
        status=str(value or ""),
        custom_fields=dict(fields) if isinstance(fields, dict) else {},
    )


def primaryAddress(data: dict[str, Any]) -> str | None:
    """
    The device's primary IP as NetBox gives it (C{"10.0.0.5/24"}), without
    its prefix length; L{None} when it has none. NetBox 4 sends
    C{primary_ip} (read-only, its preferred family) beside C{primary_ip4}
    and C{primary_ip6}; the first present is taken.
    """
    for key in ("primary_ip", "primary_ip4", "primary_ip6"):
        nested = data.get(key)
        if isinstance(nested, dict) and isinstance(nested.get("address"), str):
            return str(nested["address"]).partition("/")[0]
    return None


def toDevice(data: dict[str, Any], interfaces: list[dict[str, Any]]) -> Device:
    """
    The fleetd L{Device} a NetBox device describes.

    @raise InventoryError: (C{"invalid"}) naming the device and the field.
    """
    name = data.get("name")
    fields = data.get("custom_fields") or {}
    cluster = data.get("cluster")
    status = data.get("status")
    macs = [
        i["mac_address"]
        for i in interfaces
        if not i.get("mgmt_only") and isinstance(i.get("mac_address"), str)
    ]
    try:
        return validateDevice(
            name=name,
            serial=data.get("serial"),
            uuid=fields.get(CF_UUID),
            macs=list(dict.fromkeys(m.lower() for m in macs)),
            device_class=fields.get(CF_CLASS),
            cluster=cluster.get("name") if isinstance(cluster, dict) else None,
            status=status.get("value") if isinstance(status, dict) else status,
            address=primaryAddress(data),
        )
    except InventoryError as e:
        raise InventoryError(f"NetBox device {name!r}: {e}", "invalid") from None


def isFleetDevice(data: dict[str, Any]) -> bool:
    """Whether a NetBox device is one of fleetd's (it carries a class)."""
    fields = data.get("custom_fields")
    return isinstance(fields, dict) and bool(fields.get(CF_CLASS))


async def findByName(client: NetBoxClient, name: str) -> dict[str, Any] | None:
    """
    The one NetBox device called C{name} (case-insensitively), or None.

    @raise InventoryError: (C{"duplicate"}) several devices carry the name.
    """
    results = await client.listAll(DEVICES, {"name__ie": name})
    matches = [r for r in results if str(r.get("name", "")).lower() == name.lower()]
    if len(matches) > 1:
        raise InventoryError(
            f"NetBox has {len(matches)} devices named {name}; fleetd needs exactly"
            " one (rename the others)",
            "duplicate",
        )
    return matches[0] if matches else None


async def findBySerial(client: NetBoxClient, serial: str) -> dict[str, Any]:
    """
    The one NetBox device with serial C{serial} (case-insensitively).

    @raise InventoryError: none (C{"not-found"}) or several (C{"duplicate"}).
    """
    results = await client.listAll(DEVICES, {"serial": serial})
    matches = [r for r in results if str(r.get("serial", "")).lower() == serial.lower()]
    if not matches:
        raise InventoryError(f"NetBox has no device with serial {serial}", "not-found")
    if len(matches) > 1:
        names = ", ".join(sorted(str(m.get("name")) for m in matches))
        raise InventoryError(
            f"NetBox has {len(matches)} devices with serial {serial} ({names});"
            " fleetd needs exactly one",
            "duplicate",
        )
    return matches[0]


async def interfacesOf(client: NetBoxClient, deviceId: int) -> list[dict[str, Any]]:
    results = await client.listAll(INTERFACES, {"device_id": deviceId})
    # NetBox ignores unknown filters: keep only this device's interfaces.
    return [r for r in results if _deviceIdOf(r) == deviceId]


def _deviceIdOf(interface: dict[str, Any]) -> int | None:
    device = interface.get("device")
    if isinstance(device, dict):
        ident = device.get("id")
        return ident if isinstance(ident, int) else None
    return None


async def missingCustomFields(client: NetBoxClient) -> list[str]:
    """
    The names of fleetd's custom fields that do not exist for C{dcim.device}
    with the right type (checked at start; fleetd refuses to start without).
    """
    results = await client.listAll(CUSTOM_FIELDS, {"object_type": OBJECT_TYPE})
    present: dict[str, str] = {}
    for field in results:
        types = field.get("object_types") or []
        kind = field.get("type")
        value = kind.get("value") if isinstance(kind, dict) else kind
        if OBJECT_TYPE in types:
            present[str(field.get("name"))] = str(value)
    missing = []
    for name, kind in CUSTOM_FIELD_TYPES.items():
        if name not in present:
            missing.append(name)
        elif present[name] != kind:
            missing.append(f"{name} (is {present[name]}, must be {kind})")
    return missing
