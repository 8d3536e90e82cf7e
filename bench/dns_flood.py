"""
Boot-listener delivery latency with and without a DNS flood (issue 8, item 12).

fleetd's DNS responder shares one reactor with the boot listener. This runs
a real C{twistd -n fleetd} (dev-style config, vault on tmpfs, pinned to CPU
0) and delivers configurations to simulated nodes at a steady rate, each a
new TLS connection and C{GET /config} (as Talos fetches it), timing each one
from connect to the last byte of the body. Then it does the same again while
a flooder (pinned to CPU 1, from 127.0.0.2) sends random names outside the
zone to the DNS port at the rate one dnsperf core drives: measured first,
as dnsperf's qps against knot on this machine (C{--flood-qps} overrides).
dnsperf itself waits for each answer, so it cannot keep up a flood that is
being dropped; the flooder is open loop (this script with C{--flood}), so
the rate stays the same whatever fleetd does. The DNS figures are fleetd's
own counters over the delivery window. Both phases run twice:
with response-rate limiting off (every flood query is answered, by the cheap
path) and on (the default settings; the flood's prefix is limited).

Not a test: run it by hand, e.g.::

    .venv/bin/python bench/dns_flood.py --nodes 300 --rate 20 --write out.md

Needs the Debian packages dnsperf, knot and util-linux (taskset). Loopback
only; stops everything it started.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._dns import (  # noqa: E402
    dnsperfFigures,
    freePort,
    machine,
    startKnot,
    waitForAnswer,
)
from bench._fleet import (  # noqa: E402
    STORM_OVERRIDES,
    Admin,
    Daemon,
    Node,
    configPath,
    getConfig,
    makeFleet,
    makeNodes,
    tlsContext,
)

DNS_PORT = re.compile(r"dns\.listening \S+ udp (\d+) tcp (\d+)")
METRIC = re.compile(r"^(fleetd_dns_[a-z_]+_total)\{([^}]*)\} ([\d.e+]+)$", re.M)


@dataclass
class Phase:
    """One delivery phase's figures."""

    rrl: str
    flood: bool
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    fleetdCPU: float = 0.0
    flooder: dict[str, float] = field(default_factory=dict)
    dns: dict[str, float] = field(default_factory=dict)

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def timedDelivery(port: int, context: ssl.SSLContext, path: str) -> tuple[int, float]:
    started = time.perf_counter()
    status, _ = getConfig(port, context, path)
    return status, time.perf_counter() - started


def deliver(
    port: int,
    context: ssl.SSLContext,
    paths: list[str],
    rate: float,
    concurrency: int,
) -> tuple[list[tuple[int, float]], float]:
    """Start one delivery every 1/C{rate} s (open loop); return each one's figures."""
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        futures = []
        for i, path in enumerate(paths):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(timedDelivery, port, context, path))
        results = [f.result() for f in futures]
    return results, time.monotonic() - started


def floodNames(path: Path, count: int) -> None:
    rng = random.Random(8)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    tlds = ["com", "net", "org", "example", "io"]
    lines = [
        f"{''.join(rng.choices(letters, k=rng.randrange(6, 16)))}.{rng.choice(tlds)} A"
        for _ in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")


def flood(port: int, rate: float, seconds: float, names: Path) -> None:
    """Send the queries in C{names} to C{port}, C{rate} a second, open loop."""
    import json
    import socket
    import struct

    rng = random.Random(9)
    packets = []
    for line in names.read_text().splitlines():
        name = line.split()[0]
        wire = b"".join(
            bytes([len(label)]) + label.encode() for label in name.split(".")
        )
        header = struct.pack("!HHHHHH", rng.randrange(65536), 0x0100, 1, 0, 0, 0)
        packets.append(header + wire + b"\x00\x00\x01\x00\x01")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.2", 0))
    sock.setblocking(False)
    print("ready", flush=True)
    target = ("127.0.0.1", port)
    sent = refused = 0
    started = time.monotonic()
    count = len(packets)
    i = 0
    while True:
        now = time.monotonic() - started
        if now >= seconds:
            break
        due = int(now * rate) - sent - refused
        for _ in range(min(due, 5000)):
            try:
                sock.sendto(packets[i], target)
                sent += 1
            except OSError:  # the socket buffer is full: the kernel drops it
                refused += 1
            i = (i + 1) % count
        if due <= 0:
            time.sleep(0.0005)
    elapsed = time.monotonic() - started
    print(json.dumps({"sent": sent, "dropped": refused, "seconds": elapsed}))


def startFlood(
    port: int, names: Path, seconds: int, qps: float
) -> tuple[list[str], subprocess.Popen[str]]:
    argv = ["taskset", "-c", "1", sys.executable, __file__, "--flood", str(port)]
    argv += ["--flood-qps", str(qps), "--flood-seconds", str(seconds)]
    argv += ["--flood-names", str(names)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit("the flooder did not start")
    return argv, process


def calibrate(names: Path, work: Path, seconds: int) -> tuple[float, str]:
    """dnsperf's qps against knot (one worker, CPU 0) with C{names}: one core's rate."""
    directory = work / "knot"
    directory.mkdir()
    port = freePort()
    knot = startKnot(directory, port, 1)
    try:
        subprocess.run(
            ["taskset", "-p", "-c", "0", str(knot.pid)], check=True, capture_output=True
        )
        waitForAnswer(port, knot)
        argv = ["taskset", "-c", "1", "dnsperf", "-s", "127.0.0.1", "-p", str(port)]
        argv += ["-d", str(names), "-l", str(seconds), "-c", "1", "-T", "1"]
        argv += ["-q", "500"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    finally:
        knot.terminate()
        knot.wait(10)
    qps = float(dnsperfFigures(out)["qps"])
    shown = re.sub(r"-p \d+", "-p PORT", " ".join(argv))
    return qps, re.sub(r"-d \S+", "-d NAMES", shown)


def dnsCounters(port: int, ca: Path) -> dict[str, float]:
    """fleetd's DNS counters from C{/metrics}, summed by name and key label."""
    import http.client

    conn = http.client.HTTPSConnection(
        "localhost", port, timeout=10, context=tlsContext(ca)
    )
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    totals: dict[str, float] = {}
    for name, labels, value in METRIC.findall(text):
        if name == "fleetd_dns_queries_total":
            rcode = re.search(r'rcode="(\w+)"', labels)
            key = f"replies {rcode.group(1) if rcode else '?'}"
        elif name == "fleetd_dns_rate_limited_total":
            action = re.search(r'action="(\w+)"', labels)
            key = f"rate-limited {action.group(1) if action else '?'}"
        else:
            key = name
        totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def runFleet(
    rrl: bool,
    work: Path,
    shm: Path,
    names: Path,
    qps: float,
    args: argparse.Namespace,
) -> list[Phase]:
    label = "on" if rrl else "off"
    overrides = {table: dict(keys) for table, keys in STORM_OVERRIDES.items()}
    overrides["dns.rate_limit"] = {"enabled": rrl}
    fleet = makeFleet(work / f"fleet-{label}", shm / f"vault-{label}", overrides)
    daemon = Daemon(fleet, cpus="0")
    daemon.start()
    phases = []
    try:
        match = DNS_PORT.search(daemon.logText())
        if match is None:
            raise SystemExit("no dns.listening line in fleetd's log")
        dnsPort = int(match.group(1))
        admin = Admin(fleet, daemon.ports["admin"])
        nodes = makeNodes(2 * args.nodes + args.warmup, prefix=f"rrl{label}")
        admin.importDevices(nodes)
        runs = admin.provision([n.name for n in nodes])
        context = tlsContext(fleet.pki.public_ca)

        def paths(chosen: list[Node]) -> list[str]:
            return [configPath(n, runs[n.name][1]) for n in chosen]

        boot = daemon.ports["boot"]
        deliver(boot, context, paths(nodes[: args.warmup]), args.rate, args.concurrency)
        batches = [
            nodes[args.warmup : args.warmup + args.nodes],
            nodes[args.warmup + args.nodes :],
        ]
        for flood, batch in zip((False, True), batches, strict=True):
            phase = Phase(label, flood)
            flooder = None
            if flood:
                seconds = int(args.nodes / args.rate) + 4
                _, flooder = startFlood(dnsPort, names, seconds, qps)
                time.sleep(1.5)  # let the flood reach its rate
            # Counted over the delivery window alone, while the flood runs.
            before = dnsCounters(daemon.ports["admin"], fleet.pki.public_ca)
            cpu = daemon.cpu()
            results, phase.seconds = deliver(
                boot, context, paths(batch), args.rate, args.concurrency
            )
            phase.fleetdCPU = daemon.cpu() - cpu
            after = dnsCounters(daemon.ports["admin"], fleet.pki.public_ca)
            phase.dns = {k: after[k] - before.get(k, 0.0) for k in after}
            if flooder is not None:
                import json

                out, _ = flooder.communicate(timeout=120)
                figures = json.loads(out.strip().splitlines()[-1])
                phase.flooder = {k: float(v) for k, v in figures.items()}
            for status, latency in results:
                phase.statuses[status] = phase.statuses.get(status, 0) + 1
                phase.latencies.append(latency)
            phases.append(phase)
            print(summary(phase), file=sys.stderr, flush=True)
    finally:
        daemon.stop()
    return phases


def summary(phase: Phase) -> str:
    return (
        f"rrl {phase.rrl} flood {phase.flood}: p50 {phase.percentile(50) * 1e3:.1f} ms"
        f" p99 {phase.percentile(99) * 1e3:.1f} ms statuses {phase.statuses}"
        f" flooder {phase.flooder}"
    )


def report(
    phases: list[Phase], args: argparse.Namespace, qps: float, calibration: str
) -> str:
    lines = [
        "| rate limiting | DNS flood | deliveries (200) | p50 | p99 | max "
        "| fleetd CPU in the window | flood sent/s "
        "| fleetd DNS replies/s (window) | rate-limited/s (window) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        replies = sum(v for k, v in p.dns.items() if k.startswith("replies"))
        limited = sum(v for k, v in p.dns.items() if k.startswith("rate-limited"))
        seconds = p.seconds
        run = p.flooder.get("seconds", 0.0)
        sentRate = f"{p.flooder['sent'] / run:,.0f}" if run else "-"
        lines.append(
            f"| {p.rrl} | {'yes' if p.flood else 'no'} | {p.statuses.get(200, 0)}"
            f" of {len(p.latencies)} | {p.percentile(50) * 1e3:.1f} ms"
            f" | {p.percentile(99) * 1e3:.1f} ms | {max(p.latencies) * 1e3:.1f} ms"
            f" | {p.fleetdCPU:.2f} s of {p.seconds:.1f} s"
            f" ({p.fleetdCPU / p.seconds:.0%})"
            f" | {sentRate} | {replies / seconds:,.0f}"
            f" | {limited / seconds:,.0f} |"
        )
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(lines) + (
        f"\n\nMachine: {machine()}. Date: {when}. {args.nodes} deliveries a phase"
        f" at {args.rate:g}/s (open loop, up to {args.concurrency} at once), each a"
        f" new TLS connection from 127.0.0.1, timed from connect to the last byte;"
        f" fleetd on CPU 0, the client and the flooder on CPU 1. Flood:"
        f" {qps:,.0f} queries/s of {args.names} random names outside the zone,"
        f" open loop from 127.0.0.2; that rate is {calibration}.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=300, help="deliveries a phase")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rate", type=float, default=20.0, help="deliveries/s")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument(
        "--flood-qps", type=float, help="flood rate (default: dnsperf against knot)"
    )
    parser.add_argument("--calibrate-seconds", type=int, default=5)
    parser.add_argument("--flood", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--flood-seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--flood-names", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rrl", default="off,on", help="which runs: off,on")
    parser.add_argument("--write", type=Path, help="also write the table here")
    args = parser.parse_args()
    if args.flood is not None:
        flood(args.flood, args.flood_qps, args.flood_seconds, args.flood_names)
        return
    for tool in ("dnsperf", "knotd", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (Debian dnsperf, knot, util-linux)")
    os.sched_setaffinity(0, {1})
    work = Path(tempfile.mkdtemp(prefix="fleetd-dns-flood-"))
    shm = Path(tempfile.mkdtemp(prefix="fleetd-dns-flood-", dir="/dev/shm"))
    phases: list[Phase] = []
    try:
        names = work / "flood-names"
        floodNames(names, args.names)
        if args.flood_qps:
            qps, calibration = args.flood_qps, "given with --flood-qps"
        else:
            qps, shown = calibrate(names, work, args.calibrate_seconds)
            calibration = (
                f"dnsperf's rate against knot (1 udp-worker, CPU 0): `{shown}`"
            )
            print(f"flood rate {qps:,.0f}/s ({calibration})", file=sys.stderr)
        for which in args.rrl.split(","):
            phases += runFleet(which == "on", work, shm, names, qps, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    text = report(phases, args, qps, calibration)
    print(text)
    if args.write:
        args.write.write_text(text)
    medians = {
        (p.rrl, p.flood): statistics.median(p.latencies) for p in phases if p.latencies
    }
    print(f"medians (s): {medians}", file=sys.stderr)


if __name__ == "__main__":
    main()
