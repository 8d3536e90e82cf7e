"""
A node's disk report, as C{fleetd-agent disks} sends it and fleetd reads it.

The wire form is one JSON object::

    {"disks": [{"name": "sda", "serial": "S3Z9NB0K123456", "wwn":
      "naa.5002538e40a1b2c3", "size": 500107862016, "removable": false}]}

C{name} is the kernel's block device name, C{serial} what sysfs exposes
(L{None} or absent when it exposes nothing), C{wwn} the World Wide Name
if any, C{size} bytes, C{removable} the sysfs flag (absent = false).
Serials and WWNs are trimmed (ATA pads them with spaces); an empty one
is no serial at all. Serials compare case-insensitively, as everywhere in
fleetd. No other key is accepted, none twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fleetd import jsonbody
from fleetd.jsonbody import JSONBodyError

MAX_DISKS = 256
MAX_SERIAL = 128
MAX_SIZE = 1 << 62
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_KEYS = {"name", "serial", "wwn", "size", "removable"}


class DiskReportError(ValueError):
    """A disk report that is not well formed; one line."""


@dataclass(frozen=True)
class Disk:
    """One disk as a node reported it."""

    name: str
    serial: str | None
    wwn: str | None
    size: int
    removable: bool = False

    def toJSON(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "serial": self.serial,
            "wwn": self.wwn,
            "size": self.size,
            "removable": self.removable,
        }


def _identifier(field: str, value: object, index: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DiskReportError(f"disks[{index}].{field}: must be a string or null")
    text = value.strip()
    if not text:
        return None
    if len(text) > MAX_SERIAL or not text.isascii() or not text.isprintable():
        raise DiskReportError(
            f"disks[{index}].{field}: at most {MAX_SERIAL} printable ASCII characters"
        )
    return text


def disk(entry: object, index: int = 0) -> Disk:
    """Check one disk of a report."""
    if not isinstance(entry, dict):
        raise DiskReportError(f"disks[{index}]: must be an object")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise DiskReportError(f"disks[{index}]: unknown key {unknown[0]!r}")
    name = entry.get("name")
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise DiskReportError(f"disks[{index}].name: not a block device name")
    size = entry.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < MAX_SIZE:
        raise DiskReportError(f"disks[{index}].size: a whole number of bytes")
    removable = entry.get("removable", False)
    if not isinstance(removable, bool):
        raise DiskReportError(f"disks[{index}].removable: true or false")
    return Disk(
        name=name,
        serial=_identifier("serial", entry.get("serial"), index),
        wwn=_identifier("wwn", entry.get("wwn"), index),
        size=size,
        removable=removable,
    )


def parseDiskReport(raw: bytes) -> list[Disk]:
    """
    The disks of a JSON report.

    @raise DiskReportError: one line naming the first problem.
    """
    try:
        document = jsonbody.loads(raw)
    except JSONBodyError as e:
        raise DiskReportError(f"not a JSON disk report: {e}") from None
    if not isinstance(document, dict) or set(document) != {"disks"}:
        raise DiskReportError('a disk report is {"disks": [...]}')
    entries = document["disks"]
    if not isinstance(entries, list) or len(entries) > MAX_DISKS:
        raise DiskReportError(f"disks: a list of at most {MAX_DISKS} disks")
    disks = [disk(entry, index) for index, entry in enumerate(entries)]
    names = [d.name for d in disks]
    for name in names:
        if names.count(name) > 1:
            raise DiskReportError(f"disks: {name} is listed twice")
    return disks


def reportJSON(disks: list[Disk]) -> dict[str, Any]:
    """The wire form of a report (what the agent sends)."""
    return {"disks": [d.toJSON() for d in disks]}
