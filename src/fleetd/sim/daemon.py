"""
The fleetd a rack runs against: one already running (C{--config FILE},
e.g. C{make run}'s), or one the sim starts on a temporary state directory
(a dev config on free loopback ports, the dev PKI generated, its Tink
upstream the sim's stand-in), stopped when the rack is done.

Blocking functions: they run before the rack's reactor starts and after
it stops.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetd.config import TinkSettings
from fleetd.pki.dev import DevPKIPaths, devConfigTables, ensureDevPKI
from fleetd.sim.hookos import CLASS
from fleetd.topology import loadTopology

BIN = Path(sys.executable).parent  # the venv's console scripts
ENROLLMENT = "enroll.lolwtf.ca"
TOPOLOGY = {
    "SPORE_IP": "10.20.0.5",
    "SPORE_BOOTSTRAP_IP": "10.20.0.6",
    "enrollment_name": ENROLLMENT,
    "anchors": [
        {"name": "anchor-a", "dns": "127.0.0.2"},
        {"name": "anchor-b", "dns": "127.0.0.3"},
    ],
}
# A Talos worker template (conf/templates/default.yaml's shape): fleetd
# patches the node's hostname, install disk and labels into it, and its
# KMS's systemDiskEncryption where the marker is for a class that opts in
# (fleetd.runs.diskencryption; the line goes for any other).
TEMPLATE = """\
version: v1alpha1
debug: false
persist: true
machine:
  type: worker
  token: sim-trustd-token
  ca: {crt: c2ltLW1hY2hpbmUtY2E=, key: ""}
  network: {}
  install: {disk: /dev/sda, image: "ghcr.io/siderolabs/installer:v1.9.0"}
  nodeLabels: {}
  systemDiskEncryption: FLEETD-KMS
cluster:
  controlPlane: {endpoint: "https://127.0.0.1:6443"}
  clusterName: sim
  token: sim.bootstraptoken
  ca: {crt: c2ltLWNsdXN0ZXItY2E=, key: ""}
"""

PidOf = Callable[[], int | None]


class Started:
    """
    Every process the sim started, with how to stop it: L{stopAll} stops
    them newest first (each stop is safe to call twice) and says which
    pids are gone, one line a test can check against C{/proc}.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: list[
            tuple[str, Callable[[], int | None], Callable[[], None]]
        ] = []

    def add(
        self, what: str, pid: Callable[[], int | None], stop: Callable[[], None]
    ) -> None:
        """C{what} is (or is about to be) running; C{pid} reads its pid."""
        with self._lock:
            self._started.append((what, pid, stop))

    def stopAll(self) -> str:
        with self._lock:
            started, self._started = self._started, []
        stopped: dict[str, list[str]] = {}
        for what, pid, stop in reversed(started):
            number = pid()
            stop()
            if number is not None:
                stopped.setdefault(what, []).append(str(number))
        listed = "; ".join(f"{w} {' '.join(p)}" for w, p in sorted(stopped.items()))
        return f"stopped: {listed or 'nothing'}"

    def stopNewest(self, what: str) -> int | None:
        """Stop the newest process named C{what} now and forget it (a
        spore reboot stops fleetd); its pid."""
        with self._lock:
            found = [i for i, s in enumerate(self._started) if s[0] == what]
            if not found:
                return None
            _, pid, stop = self._started.pop(found[-1])
        number = pid()
        stop()
        return number


class DaemonFailed(Exception):
    """The sim's own fleetd did not come up (its log's tail)."""


@dataclass(frozen=True)
class Fleetd:
    """Where a fleetd answers, read from its config file."""

    config: Path
    pki: DevPKIPaths
    admin: str
    device: str
    boot: int
    tink: int
    upstream: int
    # tink.min_reboot: how long after a workflow's end a node's return to
    # HookOS counts as a boot [B2]; the pxe-first faults wait that long.
    minReboot: float = TinkSettings.min_reboot
    # The config has [kms]: fleetd is the site's KMS (issue 30). Where a
    # node reaches it is what its delivered configuration says.
    kms: bool = False
    # topology's enrollment_name: what a node's KMS endpoint must name.
    enrollment: str = ENROLLMENT

    @classmethod
    def fromConfig(cls, config: Path) -> Fleetd:
        with config.open("rb") as f:
            tables: dict[str, Any] = tomllib.load(f)
        base = config.parent

        def port(name: str) -> int:
            # tcp:PORT[:interface=...]
            return int(str(tables["listen"][name]).split(":")[1])

        ekRoots = (base / tables["attest"]["ek_roots"]).resolve()
        topology = loadTopology(base / str(tables["site"]["topology"]))
        return cls(
            config=config,
            pki=DevPKIPaths.inside(ekRoots.parent),
            admin=str(tables["owner"].get("server", "https://localhost:8446")),
            device=f"https://localhost:{port('device')}",
            boot=port("boot"),
            tink=port("tink"),
            # tcp:HOST:PORT, the tink-server the proxy forwards to
            upstream=int(str(tables["tink"]["upstream"]).rsplit(":", 1)[1]),
            minReboot=float(tables["tink"].get("min_reboot", TinkSettings.min_reboot)),
            kms="kms" in tables,
            enrollment=topology.enrollment_name,
        )


def freePort() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def writeConfig(
    directory: Path,
    tinkUpstream: int,
    kubernetes: dict[str, Any] | None = None,
    netbox: dict[str, Any] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
    *,
    kms: bool = False,
    encrypted: Sequence[str] | None = None,
) -> Path:
    """A dev config in C{directory}: every listener on a free loopback
    port, the dev PKI under C{pki/}, the vault on any filesystem; with
    C{kubernetes}, that C{[kubernetes]} table; with C{netbox}, that
    C{[netbox]} table (NetBox is then the inventory); with C{kms}, a
    C{[kms]} table and its listener, and the C{encrypted} classes (by
    default the rack's, L{CLASS}) opted in to disk encryption
    (C{[provision.class.NAME] disk_encryption = "kms"}); C{extra} tables
    (C{[tinkerbell]}'s) as given."""
    (directory / "templates").mkdir(parents=True)
    (directory / "templates" / "default.yaml").write_text(TEMPLATE)
    (directory / "topology.json").write_text(json.dumps(TOPOLOGY))
    listen = "tcp:{}:interface=127.0.0.1"
    admin = freePort()
    tables: dict[str, dict[str, Any]] = {
        "site": {"name": "sim", "topology": "topology.json"},
        "paths": {"state": "state", "vault": "vault", "vault_allow_any_fs": True},
        "listen": {
            "boot": listen.format(freePort()),
            "device": listen.format(freePort()),
            "admin": listen.format(admin),
            "tink": listen.format(freePort()),
            "dns": f"{freePort()}:interface=127.0.0.1",
        },
        **devConfigTables(f"https://localhost:{admin}"),
        "tink": {"upstream": f"tcp:127.0.0.1:{tinkUpstream}", "min_reboot": 0},
        "provision": {"classes": ["worker", "worker-g3", "worker-g2"]},
    }
    if kubernetes is not None:
        tables["kubernetes"] = kubernetes
    if kms:
        tables["listen"]["kms"] = listen.format(freePort())
        tables["kms"] = {}
        for name in (CLASS,) if encrypted is None else encrypted:
            tables[f"provision.class.{name}"] = {"disk_encryption": "kms"}
    if netbox is not None:
        tables["netbox"] = netbox
    tables.update(extra or {})
    lines = []
    for table, keys in tables.items():
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in keys.items())
        lines.append("")
    path = directory / "fleetd.toml"
    path.write_text("\n".join(lines))
    return path


def healthy(fleetd: Fleetd) -> bool:
    """Whether fleetd's C{/healthz} answers 200 (trusting the dev CA)."""
    if not fleetd.pki.public_ca.is_file():
        return False
    host, _, port = fleetd.admin.removeprefix("https://").partition(":")
    context = ssl.create_default_context(cafile=str(fleetd.pki.public_ca))
    conn = http.client.HTTPSConnection(
        host, int(port or 443), context=context, timeout=5
    )
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def devPKI(work: Path) -> DevPKIPaths:
    """The dev PKI of the sim's own fleetd (generated once)."""
    return ensureDevPKI(work / "fleetd" / "pki", ENROLLMENT)


def startFleetd(
    work: Path,
    tinkUpstream: int,
    started: Started,
    kubernetes: dict[str, Any] | None = None,
    netbox: dict[str, Any] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
    *,
    kms: bool = False,
    encrypted: Sequence[str] | None = None,
) -> Fleetd:
    """Our own fleetd (C{twistd -n fleetd}) on C{work}, in C{started}
    (with C{kms}, a C{[kms]} table and its listener, and the C{encrypted}
    classes opted in: L{writeConfig})."""
    devPKI(work)
    config = writeConfig(
        work / "fleetd", tinkUpstream, kubernetes, netbox, extra,
        kms=kms, encrypted=encrypted,
    )  # fmt: skip
    return launchFleetd(work, config, started)


def launchFleetd(work: Path, config: Path, started: Started) -> Fleetd:
    """Run fleetd of C{config} (written by L{startFleetd}; again after a
    spore reboot), in C{started}, until it answers; its log appended to."""
    fleetd = Fleetd.fromConfig(config)
    argv = [str(BIN / "twistd"), "-n", "--pidfile=", "fleetd", "--config", str(config)]
    logPath = work / "fleetd.log"
    with logPath.open("ab") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
        )

    def stop() -> None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    started.add("fleetd", lambda: process.pid, stop)
    deadline = time.monotonic() + 60
    while not healthy(fleetd):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = logPath.read_text(errors="replace")[-2000:]
            raise DaemonFailed(f"fleetd did not come up:\n{tail}")
        time.sleep(0.1)
    return fleetd
