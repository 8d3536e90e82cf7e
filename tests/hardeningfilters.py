"""
The seccomp part of the unit's hardening (L{tests.hardening}): systemd's
syscall groups as the installed C{systemd-analyze} lists them, and
filters built with libseccomp (the library systemd uses) through
C{ctypes}, loaded into the calling process before it execs the service.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import shutil
import subprocess


def yes(directives: dict[str, list[str]], key: str) -> bool:
    """Whether a boolean directive is on (its last value wins)."""
    return directives.get(key, ["no"])[-1].lower() in ("yes", "true", "1", "on")


NAMESPACE_FLAGS = {
    "cgroup": 0x02000000, "ipc": 0x08000000, "mnt": 0x00020000,
    "net": 0x40000000, "pid": 0x20000000, "user": 0x10000000,
    "uts": 0x04000000, "time": 0x00000080,
}  # fmt: skip

SCMP_ACT_KILL_PROCESS, SCMP_ACT_ALLOW = 0x80000000, 0x7FFF0000
SCMP_FLTATR_ACT_BADARCH = 2
SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_GE, SCMP_CMP_MASKED_EQ = 1, 4, 5, 7
AF = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
AF_LIMIT = 64  # above AF_MAX (46 on Linux 6.x)
S_ISUID, S_ISGID, O_CREAT = 0o4000, 0o2000, 0o100
SCHED_FIFO, SCHED_RR = 1, 2
# Calls that set a mode, and which argument holds it (RestrictSUIDSGID).
MODE_ARGUMENT = (
    ("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("creat", 1),
    ("mkdir", 1), ("mkdirat", 2), ("mknod", 1), ("mknodat", 2),
)  # fmt: skip


def ERRNO(code: int) -> int:
    return 0x00050000 | code


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_uint),
                ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]  # fmt: skip


class Filter:
    """One seccomp filter, built with libseccomp and loaded into this process."""

    def __init__(self, default: int) -> None:
        path = ctypes.util.find_library("seccomp")
        if path is None:
            raise SystemExit("hardening: libseccomp is not installed")
        self.lib = ctypes.CDLL(path)
        self.lib.seccomp_init.restype = ctypes.c_void_p
        self.lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        self.ctx = ctypes.c_void_p(self.lib.seccomp_init(ctypes.c_uint32(default)))
        if not self.ctx:
            raise SystemExit("hardening: seccomp_init failed")

    def number(self, name: str) -> int:
        return int(self.lib.seccomp_syscall_resolve_name(name.encode()))

    def rule(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        nr = self.number(name)
        if nr < 0:
            return  # not a syscall of this architecture
        array = (ArgCmp * max(len(cmps), 1))(*[ArgCmp(*c) for c in cmps])
        result = self.lib.seccomp_rule_add_array(
            self.ctx, ctypes.c_uint32(action), ctypes.c_int(nr),
            ctypes.c_uint(len(cmps)), array,
        )  # fmt: skip
        if result != 0:
            raise SystemExit(f"hardening: seccomp rule {name}{cmps}: {result}")

    def load(self) -> None:
        if self.lib.seccomp_load(self.ctx) != 0:
            raise SystemExit("hardening: seccomp_load failed")
        self.lib.seccomp_release(self.ctx)


def syscallGroups() -> dict[str, list[str]]:
    """systemd's syscall groups (C{@system-service}, ...), as it ships them."""
    if shutil.which("systemd-analyze") is None:
        raise SystemExit("hardening: systemd-analyze is not installed")
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    groups: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.split()[0], [])
        elif line.startswith("    ") and not line.strip().startswith("#"):
            current.append(line.strip())
    return groups


def expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    found: set[str] = set()
    for name in names:
        found |= expand(groups[name], groups) if name.startswith("@") else {name}
    return found


# The syscall part of each Protect* directive: off the allow-list.
PROTECTED_SYSCALLS = (
    ("ProtectClock", ["@clock"]),
    ("ProtectKernelModules", ["@module"]),
    ("ProtectKernelLogs", ["syslog"]),
    ("ProtectHostname", ["sethostname", "setdomainname"]),
)


def allowedSyscalls(
    d: dict[str, list[str]], groups: dict[str, list[str]]
) -> set[str] | None:
    """
    The allow-list that SystemCallFilter= builds, as systemd reads it: the
    first line decides allow or deny; a C{~} line then removes from an
    allow-list. The Protect* directives' syscall parts are removed too.
    L{None}: no allow-list.
    """
    allowed: set[str] | None = None
    for value in d.get("SystemCallFilter", []):
        deny = value.startswith("~")
        names = expand(value.lstrip("~").split(), groups)
        if allowed is None:
            if deny:
                raise SystemExit("hardening: teach me deny-list SystemCallFilter")
            allowed = expand(["@default"], groups) | names
        elif deny:
            allowed -= names
        else:
            allowed |= names
    if allowed is not None:
        for key, removed in PROTECTED_SYSCALLS:
            if yes(d, key):
                allowed -= expand(removed, groups)
    return allowed


def imposeSeccomp(d: dict[str, list[str]]) -> None:
    """RestrictAddressFamilies, RestrictNamespaces, LockPersonality,
    RestrictRealtime, RestrictSUIDSGID; then SystemCallFilter (the last
    filter: C{seccomp} itself is not on its allow-list) with
    SystemCallArchitectures=native (the filter's only architecture)."""
    args = Filter(SCMP_ACT_ALLOW)
    if "RestrictAddressFamilies" in d:
        families = {AF[n] for v in d["RestrictAddressFamilies"] for n in v.split()}
        for family in set(range(AF_LIMIT)) - families:
            args.rule(ERRNO(errno.EAFNOSUPPORT), "socket", (0, SCMP_CMP_EQ, family, 0))
        args.rule(ERRNO(errno.EAFNOSUPPORT), "socket", (0, SCMP_CMP_GE, AF_LIMIT, 0))
    if yes(d, "RestrictNamespaces"):
        args.rule(ERRNO(errno.EPERM), "setns")
        args.rule(ERRNO(errno.ENOSYS), "clone3")  # its flags are behind a pointer
        for flag in NAMESPACE_FLAGS.values():
            for name in ("unshare", "clone"):
                args.rule(ERRNO(errno.EPERM), name, (0, SCMP_CMP_MASKED_EQ, flag, flag))
    if yes(d, "LockPersonality"):
        args.rule(ERRNO(errno.EPERM), "personality", (0, SCMP_CMP_NE, 0, 0))
    if yes(d, "RestrictRealtime"):
        for policy in (SCHED_FIFO, SCHED_RR):
            args.rule(
                ERRNO(errno.EPERM), "sched_setscheduler", (1, SCMP_CMP_EQ, policy, 0)
            )
        args.rule(ERRNO(errno.EPERM), "sched_setattr")
    if yes(d, "RestrictSUIDSGID"):
        for bit in (S_ISUID, S_ISGID):
            for name, mode in MODE_ARGUMENT:
                args.rule(
                    ERRNO(errno.EPERM), name, (mode, SCMP_CMP_MASKED_EQ, bit, bit)
                )
            for name, flags in (("open", 1), ("openat", 2)):
                args.rule(ERRNO(errno.EPERM), name,
                          (flags, SCMP_CMP_MASKED_EQ, O_CREAT, O_CREAT),
                          (flags + 1, SCMP_CMP_MASKED_EQ, bit, bit))  # fmt: skip
    allowed = allowedSyscalls(d, syscallGroups())
    if allowed is not None:
        if d.get("SystemCallArchitectures", ["native"])[-1] != "native":
            raise SystemExit("hardening: teach me SystemCallArchitectures")
        lists = Filter(SCMP_ACT_KILL_PROCESS)  # systemd's default action
        lists.lib.seccomp_attr_set(lists.ctx, SCMP_FLTATR_ACT_BADARCH,
                                   ctypes.c_uint32(SCMP_ACT_KILL_PROCESS))  # fmt: skip
        for name in sorted(allowed):
            lists.rule(SCMP_ACT_ALLOW, name)
    args.load()
    if allowed is not None:
        lists.load()
