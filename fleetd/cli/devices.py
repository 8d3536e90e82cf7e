"""
C{fleetctl device add|list|show|import}: the inventory through the admin API.

Input is checked locally first (L{validateDevice}, L{parseDeviceCSV}), so
a mistake is reported with its field or CSV line number before anything
is sent; fleetd checks it again.
"""

from __future__ import annotations

import argparse
import http.client
import json
import urllib.parse
from pathlib import Path
from typing import IO, Any

from fleetd.cli.fleetctl import AdminClient, CLIError
from fleetd.config import Settings
from fleetd.inventory.csvimport import parseDeviceCSV
from fleetd.inventory.model import InventoryError, validateDevice

DEVICES = "/v1/admin/devices"
LIST_COLUMNS = ("name", "serial", "class", "cluster", "status")
SHOW_KEYS = ("name", "serial", "uuid", "macs", "class", "cluster", "status")
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


def alignedTable(header: list[str], rows: list[list[str]]) -> list[str]:
    """Rows under a header, each column padded to its widest cell."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


def formatDevice(device: dict[str, Any]) -> list[str]:
    """One device as C{key: value} lines."""
    keys = [*SHOW_KEYS, "desired_action"]
    return [f"{key}: {_cell(device.get(key))}" for key in keys]


def emit(
    out: IO[str], args: argparse.Namespace, document: Any, lines: list[str]
) -> None:
    if args.json:
        out.write(json.dumps(document) + "\n")
    else:
        out.write("".join(line + "\n" for line in lines))


def postText(client: AdminClient, path: str, text: str, contentType: str) -> Any:
    """
    POST a non-JSON body (L{AdminClient.request} sends only JSON); return
    the decoded JSON answer, or raise L{CLIError} with fleetd's line.
    """
    payload = text.encode("utf-8")
    conn = client.connection()
    try:
        headers = {"accept": "application/json", "content-type": contentType}
        conn.request("POST", path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read(16 << 20)
    except (OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or str(e) or e.__class__.__name__
        raise CLIError(
            f"cannot reach fleetd at https://{client.host}:{client.port}: {reason}"
        ) from e
    finally:
        conn.close()
    if not 200 <= response.status < 300:
        line = data.decode("utf-8", "replace").strip().splitlines()
        raise CLIError(f"fleetd answered {response.status}: {line[0] if line else ''}")
    try:
        return json.loads(data)
    except ValueError as e:
        raise CLIError("fleetd answered something that is not JSON") from e


def cmdAdd(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    try:
        device = validateDevice(
            name=args.name,
            serial=args.serial,
            uuid=args.uuid,
            macs=args.mac or (),
            device_class=args.device_class,
            cluster=args.cluster,
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


def readUpload(path: Path, limit: int, command: str) -> str:
    """
    The UTF-8 text of a file to import, at most C{limit} bytes; otherwise
    one line naming C{command} and the file.
    """
    try:
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise CLIError(f"{command}: cannot read {path}: {e.strerror}") from e
    if len(raw) > limit:
        raise CLIError(f"{command}: {path} is larger than {limit} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"{command}: {path}: not UTF-8 (byte {e.start})") from e


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
    add.set_defaults(handler=cmdAdd)

    listing = actions.add_parser("list", help="list every device")
    listing.set_defaults(handler=cmdList)

    show = actions.add_parser("show", help="show one device")
    show.add_argument("name")
    show.set_defaults(handler=cmdShow)

    load = actions.add_parser("import", help="import devices from a CSV file")
    load.add_argument(
        "file", help="CSV with a header naming name,serial,uuid,mac,class,cluster"
    )
    load.set_defaults(handler=cmdImport)

    for parser in (add, listing, show, load):
        # Also after the action; absent, the global --json stands.
        parser.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
        )
