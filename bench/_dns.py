"""
What the DNS benchmarks share: knot beside fleetd, ports, CPU pinning,
dnsperf's figures and the machine line (L{bench.dns_qps},
L{bench.dns_flood}).
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import time
from pathlib import Path

NAME = "enroll.lolwtf.ca"
ADDRESS = "10.20.0.6"
TTL = 60


def freePort() -> int:
    """A port free on 127.0.0.1 for both UDP and TCP (racy; a bench only)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port: int = u.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port


def pinned(cpus: str | None, argv: list[str]) -> list[str]:
    return argv if cpus is None else ["taskset", "-c", cpus, *argv]


def startKnot(
    directory: Path, port: int, workers: int, cpus: str | None = None
) -> subprocess.Popen[str]:
    """knotd serving the same name on 127.0.0.1:C{port}, as the current user."""
    (directory / "run").mkdir()
    (directory / "db").mkdir()
    (directory / f"{NAME}.zone").write_text(
        f"$ORIGIN {NAME}.\n$TTL {TTL}\n"
        f"@ SOA {NAME}. hostmaster.{NAME}. 1 3600 600 86400 {TTL}\n"
        f"@ NS {NAME}.\n@ A {ADDRESS}\n"
    )
    conf = directory / "knot.conf"
    conf.write_text(
        f'server:\n  rundir: "{directory}/run"\n  listen: 127.0.0.1@{port}\n'
        f"  udp-workers: {workers}\n  tcp-workers: 1\n  background-workers: 1\n"
        f'database:\n  storage: "{directory}/db"\n'
        "log:\n  - target: stderr\n    any: error\n"
        f'zone:\n  - domain: {NAME}.\n    storage: "{directory}"\n'
        f'    file: "{NAME}.zone"\n    zonefile-sync: -1\n'
        "    journal-content: none\n"
    )
    return subprocess.Popen(pinned(cpus, ["knotd", "-c", str(conf)]), text=True)


def waitForAnswer(port: int, process: subprocess.Popen[str]) -> None:
    """
    Poll until the server on C{port} answers the name correctly, then check
    that it refuses a name outside the zone and denies one below the apex.
    """
    import dns.message
    import dns.query
    import dns.rcode

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server on port {port} exited with {process.returncode}")
        query = dns.message.make_query(NAME, "A")
        try:
            response = dns.query.udp(query, "127.0.0.1", timeout=0.2, port=port)
        except dns.exception.Timeout:
            continue
        answers = {r.address for rrset in response.answer for r in rrset}
        if response.rcode() != dns.rcode.NOERROR or answers != {ADDRESS}:
            raise SystemExit(f"server on port {port} answers {response}")
        for name, rcode in (
            ("bench.example.com", dns.rcode.REFUSED),
            (f"bench.{NAME}", dns.rcode.NXDOMAIN),
        ):
            query = dns.message.make_query(name, "A")
            response = dns.query.udp(query, "127.0.0.1", timeout=1, port=port)
            if response.rcode() != rcode:
                raise SystemExit(f"server on port {port} answers {name}: {response}")
        return
    raise SystemExit(f"server on port {port} did not answer")


def dnsperfFigures(out: str) -> dict[str, str]:
    figures = {}
    for key, pattern in (
        ("sent", r"Queries sent:\s+(\d+)"),
        ("completed", r"Queries completed:\s+(\d+)"),
        ("lost", r"Queries lost:\s+(\d+)"),
        ("qps", r"Queries per second:\s+([\d.]+)"),
        ("rcodes", r"Response codes:\s+(.*)"),
        ("seconds", r"Run time \(s\):\s+([\d.]+)"),
    ):
        match = re.search(pattern, out)
        figures[key] = match.group(1).strip() if match else "?"
    return figures


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{os.cpu_count()} CPUs (nproc), {cpu}, Python {platform.python_version()}"
