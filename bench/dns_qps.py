"""
Queries per second of fleetd's DNS responder against knot, with dnsperf.

Both servers answer C{enroll.lolwtf.ca A} on their own loopback port; each
gets the same bounded dnsperf run (UDP, one client, 127.0.0.1 only) and the
table shows qps, mean latency and the ratio fleetd/knot. Not a test: run it
by hand, e.g.::

    .venv/bin/python bench/dns_qps.py --duration 10 --write results.md

Needs the Debian packages dnsperf and knot. fleetd runs in a subprocess
(C{--serve PORT}, optionally under cProfile with C{--profile FILE}).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

NAME = "enroll.lolwtf.ca"
ADDRESS = "10.20.0.6"
TTL = 60
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    """One dnsperf run's figures."""

    server: str
    qps: float
    latency: float
    completed: str
    rcodes: str
    cpuPerQuery: float


def serve(port: int, profile: str | None) -> None:
    """Run fleetd's DNSService on 127.0.0.1:C{port} until SIGTERM."""
    from prometheus_client import CollectorRegistry
    from twisted.internet import reactor

    from fleetd.config import Anchor, Topology
    from fleetd.dns.service import DNSService

    topology = Topology("10.20.0.5", ADDRESS, NAME, (Anchor("a", "127.0.0.2"),))
    service = DNSService(
        reactor,  # type: ignore[arg-type]
        topology,
        port=port,
        interface="127.0.0.1",
        ttl=TTL,
        registry=CollectorRegistry(),
        topologyLoader=lambda: topology,
    )
    service.startService()
    print("ready", flush=True)
    if profile is None:
        reactor.run()  # Twisted's own SIGTERM handler stops it
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.runcall(reactor.run)
    profiler.dump_stats(profile)


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


def startFleetd(port: int, profile: str | None) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--serve", str(port)]
    if profile:
        argv += ["--profile", profile]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit("fleetd did not start")
    return process


def startKnot(directory: Path, port: int, workers: int) -> subprocess.Popen[str]:
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
    return subprocess.Popen(["knotd", "-c", str(conf)], text=True)


def waitForAnswer(port: int, process: subprocess.Popen[str]) -> None:
    """Poll until the server on C{port} answers the name correctly."""
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
        if response.rcode() == dns.rcode.NOERROR and answers == {ADDRESS}:
            return
        raise SystemExit(f"server on port {port} answers {response}")
    raise SystemExit(f"server on port {port} did not answer")


def cpuSeconds(pid: int) -> float:
    """User plus system CPU time of process C{pid}, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dnsperf(
    server: str, port: int, pid: int, queries: Path, args: argparse.Namespace
) -> tuple[list[str], Run]:
    argv = ["dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", str(queries)]
    argv += ["-l", str(args.duration), "-c", str(args.clients), "-T", "1"]
    argv += ["-q", str(args.outstanding), "-Q", str(args.max_qps)]
    before = cpuSeconds(pid)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    cpu = cpuSeconds(pid) - before

    def field(pattern: str) -> str:
        match = re.search(pattern, out)
        if match is None:
            raise SystemExit(f"cannot parse dnsperf output:\n{out}")
        return match.group(1).strip()

    completed = int(field(r"Queries completed:\s+(\d+)"))
    return argv, Run(
        server,
        float(field(r"Queries per second:\s+([\d.]+)")),
        float(field(r"Average Latency \(s\):\s+([\d.]+)")),
        field(r"Queries completed:\s+\d+ \(([\d.]+%)\)"),
        field(r"Response codes:\s+(.*)"),
        cpu / completed if completed else 0.0,
    )


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{os.cpu_count()} CPUs (nproc), {cpu}, Python {platform.python_version()}"


def table(runs: list[Run], fleetd: Run) -> str:
    lines = [
        "| server | qps | mean latency | CPU per query | completed | fleetd/server |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        ratio = fleetd.qps / r.qps if r.qps else 0.0
        lines.append(
            f"| {r.server} | {r.qps:,.0f} | {r.latency * 1e6:.0f} µs "
            f"| {r.cpuPerQuery * 1e6:.1f} µs | {r.completed} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--duration", type=int, default=10, help="seconds per run")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--outstanding", type=int, default=100)
    parser.add_argument("--max-qps", type=int, default=500_000)
    parser.add_argument(
        "--knot-workers", default="1,2", help="comma-separated udp-workers"
    )
    parser.add_argument(
        "--query", default=f"{NAME} A", help=f"dnsperf query line (default {NAME} A)"
    )
    parser.add_argument("--write", type=Path, help="also write the results here")
    parser.add_argument("--profile", help="run fleetd under cProfile, stats here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.profile)
        return 0

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="dns-qps-") as tmp:
        queries = Path(tmp) / "queries"
        queries.write_text(f"{args.query}\n")
        port = freePort()
        process = startFleetd(port, args.profile)
        try:
            waitForAnswer(port, process)
            command, fleetd = dnsperf("fleetd", port, process.pid, queries, args)
        finally:
            process.terminate()
            process.wait(10)
        runs.append(fleetd)
        for workers in [int(w) for w in args.knot_workers.split(",")]:
            directory = Path(tmp) / f"knot{workers}"
            directory.mkdir()
            port = freePort()
            knot = startKnot(directory, port, workers)
            try:
                waitForAnswer(port, knot)
                label = f"knot ({workers} udp-workers)"
                runs.append(dnsperf(label, port, knot.pid, queries, args)[1])
            finally:
                knot.terminate()
                knot.wait(10)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    shown = " ".join(command).replace(tmp, "TMP")
    shown = re.sub(r"-p \d+", "-p PORT", shown)
    report = (
        f"{table(runs, fleetd)}\n\nMachine: {machine()}. Date: {when}.\n"
        f"Query: `{args.query}`, every run: `{shown}`.\n"
    )
    print(report)
    if args.write:
        args.write.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
