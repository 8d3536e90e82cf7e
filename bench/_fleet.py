"""
Shared helpers for the benchmarks that drive a real C{twistd -n fleetd}.

L{makeFleet} writes a dev-style configuration (loopback, port 0, dev PKI)
into a directory, with the vault on tmpfs as in production. L{Daemon}
spawns the daemon (optionally pinned to CPUs with C{taskset}), finds its
ports from the C{listen.started} log lines, waits for C{/healthz}, reads
its memory and CPU figures from C{/proc} and stops it with SIGTERM.
L{Admin} is a small owner client of the admin API (client certificate):
device CSV import and provisioning. Loopback only.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from tests.support import writeConfig

ENROLLMENT = "enroll.lolwtf.ca"
LISTEN = re.compile(
    rb"listen\.started (\w+) IPv4Address\(type='TCP', host='[\d.]+', port=(\d+)\)"
)
TWISTD = str(Path(sys.executable).parent / "twistd")

STORM_OVERRIDES: dict[str, dict[str, Any]] = {
    # One source address sends every request: lift the brute-force limits.
    "boot": {
        "failure_burst": 1e6,
        "failure_rate": 1e6,
        "global_failure_burst": 1e7,
        "global_failure_rate": 1e7,
    },
    "limits": {
        "max_connections": 4096,
        "max_connections_per_source": 4096,
        "idle_timeout": 60,
    },
}


@dataclass(frozen=True)
class Node:
    """One simulated machine: what the inventory holds about it."""

    name: str
    serial: str
    uuid: str
    device_class: str = "worker-g1"


def makeNodes(count: int, prefix: str = "node") -> list[Node]:
    """C{count} distinct nodes with deterministic names, serials and uuids."""
    return [
        Node(
            name=f"{prefix}-{i:05d}",
            serial=f"SN{i:08d}",
            uuid=str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{prefix}-{i}.bench")),
        )
        for i in range(1, count + 1)
    ]


def deviceCSV(nodes: Iterable[Node]) -> bytes:
    """The import CSV (C{name,serial,uuid,class}) for C{nodes}."""
    lines = ["name,serial,uuid,class"]
    lines += [f"{n.name},{n.serial},{n.uuid},{n.device_class}" for n in nodes]
    return ("\n".join(lines) + "\n").encode("ascii")


@dataclass(frozen=True)
class Fleet:
    """A configuration directory for one fleetd, and where its state lives."""

    directory: Path
    config: Path
    vault: Path
    pki: DevPKIPaths


def makeFleet(
    directory: Path,
    vault: Path,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Fleet:
    """
    Write a dev-style config into C{directory} with the vault in C{vault}
    (put it on tmpfs, e.g. under C{/dev/shm}) and generate the dev PKI.
    """
    tables: dict[str, dict[str, Any]] = {
        table: dict(keys) for table, keys in (overrides or {}).items()
    }
    tables.setdefault("paths", {})["vault"] = str(vault)
    config = writeConfig(directory, tables)
    ensureDevPKI(directory / "pki", ENROLLMENT)
    return Fleet(directory, config, vault, DevPKIPaths.inside(directory / "pki"))


def procStatus(pid: int, key: str) -> int:
    """A C{/proc/PID/status} figure in KiB (C{VmRSS}, C{VmHWM}, ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for {pid}")


def cpuSeconds(pid: int) -> float:
    """User plus system CPU time of process C{pid}, all threads."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def directorySize(path: Path) -> tuple[int, int, int]:
    """(files, bytes of content, bytes allocated) under C{path}."""
    files = content = allocated = 0
    for entry in path.rglob("*"):
        if entry.is_file():
            st = entry.stat()
            files += 1
            content += st.st_size
            allocated += st.st_blocks * 512
    return files, content, allocated


def tlsContext(ca: Path, clientCert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if clientCert is not None:
        context.load_cert_chain(str(clientCert[0]), str(clientCert[1]))
    return context


def healthy(port: int, context: ssl.SSLContext) -> bool:
    """Whether C{/healthz} on C{port} answers 200 right now."""
    conn = http.client.HTTPSConnection("localhost", port, timeout=2, context=context)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@dataclass
class Daemon:
    """One C{twistd -n fleetd} process over a L{Fleet}."""

    fleet: Fleet
    cpus: str | None = None
    extraArgs: Sequence[str] = ()
    logName: str = "fleetd.log"
    process: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)
    milestones: dict[str, float] = field(default_factory=dict)
    _logOffset: int = 0

    @property
    def log(self) -> Path:
        return self.fleet.directory / self.logName

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def argv(self) -> list[str]:
        argv = [TWISTD, "-n", "--pidfile=", *self.extraArgs]
        argv += ["fleetd", "--config", str(self.fleet.config)]
        if self.cpus is not None:
            argv = ["taskset", "-c", self.cpus, *argv]
        return argv

    def start(
        self,
        timeout: float = 60.0,
        waitFor: bytes | None = None,
        marks: Sequence[bytes] = (),
        probe: Callable[[dict[str, int]], bool] | None = None,
    ) -> float:
        """
        Spawn the daemon; return the seconds until C{/healthz} answered and,
        when given, C{waitFor} appeared in the log written by this start.

        L{milestones} then holds when each of C{marks} (and C{"healthz"})
        was first seen, in seconds from the spawn (to within the polling
        period of about 2 ms). With C{probe}, it is called with the ports
        found so far on each poll until it returns L{True} (C{"probe"} in
        L{milestones}); the start waits for that too.
        """
        self.milestones = {}
        self._logOffset = self.log.stat().st_size if self.log.exists() else 0
        out = open(self.log, "ab")
        started = time.monotonic()
        self.process = subprocess.Popen(
            self.argv(), stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        context = tlsContext(self.fleet.pki.public_ca)
        deadline = started + timeout
        ready = False
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"fleetd exited with {self.process.returncode}: {self.logText()}"
                )
            text = self.logText().encode()
            self.ports = {
                name.decode(): int(port) for name, port in LISTEN.findall(text)
            }
            now = time.monotonic() - started
            for mark in marks:
                if mark in text:
                    self.milestones.setdefault(mark.decode(), now)
            if not ready and "admin" in self.ports:
                ready = healthy(self.ports["admin"], context)
                if ready:
                    self.milestones["healthz"] = time.monotonic() - started
            if probe is not None and "probe" not in self.milestones:
                if probe(self.ports):
                    self.milestones["probe"] = time.monotonic() - started
            probed = probe is None or "probe" in self.milestones
            if ready and probed and (waitFor is None or waitFor in text):
                return time.monotonic() - started
            time.sleep(0.002)
        self.stop()
        raise RuntimeError(f"fleetd not ready within {timeout} s: {self.logText()}")

    def logText(self) -> str:
        """The log written since the last start."""
        with open(self.log, "rb") as f:
            f.seek(self._logOffset)
            return f.read().decode("utf-8", "replace")

    def stop(self, timeout: float = 60.0) -> float:
        """SIGTERM; return the seconds until the process exited."""
        if self.process is None or self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise RuntimeError("fleetd did not stop on SIGTERM") from None
        return time.monotonic() - started

    def rssKiB(self) -> int:
        return procStatus(self.pid, "VmRSS")

    def hwmKiB(self) -> int:
        return procStatus(self.pid, "VmHWM")

    def cpu(self) -> float:
        return cpuSeconds(self.pid)


class Admin:
    """The owner's client of the admin API (one TLS connection per call)."""

    def __init__(self, fleet: Fleet, port: int) -> None:
        pki = fleet.pki.directory
        self.port = port
        self.context = tlsContext(
            fleet.pki.public_ca, (pki / "owner.pem", pki / "owner.key")
        )

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        contentType: str = "application/json",
        timeout: float = 600.0,
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection(
            "localhost", self.port, timeout=timeout, context=self.context
        )
        try:
            headers = {} if body is None else {"content-type": contentType}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def importDevices(self, nodes: Sequence[Node], perRequest: int = 20_000) -> None:
        """Import C{nodes} by CSV, C{perRequest} rows a request."""
        for i in range(0, len(nodes), perRequest):
            chunk = nodes[i : i + perRequest]
            status, body = self.call(
                "POST", "/v1/admin/devices/import", deviceCSV(chunk), "text/csv"
            )
            if status != 200 or json.loads(body) != {"imported": len(chunk)}:
                raise RuntimeError(f"import: {status} {body[:200]!r}")

    def provision(
        self, names: Sequence[str], perRequest: int = 1000
    ) -> dict[str, tuple[str, str]]:
        """Provision one run per name; return C{{name: (run, code)}}."""
        runs: dict[str, tuple[str, str]] = {}
        for i in range(0, len(names), perRequest):
            chunk = list(names[i : i + perRequest])
            status, body = self.call(
                "POST", "/v1/admin/provision", json.dumps({"devices": chunk}).encode()
            )
            if status != 201:
                raise RuntimeError(f"provision: {status} {body[:200]!r}")
            for entry in json.loads(body)["runs"]:
                runs[entry["device"]] = (entry["run"], entry["code"])
        if set(runs) != set(names):
            raise RuntimeError("provision: some devices got no run")
        return runs


def configPath(node: Node, code: str) -> str:
    """The C{/config} request Talos makes for C{node} with C{code}."""
    return f"/config?code={code}&uuid={node.uuid}&serial={node.serial}"


def getConfig(port: int, context: ssl.SSLContext, path: str) -> tuple[int, bytes]:
    """One C{GET} on the boot listener over a new TLS connection."""
    conn = http.client.HTTPSConnection("localhost", port, timeout=30, context=context)
    try:
        conn.request("GET", path, headers={"connection": "close"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


METRIC = re.compile(
    rb'^fleetd_config_requests_total\{outcome="(\w+)"\} ([\d.e+]+)$', re.M
)


def configOutcomes(port: int, ca: Path) -> dict[str, float]:
    """fleetd's C{/config} outcome counters, from C{/metrics} on the admin port."""
    conn = http.client.HTTPSConnection(
        "localhost", port, timeout=10, context=tlsContext(ca)
    )
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read()
    finally:
        conn.close()
    return {name.decode(): float(value) for name, value in METRIC.findall(text)}
