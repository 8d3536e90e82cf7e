"""
The machine's identity as its firmware reports it: SMBIOS, through sysfs
(C{/sys/class/dmi/id}). C{attest} sends these values (unless given on its
command line) and C{ek} prints them; neither is evidence of anything on
its own [T1].
"""

from __future__ import annotations

from pathlib import Path

SYSFS = Path("/sys")


def read(name: str, root: Path = SYSFS) -> str | None:
    """
    The SMBIOS attribute C{name} (e.g. C{product_serial}), trimmed;
    L{None} when absent, empty or unreadable (C{product_serial} and
    C{product_uuid} are readable by root only).
    """
    try:
        return (root / "class" / "dmi" / "id" / name).read_text().strip() or None
    except OSError:
        return None


def serial(root: Path = SYSFS) -> str | None:
    """The chassis serial fleetd knows a machine by (SMBIOS product serial)."""
    return read("product_serial", root)


def uuid(root: Path = SYSFS) -> str | None:
    """The system uuid (SMBIOS product uuid)."""
    return read("product_uuid", root)
