"""
Start-up time and idle RSS of C{twistd -n fleetd} on a dev-style config.

Runs the daemon N times over a fresh temporary directory (dev PKI already
generated, so the figure is the daemon's own start-up), measures the wall
time from spawn until C{/healthz} answers over TLS, then the resident set
size after it has idled for a few seconds. Loopback only; every run stops
the daemon with SIGTERM.

    .venv/bin/python bench/startup.py [--runs 5] [--idle 5]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from tests.daemonsupport import httpsGet
from tests.support import writeConfig

LISTEN = re.compile(
    rb"listen\.started admin IPv4Address\(type='TCP', host='[\d.]+', port=(\d+)\)"
)


def rssKiB(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def once(directory: Path, idle: float) -> tuple[float, int]:
    config = writeConfig(directory)
    ensureDevPKI(directory / "pki", "enroll.lolwtf.ca")
    pki = DevPKIPaths.inside(directory / "pki")
    twistd = str(Path(sys.executable).parent / "twistd")
    log = open(directory / "out.log", "wb")
    start = time.monotonic()
    proc = subprocess.Popen(
        [twistd, "-n", "--pidfile=", "fleetd", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port = None
        deadline = start + 30
        while time.monotonic() < deadline:
            match = LISTEN.search((directory / "out.log").read_bytes())
            if match:
                port = int(match.group(1))
                try:
                    if httpsGet(port, "/healthz", pki.public_ca)[0] == 200:
                        break
                except OSError:
                    pass
            time.sleep(0.005)
        else:
            raise RuntimeError("fleetd did not come up in 30 s")
        ready = time.monotonic() - start
        time.sleep(idle)
        rss = rssKiB(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()
    return ready, rss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=5.0)
    args = parser.parse_args()
    readies, rsses = [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            ready, rss = once(Path(d), args.idle)
        readies.append(ready)
        rsses.append(rss)
        print(
            f"run {i + 1}: ready in {ready * 1000:.0f} ms,"
            f" idle RSS {rss / 1024:.1f} MiB"
        )
    print(
        f"median: ready in {statistics.median(readies) * 1000:.0f} ms, "
        f"idle RSS {statistics.median(rsses) / 1024:.1f} MiB "
        f"({args.runs} runs, {os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
