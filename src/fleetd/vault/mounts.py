"""Which filesystem holds the vault: tmpfs or ramfs, or refuse [V1]."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from twisted.logger import Logger

from fleetd.vault.errors import VaultError

# The vault's own namespace, as when the check lived in DirectoryVault.
_log = Logger(namespace="fleetd.vault.store.DirectoryVault")

_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")

VOLATILE_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MOUNTINFO = Path("/proc/self/mountinfo")


def parseMountInfo(text: str) -> list[tuple[str, str]]:
    """
    Parse C{/proc/self/mountinfo} into C{(mountPoint, fsType)} pairs, in
    file order, undoing the kernel's octal escapes (C{\\040} for a space).
    """
    mounts: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            mountPoint, fsType = fields[4], fields[separator + 1]
        except (ValueError, IndexError):
            continue
        mountPoint = _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m[1], 8)), mountPoint)
        mounts.append((mountPoint, fsType))
    return mounts


def _mountFor(path: str, mounts: Iterable[tuple[str, str]]) -> str | None:
    """Return the fs type of the longest mount point containing C{path}."""
    best: tuple[int, str] | None = None
    for mountPoint, fsType in mounts:
        prefix = mountPoint.rstrip("/") + "/"
        if path == mountPoint or path.startswith(prefix):
            # ">=": a later mount on the same point hides the earlier one.
            if best is None or len(mountPoint) >= best[0]:
                best = (len(mountPoint), fsType)
    return None if best is None else best[1]


def filesystemType(path: Path, mountinfo: Path = MOUNTINFO) -> str:
    """Return the type of the filesystem holding C{path}, per C{mountinfo}."""
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise VaultError(f"cannot read {mountinfo}: {e.strerror}") from e
    fsType = _mountFor(os.fspath(path.resolve()), parseMountInfo(text))
    if fsType is None:
        raise VaultError(f"no mount in {mountinfo} holds {path}")
    return fsType


def isVolatile(path: Path, allowAnyFilesystem: bool, mountinfo: Path) -> bool:
    """
    Whether C{path} is on tmpfs or ramfs [V1]. Another filesystem is
    refused unless C{allowAnyFilesystem} (dev, tests), then logged.

    @raise VaultError: not volatile, and not allowed.
    """
    try:
        fsType = filesystemType(path, mountinfo)
    except VaultError:
        if not allowAnyFilesystem:
            raise
        fsType = "unknown"
    if fsType in VOLATILE_FILESYSTEMS:
        return True
    if not allowAnyFilesystem:
        raise VaultError(f"vault directory {path} is on {fsType}, not tmpfs or ramfs")
    _log.warn(
        "vault.persistent_filesystem {path} {fsType}", path=str(path), fsType=fsType
    )
    return False
