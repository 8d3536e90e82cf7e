"""
Parse the device CSV of C{fleetctl device import}.

The first non-blank row is the header: column names from
C{name,serial,uuid,mac,class,cluster,address} in any order (C{name},
C{serial}, C{uuid} and C{class} required).  A C{mac} cell holds several
addresses separated by spaces; an C{address} cell the node's one IPv4 or
IPv6 address, or nothing.  Blank lines are ignored; a leading byte order mark
is tolerated.  One bad row rejects the whole file, with the physical line
number (the first line of the file is line 1) of the row.
"""

from __future__ import annotations

from fleetd.csvrows import CSVLineError, csvRows
from fleetd.inventory.model import Device, InventoryError, validateDevice

COLUMNS = ("name", "serial", "uuid", "mac", "class", "cluster", "address")
REQUIRED = ("name", "serial", "uuid", "class")

_BOM = "\ufeff"


def _lineError(line: int, what: str) -> InventoryError:
    return InventoryError(f"line {line}: {what}")


def _header(cells: list[str], line: int) -> list[str]:
    columns = [cell.strip().lower() for cell in cells]
    seen: set[str] = set()
    for column in columns:
        if column not in COLUMNS:
            raise _lineError(
                line, f"unknown column {column!r} (known: {', '.join(COLUMNS)})"
            )
        if column in seen:
            raise _lineError(line, f"column {column!r} appears twice")
        seen.add(column)
    for column in REQUIRED:
        if column not in seen:
            raise _lineError(line, f"missing column {column!r}")
    return columns


def _device(columns: list[str], cells: list[str], line: int) -> Device:
    if len(cells) != len(columns):
        raise _lineError(line, f"expected {len(columns)} fields, got {len(cells)}")
    row = dict(zip(columns, (cell.strip() for cell in cells), strict=True))
    cluster = row.get("cluster") or None
    try:
        return validateDevice(
            name=row["name"],
            serial=row["serial"],
            uuid=row["uuid"],
            macs=row.get("mac", "").split(),
            device_class=row["class"],
            cluster=cluster,
            address=row.get("address") or None,
        )
    except InventoryError as e:
        raise _lineError(line, str(e)) from None


class _Seen:
    """Which line first used each unique value, to refuse duplicates."""

    def __init__(self) -> None:
        self._lines: dict[tuple[str, str], int] = {}

    def claim(self, device: Device, line: int) -> None:
        keys = [
            ("name", device.name),
            ("serial", device.serial.lower()),
            ("uuid", device.uuid),
        ]
        keys += [("mac", mac) for mac in device.macs]
        if device.address is not None:
            keys.append(("address", device.address))
        for field, value in keys:
            first = self._lines.get((field, value))
            if first is not None:
                shown = device.serial if field == "serial" else value
                raise _lineError(
                    line, f"duplicate {field} {shown} (first on line {first})"
                )
        for key in keys:
            self._lines[key] = line


def parseDeviceCSV(text: str) -> list[Device]:
    """
    Parse a whole device CSV file.

    @raise InventoryError: C{"line N: <what>"} for the first bad row, or
        for a bad or missing header.
    """
    if text.startswith(_BOM):
        text = text[len(_BOM) :]
    columns: list[str] | None = None
    seen = _Seen()
    devices: list[Device] = []
    try:
        for line, cells in csvRows(text):
            if columns is None:
                columns = _header(cells, line)
            else:
                device = _device(columns, cells, line)
                seen.claim(device, line)
                devices.append(device)
    except CSVLineError as e:
        raise _lineError(e.line, e.what) from None
    if columns is None:
        raise _lineError(
            1, "no header row (expected columns such as " + ",".join(COLUMNS) + ")"
        )
    return devices
