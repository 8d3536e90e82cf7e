"""
C{fleetctl device add|list|show|import|forget-identity}: the inventory
through the admin API.

Input is checked locally first (L{validateDevice}, L{parseDeviceCSV}), so
a mistake is reported with its field or CSV line number before anything
is sent; fleetd checks it again.
"""

from __future__ import annotations

import argparse
import urllib.parse
from pathlib import Path
from typing import IO, Any

from fleetd.cli.client import AdminClient, postText, readUpload
from fleetd.cli.output import alignedTable, emit
from fleetd.clitools import CLIError
from fleetd.config import Settings
from fleetd.inventory.csvimport import parseDeviceCSV
from fleetd.inventory.model import InventoryError, validateDevice

DEVICES = "/v1/admin/devices"
LIST_COLUMNS = ("name", "serial", "class", "cluster", "status")
SHOW_KEYS = ("name", "serial", "uuid", "macs", "address", "class", "cluster", "status")
MAX_CSV_BYTES = 16 << 20


def _cell(value: Any) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def formatTable(devices: list[dict[str, Any]]) -> list[str]:
    """The device list as aligned columns under a header."""
    header = [c.upper() for c in LIST_COLUMNS]
    return alignedTable(
        header, [[_cell(d.get(c)) for c in LIST_COLUMNS] for d in devices]
    )


def formatDevice(device: dict[str, Any]) -> list[str]:
    """One device as C{key: value} lines (C{address} when it has one)."""
    keys = [k for k in SHOW_KEYS if k != "address" or "address" in device]
    keys.append("desired_action")
    return [f"{key}: {_cell(device.get(key))}" for key in keys]


def cmdAdd(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    try:
        device = validateDevice(
            name=args.name,
            serial=args.serial,
            uuid=args.uuid,
            macs=args.mac or (),
            device_class=args.device_class,
            cluster=args.cluster,
            address=args.address,
        )
    except InventoryError as e:
        raise CLIError(f"device add: {e}") from None
    body = device.toJSON()
    for key in ("status", "desired_action"):
        del body[key]
    result = AdminClient(settings).request("POST", DEVICES, body=body)
    emit(out, args, result, [f"added device {result['name']}"])
    return 0


def cmdList(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    devices = AdminClient(settings).request("GET", DEVICES)["devices"]
    emit(out, args, devices, formatTable(devices))
    return 0


def cmdShow(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    path = f"{DEVICES}/{urllib.parse.quote(args.name, safe='')}"
    device = AdminClient(settings).request("GET", path)
    emit(out, args, device, formatDevice(device))
    return 0


def cmdImport(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    path = Path(args.file)
    text = readUpload(path, MAX_CSV_BYTES, "device import")
    try:
        devices = parseDeviceCSV(text)
    except InventoryError as e:
        raise CLIError(f"device import: {path}: {e}") from None
    client = AdminClient(settings)
    result = postText(client, f"{DEVICES}/import", text, "text/csv; charset=utf-8")
    lines = [f"imported {result['imported']} devices from {path}"]
    if not devices:
        lines = [f"{path} lists no devices; nothing imported"]
    emit(out, args, result, lines)
    return 0


def cmdForgetIdentity(
    settings: Settings, args: argparse.Namespace, out: IO[str]
) -> int:
    path = f"{DEVICES}/{urllib.parse.quote(args.name, safe='')}/forget-identity"
    body = {"reason": args.reason}
    device = AdminClient(settings).request("POST", path, body=body)
    line = (
        f"forgot {device['name']}'s serial, uuid, MACs and address; the machine can be"
        " added again under a new name (the record and its journal stay)"
    )
    emit(out, args, device, [line])
    return 0


def addCommands(commands: Any) -> None:
    """Register C{device} and its actions on fleetctl's subparsers."""
    device = commands.add_parser("device", help="the device inventory")
    actions = device.add_subparsers(
        dest="action", required=True, parser_class=type(device)
    )

    add = actions.add_parser("add", help="add one device")
    add.add_argument("name", help="hostname label, e.g. w1")
    add.add_argument("--serial", required=True, help="chassis serial")
    add.add_argument("--uuid", required=True, help="SMBIOS system UUID")
    add.add_argument(
        "--mac", action="append", help="NIC MAC address (repeat for several)"
    )
    add.add_argument("--class", dest="device_class", required=True, help="device class")
    add.add_argument("--cluster", help="cluster the device joins")
    add.add_argument(
        "--address",
        help="the node's own IPv4 or IPv6 address (the disk-key service may"
        " check requests against it)",
    )
    add.set_defaults(handler=cmdAdd)

    listing = actions.add_parser("list", help="list every device")
    listing.set_defaults(handler=cmdList)

    show = actions.add_parser("show", help="show one device")
    show.add_argument("name")
    show.set_defaults(handler=cmdShow, deviceArgs=("name",))

    load = actions.add_parser("import", help="import devices from a CSV file")
    load.add_argument(
        "file",
        help="CSV with a header naming name,serial,uuid,mac,class,cluster"
        " (and optionally address)",
    )
    load.set_defaults(handler=cmdImport)

    forget = actions.add_parser(
        "forget-identity",
        help="free a retired device's serial, uuid, MACs and address for a new record",
    )
    forget.add_argument("name")
    forget.add_argument("--reason", required=True, help="why (journaled)")
    forget.set_defaults(handler=cmdForgetIdentity, deviceArgs=("name",))
