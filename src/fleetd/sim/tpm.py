"""
Real software TPMs for the simulator's nodes (and the tests): swtpm on
loopback, EK certificates from C{swtpm_setup --create-ek-cert} signed by
the dev PKI's TPM manufacturer CA, and tpm2-abrmd in front of one on a
private D-Bus session bus, as /dev/tpmrm0 is on a node.

Each L{SWTPM} runs on its own free loopback ports and state directory;
each C{stop} shuts its process down (SIGTERM, then SIGKILL) and is safe
to call twice. Blocking calls: Twisted callers use C{deferToThread}.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fleetd.attest.tpm import canonicalSPKI, ekDigest
from fleetd.pki.dev import DevPKIPaths, swtpmLocalCA

AVAILABLE = all(shutil.which(t) for t in ("swtpm", "swtpm_setup", "swtpm_localca"))

# Shown each command before it runs (scripts/agent_demo.py prints them).
Echo = Callable[[Sequence[str]], None]


def _quiet(argv: Sequence[str]) -> None:
    pass


def freePortPair() -> int:
    """
    A port P on 127.0.0.1 with P and P+1 free now (swtpm's data and control
    ports: the swtpm TCTI expects the control port at P+1). Chosen below the
    kernel's ephemeral range, so client connections do not collide with it.
    """
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(20000, 32000, 2)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
        except OSError:
            continue
        return base
    raise RuntimeError("no free loopback port pair")


def stopPid(pid: int) -> None:
    """SIGTERM a daemon that is not our child; SIGKILL it after 5 s."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)


class SWTPM:
    """One swtpm process with its own manufactured state."""

    def __init__(
        self,
        directory: Path,
        pki: DevPKIPaths,
        *,
        tpm2: bool = True,
        echo: Echo = _quiet,
    ) -> None:
        directory = directory.resolve()  # swtpm --daemon leaves the cwd
        self.directory = directory
        self.tpm2 = tpm2
        self.echo = echo
        self.state = directory / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        config = swtpmLocalCA(pki, directory / "ca")
        args = ["swtpm_setup", "--tpmstate", str(self.state), "--create-ek-cert"]
        if tpm2:
            (directory / "certs").mkdir(exist_ok=True)
            args += ["--tpm2", "--lock-nvram"]
            args += ["--write-ek-cert-files", str(directory / "certs")]
        else:
            args += ["--createek"]
        args += [
            "--config", str(config),
            "--overwrite",
            "--logfile", str(directory / "setup.log"),
        ]  # fmt: skip
        echo(args)
        subprocess.run(args, check=True, capture_output=True, timeout=60)
        self.port = 0
        self.pid: int | None = None

    def clone(self, directory: Path) -> SWTPM:
        """A second TPM with the same state (the same EK): a cloned TPM."""
        twin = object.__new__(SWTPM)
        directory = directory.resolve()
        twin.directory, twin.tpm2, twin.echo = directory, self.tpm2, self.echo
        twin.state = directory / "state"
        shutil.copytree(self.state, twin.state)
        twin.port, twin.pid = 0, None
        return twin

    @property
    def tcti(self) -> str:
        return f"swtpm:host=127.0.0.1,port={self.port}"

    def start(self) -> None:
        self.port = freePortPair()
        pidFile = self.directory / "swtpm.pid"
        pidFile.unlink(missing_ok=True)
        args = [
            "swtpm", "socket",
            "--tpmstate", f"dir={self.state}",
            "--server", f"type=tcp,port={self.port},bindaddr=127.0.0.1",
            "--ctrl", f"type=tcp,port={self.port + 1},bindaddr=127.0.0.1",
            "--flags", "not-need-init,startup-clear",
            "--daemon", "--pid", f"file={pidFile}",
            "--log", f"file={self.directory / 'swtpm.log'}",
        ]  # fmt: skip
        if self.tpm2:
            args.insert(2, "--tpm2")
        self.echo(args)
        subprocess.run(args, check=True, capture_output=True, timeout=30)
        self.pid = int(pidFile.read_text().strip())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.01)
        raise RuntimeError("swtpm did not start listening")

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            stopPid(pid)

    def ekCertificates(self) -> dict[str, bytes]:
        """The EK certificates swtpm_setup wrote (for direct checks)."""
        return {p.name: p.read_bytes() for p in (self.directory / "certs").glob("*")}


def _tabrmdTCTI() -> bool:
    import ctypes.util

    return ctypes.util.find_library("tss2-tcti-tabrmd") is not None


def _tpm2Provider() -> bool:
    """Whether OpenSSL's modules directory has the tpm2 provider."""
    if shutil.which("openssl") is None:
        return False
    probe = subprocess.run(
        ["openssl", "version", "-m"], capture_output=True, timeout=30, check=False
    )
    _, _, quoted = probe.stdout.decode().partition(":")
    return Path(quoted.strip().strip('"'), "tpm2.so").is_file()


# A resource manager for swtpm (tpm2-abrmd on a private D-Bus session bus)
# and OpenSSL's tpm2 provider: what mTLS with the TPM key needs.
RM_AVAILABLE = (
    AVAILABLE
    and all(shutil.which(t) for t in ("tpm2-abrmd", "dbus-daemon", "dbus-send"))
    and _tabrmdTCTI()
    and _tpm2Provider()
)


class SessionBus:
    """A private D-Bus session bus (C{dbus-daemon --session --fork})."""

    def __init__(self, directory: Path, echo: Echo = _quiet) -> None:
        self.directory = directory
        self.echo = echo
        self.address = ""
        self.pid: int | None = None

    def start(self) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        printed = self.directory / "dbus.out"
        args = ["dbus-daemon", "--session", "--fork", "--nopidfile",
                "--print-address=1", "--print-pid=1"]  # fmt: skip
        self.echo(args)
        with printed.open("wb") as sink:
            subprocess.run(args, stdout=sink, check=True, timeout=30)
        address, pid = printed.read_text().split()[:2]
        self.address, self.pid = address, int(pid)
        return address

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            stopPid(pid)


class ResourceManager:
    """tpm2-abrmd in front of one L{SWTPM}, as /dev/tpmrm0 is on a node."""

    def __init__(self, tpm: SWTPM, directory: Path, bus: SessionBus | None) -> None:
        """
        @param bus: the (started) session bus to register on; L{None} for
            the one L{sessionAddress} names.
        """
        self.tpm = tpm
        self.directory = directory
        self.bus = bus
        self.name = f"com.intel.tss2.Tabrmd.fleetd{os.getpid()}p{tpm.port}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def tcti(self) -> str:
        return f"tabrmd:bus_name={self.name},bus_type=session"

    def sessionAddress(self) -> str:
        """The bus address when no bus was given (a subclass says which)."""
        raise RuntimeError("no session bus")

    def start(self) -> None:
        echo: Echo = _quiet
        if self.bus is None:
            address = self.sessionAddress()
        else:
            address, echo = self.bus.address, self.bus.echo
        env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": address}
        args = ["tpm2-abrmd", "--session", "--flush-all",
                f"--dbus-name={self.name}", f"--tcti={self.tpm.tcti}"]  # fmt: skip
        if os.geteuid() == 0:
            args.append("--allow-root")
        echo(args)
        log = (self.directory / "abrmd.log").open("wb")
        self.process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()
        ask = ["dbus-send", "--session", "--print-reply",
               "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
               "org.freedesktop.DBus.NameHasOwner", f"string:{self.name}"]  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            owned = subprocess.run(
                ask, capture_output=True, timeout=10, check=False, env=env
            )
            if b"boolean true" in owned.stdout:
                return
            time.sleep(0.02)
        raise RuntimeError("tpm2-abrmd did not come up")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ekDigestOf(der: bytes) -> str:
    """SHA-256 of the EK's DER SubjectPublicKeyInfo, as evidence names it."""
    key = x509.load_der_x509_certificate(der).public_key()
    return ekDigest(
        canonicalSPKI(key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo))
    )
