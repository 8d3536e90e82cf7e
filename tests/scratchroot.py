"""
A scratch root for docs/install.md's commands (issue 27, item 6): run a
command as root with the machine's files under it, and none of its own
writes reaching the machine.

    python -m tests.scratchroot SCRATCH -- ARGV...

In new mount, network and UTS namespaces: an overlay of C{/} mounted at
C{SCRATCH/root}, its writes kept in a tmpfs (an upper layer cannot live on
the file system it covers), C{/proc}, C{/sys} and C{/dev} as they are, a
fresh tmpfs C{/run} (the vault must be on tmpfs [V1]) and C{SCRATCH}
itself bound at its own path, so the test and the command share it; only
loopback, up. Then C{chroot} there and exec C{ARGV}. Everything the
command does (C{useradd}, C{/etc}, C{/opt}, C{/var}, ports 443 and 53)
ends with the namespaces; another process joins them with C{nsenter
--target PID --mount --net --uts --root}.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
from pathlib import Path

from tests.hardening import (
    CLONE_NEWNS,
    CLONE_NEWUTS,
    MS_BIND,
    MS_PRIVATE,
    MS_REC,
    check,
    libc,
    mount,
    tmpfs,
)

CLONE_NEWNET = 0x40000000


def enter(scratch: Path) -> Path:
    """Namespaces and mounts as above; the new root's path."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    layers, root = scratch / "layers", scratch / "root"
    for directory in (layers, root):
        directory.mkdir(exist_ok=True)
    tmpfs(str(layers), "0700")
    (layers / "upper").mkdir()
    (layers / "work").mkdir()
    options = f"lowerdir=/,upperdir={layers}/upper,workdir={layers}/work"
    mount("overlay", str(root), "overlay", 0, options)
    for path in ("proc", "sys", "dev"):
        mount(f"/{path}", str(root / path), None, MS_BIND | MS_REC)
    tmpfs(str(root / "run"), "0755")
    inside = root / str(scratch).lstrip("/")
    mount(str(scratch), str(inside), None, MS_BIND)
    loopbackUp()
    return root


def loopbackUp() -> None:
    """C{ip link set lo up}, with the two ioctls it makes (no iproute2 needed)."""
    siocgifflags, siocsifflags, iffUp = 0x8913, 0x8914, 1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        _, flags = struct.unpack("16sH22x", fcntl.ioctl(s, siocgifflags, request))
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH22x", b"lo", flags | iffUp))


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") != 1:
        raise SystemExit(__doc__)
    scratch, command = Path(argv[0]).resolve(), argv[2:]
    root = enter(scratch)
    os.chroot(root)
    os.chdir("/")
    os.execvp(command[0], command)  # noqa: S606 (the point)


if __name__ == "__main__":
    main(sys.argv[1:])
