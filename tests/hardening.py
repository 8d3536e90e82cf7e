"""
Run a command under the shipped unit's hardening, imposed by this process
on itself before it execs the command, as systemd does between its fork
and the service's exec (issue 27, item 1).

    python -m tests.hardening UNIT --writable DIR [--set KEY=VALUE] -- ARGV...

Each directive of the unit's C{[Service]} section that this module knows
(L{IMPOSED}) is imposed with the kernel interface systemd itself uses:
a mount namespace with read-only and private mounts, a UTS namespace,
C{prctl} (no new privileges, C{PR_SET_MDWE}, the capability bounding set,
ambient capabilities), C{setuid}, and seccomp filters built with
libseccomp (the library systemd uses), the syscall groups expanded by the
installed C{systemd-analyze}. The unit is the input: a directive the unit
sets is imposed, one it does not set is not. C{--set} adds or replaces a
directive (a test that breaks TLS on purpose).

Where a test cannot be the site, it says so here:
  - C{User=fleetd}/C{Group=fleetd} run as C{--user} (C{nobody}): this
    machine has no C{fleetd} user; the point is a uid that is not root.
  - C{ReadWritePaths}, C{StateDirectory} and C{RuntimeDirectory} are the
    test's one C{--writable} directory (the config puts state and vault
    there).
  - C{ProtectHome=yes} hides C{/home}, C{/root} and C{/run/user} behind
    empty read-only tmpfs, except C{--keep} (the Python installation
    when it lives under C{/root}, as pyenv's does here; on a site the
    interpreter is under C{/usr} and C{/opt/fleetd}).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pwd
import resource
import sys
from pathlib import Path

from tests.hardeningfilters import imposeSeccomp, yes

# --- the unit -------------------------------------------------------------


def serviceDirectives(unit: Path) -> dict[str, list[str]]:
    """The C{[Service]} section's directives; a repeated key keeps each value."""
    section, found = "", dict[str, list[str]]()
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


# --- libc and the kernel --------------------------------------------------

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR, MOUNT_ATTR_RDONLY = 442, 1  # x86_64
PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 8, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 47, 2
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
CAPABILITIES = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_NET_BIND_SERVICE": 10,
    "CAP_NET_RAW": 13, "CAP_SYS_ADMIN": 21,
}  # fmt: skip


def check(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def prctl(*args: int) -> None:
    check(libc.prctl(*[ctypes.c_ulong(a) for a in args]), f"prctl{args}")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:  # fmt: skip
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]),
          f"mount {source} {target}")  # fmt: skip


class MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("attr_set", "attr_clr", "propagation", "userns_fd")]  # fmt: skip


def readOnly(path: str, recursive: bool = False, clear: bool = False) -> None:
    """C{mount_setattr(2)}: make the mount at C{path} read-only (or not)."""
    attr = MountAttr(
        0 if clear else MOUNT_ATTR_RDONLY, MOUNT_ATTR_RDONLY if clear else 0
    )
    flags = AT_RECURSIVE if recursive else 0
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD),
                          path.encode(), ctypes.c_uint(flags), ctypes.byref(attr),
                          ctypes.c_size_t(ctypes.sizeof(attr)))  # fmt: skip
    check(int(result), f"mount_setattr {path}")


def tmpfs(target: str, mode: str, extra: int = 0) -> None:
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | extra, f"mode={mode}")


def bind(source: str, target: str) -> None:
    mount(source, target, None, MS_BIND | MS_REC)


# --- mounts ---------------------------------------------------------------

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)


# This checkout: a test's daemon runs from it (its venv and src/).
CHECKOUT = str(Path(__file__).resolve().parent.parent)


def privateTmp(tmp: str, keep: list[str]) -> None:
    """A new, empty C{tmp}, into which the paths of C{keep} that lay under
    it are bound again: a test's checkout (and so its venv, src/ and trial
    temp) may be a clone under /tmp, where a real unit's never is."""
    held = os.open(tmp, os.O_PATH | os.O_DIRECTORY)
    try:
        tmpfs(tmp, "1777")
        for path in sorted(set(keep)):
            if not (path + "/").startswith(tmp + "/") or os.path.exists(path):
                continue  # elsewhere, or already inside one kept before
            os.makedirs(path)
            bind(f"/proc/self/fd/{held}/{os.path.relpath(path, tmp)}", path)
    finally:
        os.close(held)


def imposeMounts(
    d: dict[str, list[str]], writable: list[str], keep: str | None
) -> None:
    """ProtectSystem, PrivateTmp, PrivateDevices, ProtectHome, ProtectProc,
    ProtectKernelTunables/Logs/Modules, ProtectControlGroups, ReadWritePaths."""
    flags = CLONE_NEWNS | (CLONE_NEWUTS if yes(d, "ProtectHostname") else 0)
    check(libc.unshare(flags), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing leaks to the host
    if d.get("ProtectSystem", ["no"])[-1] == "strict":
        readOnly("/", recursive=True)  # /sys/fs/cgroup too (ProtectControlGroups)
    if yes(d, "ProtectControlGroups"):
        readOnly("/sys/fs/cgroup", recursive=True)
    if yes(d, "PrivateTmp"):
        for tmp in ("/tmp", "/var/tmp"):
            privateTmp(tmp, [CHECKOUT, *writable])
    if not yes(d, "PrivateTmp"):
        raise SystemExit("hardening: teach me a scratch space without PrivateTmp")
    scratch = "/tmp/.hardening"  # in the private /tmp
    os.mkdir(scratch)
    tmpfs(scratch, "0755")
    if yes(d, "PrivateDevices"):
        dev = f"{scratch}/dev"
        os.mkdir(dev)
        tmpfs(dev, "0755", MS_NOEXEC)
        for name in DEVICES:
            Path(dev, name).touch()
            bind(f"/dev/{name}", f"{dev}/{name}")
        os.mkdir(f"{dev}/shm")
        tmpfs(f"{dev}/shm", "1777", MS_NOEXEC)
        for name, target in LINKS:
            os.symlink(target, f"{dev}/{name}")
        mount(dev, "/dev", None, MS_MOVE)
    if yes(d, "ProtectHome"):
        for home in ("/home", "/root", "/run/user"):
            if not os.path.isdir(home):
                continue
            if keep is None or not (keep + "/").startswith(home + "/"):
                tmpfs(home, "0000", MS_RDONLY)
                continue
            os.mkdir(f"{scratch}/keep")
            bind(keep, f"{scratch}/keep")
            tmpfs(home, "0755")
            os.makedirs(keep)
            mount(f"{scratch}/keep", keep, None, MS_MOVE)
            readOnly(home)
    proc = d.get("ProtectProc", ["default"])[-1]
    if proc != "default":
        mount(
            "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, f"hidepid={proc}"
        )
    if yes(d, "ProtectKernelTunables"):
        for path in ("/proc/sys", "/proc/sysrq-trigger", "/sys"):
            if not os.path.exists(path):
                continue
            bind(path, path)
            readOnly(path, recursive=True)
    none = f"{scratch}/inaccessible"
    Path(none).touch(mode=0)
    if yes(d, "ProtectKernelLogs"):
        bind(none, "/proc/kmsg")
        if os.path.exists("/dev/kmsg"):
            bind(none, "/dev/kmsg")
    if yes(d, "ProtectKernelModules"):
        for path in ("/usr/lib/modules", "/lib/modules"):
            if os.path.isdir(path) and not os.path.islink(path):
                tmpfs(path, "0000", MS_RDONLY)
    for path in writable:
        bind(path, path)
        readOnly(path, recursive=True, clear=True)


# --- credentials ----------------------------------------------------------


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


def capabilityNumbers(names: list[str]) -> set[int]:
    numbers = set()
    for value in names:
        for name in value.split():
            if name not in CAPABILITIES:
                raise SystemExit(f"hardening: teach CAPABILITIES {name}")
            numbers.add(CAPABILITIES[name])
    return numbers


def imposeCredentials(d: dict[str, list[str]], user: str) -> None:
    """UMask, LimitNOFILE, CapabilityBoundingSet, User/Group with
    AmbientCapabilities, NoNewPrivileges."""
    os.umask(int(d.get("UMask", ["0022"])[-1], 8))
    if "LimitNOFILE" in d:
        # Up to the hard limit this machine allows (a sandbox may lack
        # CAP_SYS_RESOURCE); the site's systemd sets both to the value.
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = min(int(d["LimitNOFILE"][-1]), hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    if "CapabilityBoundingSet" in d:
        keep = capabilityNumbers(d["CapabilityBoundingSet"])
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if cap not in keep:
                prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    if "User" in d:
        ambient = capabilityNumbers(d.get("AmbientCapabilities", []))
        entry = pwd.getpwnam(user)
        prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
        bits = sum(1 << c for c in ambient)
        data = (CapData * 2)(CapData(bits, bits, bits), CapData(0, 0, 0))
        check(libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), data), "capset")
        for cap in ambient:
            prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0)
        prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0)
    if yes(d, "NoNewPrivileges"):
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if yes(d, "MemoryDenyWriteExecute"):
        # What systemd does on kernels that have it; seccomp otherwise.
        prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)


# Every directive this module imposes; the rest of [Service] says how to
# run the service (ExecStart, Type, ...) or is named in HOW.
IMPOSED = frozenset(
    """ProtectSystem ProtectControlGroups PrivateTmp PrivateDevices ProtectHome
    ProtectProc ProtectKernelTunables ProtectKernelLogs ProtectKernelModules
    ProtectHostname ProtectClock ReadWritePaths StateDirectory RuntimeDirectory
    UMask LimitNOFILE CapabilityBoundingSet User Group AmbientCapabilities
    NoNewPrivileges MemoryDenyWriteExecute RestrictAddressFamilies
    RestrictNamespaces LockPersonality RestrictRealtime RestrictSUIDSGID
    SystemCallFilter SystemCallArchitectures""".split()
)
# How the service runs, not what it may do.
HOW = frozenset(
    """Type NotifyAccess ExecStart ExecReload KillSignal TimeoutStopSec Restart
    RestartSec RuntimeDirectoryMode RuntimeDirectoryPreserve StateDirectoryMode
    ConfigurationDirectory""".split()
)


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit(__doc__)
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    unit, writable, overrides, user = Path(options[0]), [], [], "nobody"
    keep = os.path.realpath(sys.base_prefix)
    it = iter(options[1:])
    for option in it:
        value = next(it)
        if option == "--writable":
            writable.append(os.path.realpath(value))
        elif option == "--set":
            overrides.append(value)
        elif option == "--user":
            user = value
        else:
            raise SystemExit(f"hardening: unknown option {option}")
    d = serviceDirectives(unit)
    for item in overrides:
        key, value = item.split("=", 1)
        d[key] = [value]
    unknown = set(d) - IMPOSED - HOW
    if unknown:
        raise SystemExit(f"hardening: teach me {sorted(unknown)}")
    imposeMounts(d, writable, keep)
    imposeCredentials(d, user)
    imposeSeccomp(d)
    os.execv(command[0], command)  # noqa: S606 (what systemd does next)


if __name__ == "__main__":
    main(sys.argv[1:])
