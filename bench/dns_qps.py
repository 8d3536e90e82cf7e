"""
Queries per second of fleetd's DNS responder against knot, with dnsperf.

Both servers are authoritative for C{enroll.lolwtf.ca} on their own
loopback port. Each path gets the same bounded dnsperf run (UDP, one client,
127.0.0.1 only) against each server: C{a} asks the enrollment name's A
record, C{refused} random names outside the zone (knot, like fleetd,
refuses them), C{nxdomain} random names below the apex. The table shows
qps, mean latency, CPU per query and the ratios fleetd/knot. fleetd runs
with response-rate limiting off (one source sends everything): this
measures the cost of answering. Not a test: run it by hand, e.g.::

    .venv/bin/python bench/dns_qps.py --duration 10 --write results.md

Needs the Debian packages dnsperf and knot. fleetd runs in a subprocess
(C{--serve PORT}, optionally under cProfile with C{--profile FILE}).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._dns import (  # noqa: E402
    ADDRESS,
    NAME,
    TTL,
    freePort,
    machine,
    pinned,
    startKnot,
    waitForAnswer,
)
from bench._fleet import cpuSeconds  # noqa: E402

PATHS = {
    "a": "the enrollment name's A",
    "refused": "random names outside the zone (REFUSED)",
    "nxdomain": "random names below the apex (NXDOMAIN)",
}


def queryLines(path: str, count: int, seed: int = 1) -> list[str]:
    """dnsperf's query file for C{path}: one name, or C{count} random ones."""
    import random

    rng = random.Random(seed)
    if path == "a":
        return [f"{NAME} A"]
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    names = [
        "".join(rng.choices(letters, k=rng.randrange(6, 16))) for _ in range(count)
    ]
    if path == "refused":
        tlds = ["com", "net", "org", "example", "ca", "io"]
        return [f"{n}.{rng.choice(tlds)} A" for n in names]
    return [f"{n}.{NAME} A" for n in names]


@dataclass(frozen=True)
class Run:
    """One dnsperf run's figures."""

    path: str
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

    from fleetd.config import Anchor, DNSRateLimit, Topology
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
        rateLimit=DNSRateLimit(enabled=False),
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


def startFleetd(
    port: int, profile: str | None, cpus: str | None
) -> subprocess.Popen[str]:
    argv = pinned(cpus, [sys.executable, __file__, "--serve", str(port)])
    if profile:
        argv += ["--profile", profile]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit("fleetd did not start")
    return process


def dnsperf(
    path: str,
    server: str,
    port: int,
    pid: int,
    queries: Path,
    args: argparse.Namespace,
) -> tuple[list[str], Run]:
    argv = pinned(args.client_cpus, ["dnsperf", "-s", "127.0.0.1", "-p", str(port)])
    argv += ["-d", str(queries)]
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
        path,
        server,
        float(field(r"Queries per second:\s+([\d.]+)")),
        float(field(r"Average Latency \(s\):\s+([\d.]+)")),
        field(r"Queries completed:\s+\d+ \(([\d.]+%)\)"),
        field(r"Response codes:\s+(.*)"),
        cpu / completed if completed else 0.0,
    )


def table(runs: list[Run]) -> str:
    lines = [
        "| path | server | qps | mean latency | CPU per query | completed "
        "| response codes | fleetd/server (qps) | server/fleetd (CPU per query) |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for path in PATHS:
        done = [r for r in runs if r.path == path]
        fleetd = next((r for r in done if r.server == "fleetd"), None)
        for r in done:
            if fleetd is None or r is fleetd:
                qps = cpu = "-"
            else:
                qps = f"{fleetd.qps / r.qps:.2f}x" if r.qps else "-"
                cpu = (
                    f"{r.cpuPerQuery / fleetd.cpuPerQuery:.2f}x"
                    if fleetd.cpuPerQuery
                    else "-"
                )
            lines.append(
                f"| {path} | {r.server} | {r.qps:,.0f} | {r.latency * 1e6:.0f} µs "
                f"| {r.cpuPerQuery * 1e6:.1f} µs | {r.completed} | {r.rcodes} "
                f"| {qps} | {cpu} |"
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
        "--paths", default="a,refused,nxdomain", help=f"comma-separated: {PATHS}"
    )
    parser.add_argument(
        "--names", type=int, default=10_000, help="random names per query file"
    )
    parser.add_argument("--server-cpus", help="taskset the servers to these CPUs")
    parser.add_argument("--client-cpus", help="taskset dnsperf to these CPUs")
    parser.add_argument("--write", type=Path, help="also write the results here")
    parser.add_argument("--profile", help="run fleetd under cProfile, stats here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.profile)
        return 0

    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}; known: {sorted(PATHS)}")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="dns-qps-") as tmp:
        files = {}
        for path in paths:
            files[path] = Path(tmp) / f"queries-{path}"
            files[path].write_text("\n".join(queryLines(path, args.names)) + "\n")
        port = freePort()
        process = startFleetd(port, args.profile, args.server_cpus)
        try:
            waitForAnswer(port, process)
            for path in paths:
                command, run = dnsperf(
                    path, "fleetd", port, process.pid, files[path], args
                )
                runs.append(run)
        finally:
            process.terminate()
            process.wait(10)
        for workers in [int(w) for w in args.knot_workers.split(",")]:
            directory = Path(tmp) / f"knot{workers}"
            directory.mkdir()
            port = freePort()
            knot = startKnot(directory, port, workers, args.server_cpus)
            try:
                waitForAnswer(port, knot)
                label = f"knot ({workers} udp-workers)"
                for path in paths:
                    runs.append(
                        dnsperf(path, label, port, knot.pid, files[path], args)[1]
                    )
            finally:
                knot.terminate()
                knot.wait(10)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    shown = " ".join(command).replace(tmp, "TMP")
    shown = re.sub(r"-p \d+", "-p PORT", shown)
    shown = re.sub(r"queries-\w+", "queries-PATH", shown)
    described = "; ".join(f"`{p}`: {PATHS[p]}" for p in paths)
    report = (
        f"{table(runs)}\n\nMachine: {machine()}. Date: {when}. Servers on CPUs"
        f" {args.server_cpus or 'any'}, dnsperf on {args.client_cpus or 'any'}.\n"
        f"Paths: {described} ({args.names} random names per file, dnsperf "
        f"loops over them). Every run: `{shown}`.\n"
    )
    print(report)
    if args.write:
        args.write.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
