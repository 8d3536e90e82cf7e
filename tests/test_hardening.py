"""
The shipped unit's hardening is part of the contract (design.md,
Listeners; issue 27, item 1): C{twistd -n fleetd} runs under every
directive C{conf/fleetd.service} sets, imposed by L{tests.hardening} the
way systemd imposes it, and completes a TLS handshake with ALPN on each
TLS listener.

C{MemoryDenyWriteExecute=yes} (the kernel's C{PR_SET_MDWE}) broke every
handshake: pyOpenSSL's ALPN, SNI and verify hooks are cffi callbacks, and
cffi allocates them writable and executable. The unit no longer sets it;
L{MemoryDenyWriteExecuteTests} keeps the reason honest.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import pwd
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest, SynchronousTestCase, TestCase

from fleetd.pki.dev import DevPKIPaths
from tests.hardening import HOW, IMPOSED, serviceDirectives
from tests.support import REPO, missingPeer, writeConfig
from tests.test_twistd import TWISTD, Twistd, proto_pid

UNIT = REPO / "conf" / "fleetd.service"
NOBODY = "nobody"
# What a probe under the unit reports (see PROBE).
PROBE = r"""
import ctypes, errno, json, os, socket
status = dict(line.split(":\t", 1) for line in open("/proc/self/status")
              if ":\t" in line)
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def lowBind():
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(os.environ["LOW_PORT"])))
print(json.dumps({
    "uid": os.getuid(),
    **{k: status[k].strip() for k in
       ("CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")},
    "etc": attempt(lambda: open("/etc/fleetd-hardening-probe", "w")),
    "tmp": attempt(lambda: open("/tmp/probe", "w").close()),
    "home": attempt(lambda: os.listdir("/home")),
    "dev": sorted(os.listdir("/dev")),
    "packet": attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)),
    "netlink": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),
    "inet6": attempt(lambda: socket.socket(socket.AF_INET6).close()),
    "sysctl": attempt(lambda: open("/proc/sys/kernel/hostname", "w")),
    "setuid-bit": attempt(lambda: os.chmod("/tmp/probe", 0o4755)),
    # The owners of the processes it sees (others of its own user, such as
    # a hardened daemon of a test running beside it, stay visible).
    "processes": sorted({os.stat(f"/proc/{p}").st_uid for p in os.listdir("/proc")
                         if p.isdigit()}),
    "low-port": attempt(lowBind),
    "mdwe": ctypes.CDLL(None).prctl(66, 0, 0, 0, 0),
}))
"""


def requireHardening() -> None:
    """The launcher needs root (namespaces, setuid) and two system packages."""
    if os.geteuid() != 0:
        raise SkipTest("imposing the unit's hardening needs root")
    if shutil.which("systemd-analyze") is None:
        raise missingPeer("systemd-analyze (Debian systemd) is not installed")
    if ctypes.util.find_library("seccomp") is None:
        raise missingPeer("libseccomp (Debian libseccomp2) is not installed")


def privilegedPort() -> int:
    """A free loopback port below 1024 (only CAP_NET_BIND_SERVICE binds it)."""
    for port in random.sample(range(600, 1024), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below 1024 on 127.0.0.1")


def hardened(*command: str, directory: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """
    argv: C{command} under the unit's hardening, C{directory} writable
    (run from the checkout: the launcher is C{tests.hardening}).
    """
    launcher = [sys.executable, "-m", "tests.hardening", str(UNIT)]
    return [*launcher, "--writable", str(directory), "--user", NOBODY, *extra,
            "--", *command]  # fmt: skip


def ownedByNobody(directory: Path) -> None:
    """The state directory belongs to the service's user (StateDirectory=)."""
    entry = pwd.getpwnam(NOBODY)
    os.chown(directory, entry.pw_uid, entry.pw_gid)
    for parent in directory.parents:  # trial's mktemp parents are 0700
        if parent == REPO:
            break
        parent.chmod(parent.stat().st_mode | 0o711)


def handshake(port: int, ca: Path, alpn: str) -> tuple[str | None, str | None]:
    """A TLS handshake offering C{alpn}; (TLS version, the protocol chosen)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols([alpn])
    with socket.create_connection(("127.0.0.1", port), 10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.version(), tls.selected_alpn_protocol()


def spawnHardened(
    test: TestCase, config: Path, directory: Path, *extra: str, env: dict[str, str]
) -> Twistd:
    """C{twistd -n fleetd} as the unit's ExecStart runs it, under its hardening."""
    proto = Twistd()
    command = [*TWISTD, "-n", "--pidfile=", "fleetd", "--config", str(config)]
    argv = hardened(*command, directory=directory, extra=extra)
    transport = reactor.spawnProcess(proto, argv[0], argv, env=env, path=str(REPO))

    def cleanup() -> Deferred[Any] | None:
        if not proto.ended.called:
            try:
                transport.signalProcess("KILL")
            except ProcessExitedAlready:
                pass
            return proto.ended
        return None

    test.addCleanup(cleanup)
    return proto


def daemonEnvironment(**extra: str) -> dict[str, str]:
    drop = ("FLEETD_CONFIG", "NOTIFY_SOCKET")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


class UnitDirectiveTests(SynchronousTestCase):
    def test_unit_everyDirectiveImposed(self) -> None:
        """
        Each directive of the unit's [Service] section is imposed by the
        test launcher, or says how the service runs: a new hardening
        directive cannot ship without a test running fleetd under it.
        """
        directives = set(serviceDirectives(UNIT))
        self.assertEqual(directives - IMPOSED - HOW, set())
        self.assertIn("SystemCallFilter", directives)


class LauncherTests(TestCase):
    """The launcher imposes what the unit says (or a test would prove nothing)."""

    timeout = 60

    def setUp(self) -> None:
        requireHardening()
        self.directory = Path(self.mktemp()).resolve()
        self.directory.mkdir(parents=True)
        ownedByNobody(self.directory)

    def launch(self, *command: str, extra: tuple[str, ...] = ()) -> Any:
        return subprocess.run(
            hardened(*command, directory=self.directory, extra=extra),
            capture_output=True, text=True, timeout=60, cwd=REPO,
            env={**os.environ, "LOW_PORT": str(privilegedPort())},
        )  # fmt: skip

    def test_probe_seesEachDirective(self) -> None:
        """
        A process under the unit runs as an unprivileged user holding
        CAP_NET_BIND_SERVICE alone (bounding and ambient sets) with no new
        privileges and a seccomp filter; / is read-only and /tmp private;
        /home is hidden; /dev holds only the basic nodes; only AF_UNIX,
        AF_INET and AF_INET6 sockets open; /proc/sys is read-only and
        other processes invisible; a set-uid bit cannot be set; it binds
        a port below 1024. With --set MemoryDenyWriteExecute=yes the
        kernel's MDWE is on.
        """
        done = self.launch(sys.executable, "-c", PROBE,
                        extra=("--set", "MemoryDenyWriteExecute=yes"))  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr)
        probe = json.loads(done.stdout)
        netBindService = f"{1 << 10:016x}"
        self.assertEqual(
            probe,
            {
                "uid": pwd.getpwnam(NOBODY).pw_uid,
                "CapEff": netBindService,
                "CapBnd": netBindService,
                "CapAmb": netBindService,
                "NoNewPrivs": "1",
                "Seccomp": "2",
                "etc": "EROFS",
                "tmp": "ok",
                "home": "EACCES",
                "dev": sorted(
                    [
                        "full",
                        "null",
                        "random",
                        "tty",
                        "urandom",
                        "zero",
                        "fd",
                        "stdin",
                        "stdout",
                        "stderr",
                        "shm",
                    ]
                ),
                "packet": "EAFNOSUPPORT",
                "netlink": "EAFNOSUPPORT",
                "inet6": "ok",
                "sysctl": "EROFS",
                "setuid-bit": "EPERM",
                "processes": [pwd.getpwnam(NOBODY).pw_uid],
                "low-port": "ok",
                "mdwe": 1,
            },
        )

    def test_syscallOutsideTheFilter_killed(self) -> None:
        """
        SystemCallFilter is an allow-list: a call it removes
        (setpriority, in ~@resources) kills the process with SIGSYS, as
        systemd's default action does.
        """
        done = self.launch(sys.executable, "-c", "import os; os.setpriority(0, 0, 5)")
        self.assertEqual(done.returncode, -signal.SIGSYS, done.stderr)


class MemoryDenyWriteExecuteTests(SynchronousTestCase):
    """Why the unit does not set MemoryDenyWriteExecute (issue 27, item 1)."""

    def test_cffiCallbacks_needWriteExecute(self) -> None:
        """
        Under PR_SET_MDWE, pyOpenSSL cannot install the ALPN select
        callback that Twisted puts on every server context (nor SNI or
        verify callbacks): cffi has no memory for them. When this fails,
        a newer cffi or pyOpenSSL has lifted the reason the unit gives,
        and MemoryDenyWriteExecute=yes can come back with its test.
        """
        code = (
            "import ctypes\n"
            "assert ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) == 0\n"
            "from OpenSSL import SSL\n"
            "try:\n"
            "    context = SSL.Context(SSL.TLS_METHOD)\n"
            "    context.set_alpn_select_callback(lambda c, p: p[0])\n"
            "except MemoryError as e:\n"
            "    print('refused:', e)\n"
        )  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        if "Invalid argument" in done.stderr:  # a kernel before 6.3
            raise SkipTest("this kernel has no PR_SET_MDWE")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("refused: Cannot allocate write+execute memory", done.stdout)
        unit = UNIT.read_text()
        self.assertNotIn("\nMemoryDenyWriteExecute=yes", unit)
        self.assertIn("# MemoryDenyWriteExecute", unit)


class HardenedDaemonTests(TestCase):
    """twistd -n fleetd under the shipped unit's hardening serves TLS."""

    timeout = 180

    def setUp(self) -> None:
        requireHardening()

    async def test_shippedUnit_tlsHandshakeOnEveryListener(self) -> None:
        """
        Under every directive conf/fleetd.service sets (as an
        unprivileged user, the boot listener below 1024), fleetd says
        ready and each TLS listener completes a handshake with ALPN:
        http/1.1 on boot, device and admin, h2 on tink.
        """
        directory = Path(self.mktemp()).resolve()
        low = privilegedPort()
        config = writeConfig(
            directory, {"listen": {"boot": f"tcp:{low}:interface=127.0.0.1"}}
        )
        ownedByNobody(directory)
        proto = spawnHardened(self, config, directory, env=daemonEnvironment())
        ready = Deferred.fromCoroutine(proto.ready())
        await ready.addTimeout(90, reactor)
        self.assertEqual(proto.ports["boot"], low)  # as nobody, CAP_NET_BIND_SERVICE
        ca = DevPKIPaths.inside(directory / "pki").public_ca
        chosen = {}
        for name in ("boot", "device", "admin", "tink"):
            alpn = "h2" if name == "tink" else "http/1.1"
            try:
                chosen[name] = await deferToThread(
                    handshake, proto.ports[name], ca, alpn
                )
            except (OSError, ssl.SSLError) as e:
                chosen[name] = ("failed", repr(e))
        self.assertEqual(
            chosen,
            {
                "boot": ("TLSv1.3", "http/1.1"),
                "device": ("TLSv1.3", "http/1.1"),
                "admin": ("TLSv1.3", "http/1.1"),
                "tink": ("TLSv1.3", "h2"),
            },
            proto.out.decode("utf-8", "replace")[-2000:],
        )
        os.kill(proto_pid(proto), signal.SIGTERM)
        self.assertEqual(await proto.ended, 0, proto.err)
        self.assertNotIn(b"Traceback", proto.out + proto.err)

    async def test_underMDWE_neverReady(self) -> None:
        """
        Issue 27, item 2: under the unit with MemoryDenyWriteExecute=yes
        put back (every handshake fails), fleetd never says ready: systemd
        hears STATUS lines naming the listeners and no READY=1.
        """
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory)
        ownedByNobody(directory)
        name = f"fleetd-hardening-{os.getpid()}-{id(self)}"
        systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(systemd.close)
        systemd.bind("\0" + name)
        systemd.settimeout(60)
        env = daemonEnvironment(NOTIFY_SOCKET="@" + name)
        proto = spawnHardened(
            self, config, directory, "--set", "MemoryDenyWriteExecute=yes", env=env
        )
        heard: list[bytes] = []
        listeners = [f"listener {n}: ".encode() for n in ("boot", "device", "tink")]
        while not heard or not all(n in heard[-1] for n in listeners):
            heard.append(await deferToThread(systemd.recv, 4096))
            self.assertNotIn(b"READY=1", heard[-1])
        self.assertTrue(heard[-1].startswith(b"STATUS=starting: listener admin: "))
        for _ in range(300):  # the runs load, and still no READY=1
            if b"runs.loaded" in proto.out:
                break
            await deferLater(reactor, 0.1, lambda: None)
        await deferLater(reactor, 1, lambda: None)
        systemd.setblocking(False)
        while True:
            try:
                heard.append(systemd.recv(4096))
            except BlockingIOError:
                break
        self.assertIn(b"runs.loaded", proto.out)
        self.assertNotIn(b"READY=1", b"\n".join(heard).split(b"\n"))
        self.assertNotIn(b"fleetd.ready", proto.out)
        self.assertIn(b"selfcheck.failed", proto.out)
        os.kill(proto_pid(proto), signal.SIGTERM)
        self.assertEqual(await proto.ended, 0, proto.err)
