"""
C{plan --target-link PATH}: name the plan's target disk for the actions
after C{plan} (docs/enrollment.md).

The plan names its target disk by serial [D1]; the Tinkerbell actions
after it (C{image2disk}'s C{DEST_DISK}, C{plan --write-meta}) need a
device path, and a Template cannot know it in advance. The agent finds
the one whole disk under C{/sys/block} reporting that serial (read as
C{fleetd-agent disks} reads it, L{fleetd.agent.sysfs.serialOf}; compared
ignoring case, as fleetd compares serials) and makes PATH a symbolic
link to C{/dev/NAME}, in the state volume the actions share. A plan
without a code (no ready run) links nothing, so the workflow stops
before the image is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fleetd.agent.sysfs import serialOf


class TargetError(Exception):
    """One line: why the plan's target disk cannot be linked."""


def disksWithSerial(root: Path, serial: str) -> list[str]:
    """
    The names of the whole disks under C{root}/block (those with a
    C{device} link) whose serial is C{serial}, ignoring case.
    """
    try:
        names = sorted(entry.name for entry in (root / "block").iterdir())
    except OSError as e:
        raise TargetError(f"cannot read {root / 'block'}: {e.strerror}") from None
    wanted = serial.casefold()
    found = []
    for name in names:
        base = root / "block" / name
        if not (base / "device").exists():
            continue
        own = serialOf(base)
        if own is not None and own.casefold() == wanted:
            found.append(name)
    return found


def linkTarget(plan: dict[str, Any], link: Path, sysfsRoot: Path) -> str:
    """
    Make C{link} a symbolic link to the device node of the plan's target
    disk, replacing an earlier link atomically; return the device path.

    @raise TargetError: C{meta-code-missing} (no ready run: nothing to
        install), C{target-disk-absent} (no disk, or more than one,
        reports the serial), or the link cannot be written.
    """
    if not plan.get("meta_0x0b"):
        raise TargetError(
            "meta-code-missing: the plan carries no META 0x0b code; nothing linked"
        )
    serial = plan.get("target_disk_serial")
    if not serial:
        raise TargetError("target-disk-absent: the plan names no target disk")
    names = disksWithSerial(sysfsRoot, str(serial))
    if len(names) != 1:
        seen = ", ".join(names) or "none"
        raise TargetError(
            f"target-disk-absent: {len(names)} disks report the plan's target"
            f" disk serial {serial} ({seen})"
        )
    device = f"/dev/{names[0]}"
    tmp = link.with_name(f".{link.name}.tmp")
    try:
        link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        os.symlink(device, tmp)
        os.replace(tmp, link)
    except OSError as e:
        raise TargetError(f"cannot link {link}: {e.strerror}") from None
    return device
