"""
Small facts about the vault's files: an entry's kind, and the
process's umask (which decides whether a created file needs a chmod).
"""

from __future__ import annotations

import stat
from pathlib import Path


def processUmask(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's umask, from C{status}; L{None} when it does not say."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split(":", 1)[1].strip(), 8)
    except (OSError, ValueError):
        pass
    return None


def entryKind(mode: int) -> str:
    """What an entry of C{mode} is, for a log line."""
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "special"
