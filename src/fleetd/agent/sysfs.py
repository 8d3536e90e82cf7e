"""
Block devices as sysfs shows them: what C{fleetd-agent disks} reports
(L{fleetd.agent.disks}) and how C{plan --write-meta} recognizes the
plan's target disk (L{fleetd.agent.meta}).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def text(path: Path) -> str | None:
    """A sysfs attribute as trimmed text; C{None} when absent or empty."""
    data = _read(path)
    if data is None:
        return None
    value = data.decode("ascii", "replace").strip().strip("\x00").strip()
    return value or None


def _vpdSerial(path: Path) -> str | None:
    """The serial in a unit serial number VPD page (0x80), if any."""
    data = _read(path)
    if data is None or len(data) < 4 or data[1] != 0x80:
        return None
    length = int.from_bytes(data[2:4], "big")
    value = data[4 : 4 + length].decode("ascii", "replace").strip().strip("\x00")
    return value.strip() or None


def serialOf(base: Path) -> str | None:
    """
    The serial of the block device whose sysfs directory is C{base}:
    C{device/serial} (NVMe, most SCSI), else C{serial} (virtio), else the
    unit serial VPD page C{device/vpd_pg80}; trimmed.
    """
    return (
        text(base / "device" / "serial")
        or text(base / "serial")
        or _vpdSerial(base / "device" / "vpd_pg80")
    )


@dataclass(frozen=True)
class BlockDevice:
    """A block device as sysfs shows it: name, whether a partition, serial."""

    name: str
    partition: bool
    serial: str | None


def blockDevice(rdev: int, root: Path) -> BlockDevice:
    """
    The block device numbered C{rdev} (C{st_rdev}), from
    C{root}/dev/block/MAJOR:MINOR; its serial by L{serialOf}.
    """
    base = root / "dev" / "block" / f"{os.major(rdev)}:{os.minor(rdev)}"
    return BlockDevice(
        name=base.resolve().name,
        partition=(base / "partition").exists(),
        serial=serialOf(base),
    )
