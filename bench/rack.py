"""
A rack enrolled end to end (issue 21 item 5): C{fleetd-sim}'s whole path
for N nodes on the sim's own fleetd (swtpm and tpm2-abrmd per node, the
workflow through the Tink proxy, the config fetch, the kubelet CSR against
the Kubernetes fake), measured from outside fleetd:

  - the time to the whole rack (every node done) and to its last kubelet
    certificate;
  - fleetd's CPU per enrolled node: the twistd process's user+system time
    from the moment it answers /healthz to the rack's end (all listeners
    together: boot, device, admin, tink, DNS), over the nodes that ended
    as expected;
  - fleetd's peak RSS (C{VmHWM}) at the rack's end;
  - the reactor's worst stall, bounded from above by the slowest answer
    of C{/healthz} to a probe every 50 ms on a kept connection (the answer
    is a few microseconds of work: a slow one waited for the reactor).

    .venv/bin/python bench/rack.py [--nodes 100] [--parallel 8]

The sim's own processes (swtpms, agents, grpc) share the machine's cores
with fleetd: the CPU figure is fleetd's own, but its wall-time figures
move with the load the sim puts beside it. Loopback only; everything it
started is stopped at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import shutil
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fleetd.sim.command import Console, parseArgs, simulate
from fleetd.sim.daemon import Fleetd, Started

TICKS = 100  # /proc's clock ticks per second (os.sysconf("SC_CLK_TCK") here)


class Watched(Started):
    """L{Started}, noting the pid getter of the sim's fleetd."""

    fleetdPid: Any = None

    def add(self, what: str, pid: Any, stop: Any) -> None:
        super().add(what, pid, stop)
        if what == "fleetd":
            self.fleetdPid = pid


def cpuSeconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def peakRSS(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


class Probe(threading.Thread):
    """/healthz every C{gap} s on one kept connection; the answer times."""

    def __init__(self, work: Path, started: Watched, gap: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.work, self.started, self.gap = work, started, gap
        self.times: list[float] = []
        self.cpuAtReady: float | None = None
        self.pid: int | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        fleetd = self._wait()
        if fleetd is None:
            return
        host, _, port = fleetd.admin.removeprefix("https://").partition(":")
        context = ssl.create_default_context(cafile=str(fleetd.pki.public_ca))
        conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=30)
        while not self.stop.is_set():
            began = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    if self.cpuAtReady is None and self.pid is not None:
                        self.cpuAtReady = cpuSeconds(self.pid)
                    else:
                        self.times.append(time.perf_counter() - began)
            except (OSError, http.client.HTTPException):
                conn.close()
            self.stop.wait(self.gap)
        conn.close()

    def _wait(self) -> Fleetd | None:
        while not self.stop.is_set():
            configs = sorted((self.work / "fleetd").glob("*.toml"))
            pid = None if self.started.fleetdPid is None else self.started.fleetdPid()
            if configs and pid is not None:
                self.pid = pid
                fleetd = Fleetd.fromConfig(configs[0])
                if fleetd.pki.public_ca.is_file():
                    return fleetd
            time.sleep(0.05)
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=8)
    options = parser.parse_args()
    args = parseArgs(["--nodes", str(options.nodes), "--parallel",
                      str(options.parallel)])  # fmt: skip
    started = Watched()
    work = Path(tempfile.mkdtemp(prefix="fleetd-rack-"))
    probe = Probe(work, started)
    probe.start()
    console = Console(sys.stderr)
    try:
        result = simulate(args, work, started, console)
        probe.stop.set()
        probe.join(5)
        pid = probe.pid
        assert pid is not None and probe.cpuAtReady is not None, "fleetd never ready"
        cpu = cpuSeconds(pid) - probe.cpuAtReady
        rss = peakRSS(pid)
    finally:
        probe.stop.set()
        console.say(started.stopAll())
        shutil.rmtree(work, ignore_errors=True)
    enrolled = sum(o.ok for o in result.outcomes)
    times = sorted(probe.times)

    def ms(q: float) -> float | None:
        if not times:
            return None
        return round(1000 * times[min(len(times) - 1, int(len(times) * q))], 1)

    report = {
        "nodes": options.nodes,
        "parallel": options.parallel,
        "enrolled": enrolled,
        "rack_seconds": round(result.seconds, 1),
        "rack_active_seconds": None
        if result.active is None
        else round(result.active, 1),
        "fleetd_cpu_seconds": round(cpu, 2),
        "fleetd_cpu_ms_per_enrolled_node": round(1000 * cpu / max(enrolled, 1), 1),
        "fleetd_peak_rss_mib": round(rss / 2**20, 1),
        "healthz_probes": len(times),
        "healthz_p50_ms": round(1000 * times[len(times) // 2], 1) if times else None,
        "healthz_p99_ms": round(1000 * times[int(len(times) * 0.99)], 1)
        if times
        else None,
        "healthz_worst_ms": round(1000 * times[-1], 1) if times else None,
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))}"
        f" CPUs, Python {platform.python_version()}",
    }
    print(json.dumps(report, indent=2))
    return 0 if enrolled == options.nodes else 1


if __name__ == "__main__":
    raise SystemExit(main())
