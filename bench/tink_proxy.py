"""
The tink proxy's cost per unary call: direct to a fast tink-server stand-in,
through fleetd's tink listener (C{twistd -n fleetd}), through the floor
(C{bench/_h2floor.py}: the thinnest gRPC unary proxy on Twisted and ``h2``,
with fleetd's remembered HPACK coders as C{floor} and without them as
C{floor-plain}) and through nginx C{grpc_pass}, all with the same TLS
certificate (issue 10).

The upstream is nginx (one worker) answering every
C{/proto.WorkflowService/*} call with an empty message and
C{grpc-status: 0} as trailers, over h2c and over TLS ("direct"); it costs a
few µs per call, unlike a Python grpcio server (~250 µs). The client is
grpcio in this process: open loop at C{--rate} calls/s for latency
(p50/p99), then closed loop with C{--inflight} calls in flight for
saturated throughput. The proxy under test is pinned to CPU 0, the
upstream and the client to CPU 1; CPU per call is the proxy process's
user+system time over the calls it carried (/proc). Calls carry no
deadline unless C{--deadline} asks for one: tink-agent and tink-worker
send none (no C{grpc-timeout} header). Loopback only; every process
started is stopped.

    .venv/bin/python bench/tink_proxy.py --rate 300 --seconds 10
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._fleet import Daemon, cpuSeconds, makeFleet
from bench.boot_storm import freePort, listening

METHOD = "/proto.WorkflowService/GetAction"
REQUEST = b"\x0a\x1152:54:00:12:34:56"  # ActionRequest{agent_id}


class Nginx:
    """nginx with one worker pinned to C{cpu}, from a config body."""

    def __init__(self, directory: Path, http: str, cpu: str, port: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        conf = directory / "nginx.conf"
        conf.write_text(
            "user root;\nworker_processes 1;\n"
            f"daemon off;\npid {directory}/nginx.pid;\n"
            f"error_log {directory}/error.log warn;\n"
            "events { worker_connections 4096; }\n"
            "http {\n  access_log off;\n"
            f"  client_body_temp_path {directory}/tmp;\n{http}}}\n"
        )
        self.process = subprocess.Popen(
            ["taskset", "-c", cpu, "nginx", "-c", str(conf), "-e", "stderr"]
        )
        deadline = time.monotonic() + 10
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        while time.monotonic() < deadline:
            pids = children.read_text().split() if children.exists() else []
            if pids and listening(port):
                self.pid = int(pids[0])
                return
            time.sleep(0.02)
        self.stop()
        raise SystemExit("nginx did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


class Floor:
    """C{bench/_h2floor.py} pinned to C{cpu}, proxying to h2c C{upstream}."""

    def __init__(
        self, pki: Path, cpu: str, port: int, upstream: int, memo: bool
    ) -> None:
        here = Path(__file__).resolve().parent
        argv = ["taskset", "-c", cpu, sys.executable, str(here / "_h2floor.py")]
        argv += ["--port", str(port), "--upstream", str(upstream)]
        argv += ["--cert", str(pki / "public.pem"), "--key", str(pki / "public.key")]
        env = dict(os.environ, PYTHONPATH=str(here.parent / "src"))
        self.process = subprocess.Popen(argv + ["--memo"] * memo, env=env)
        self.pid = self.process.pid
        deadline = time.monotonic() + 10
        while not listening(port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise SystemExit("the floor did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def upstreamConfig(directory: Path, pki: Path, h2c: int, tls: int) -> str:
    static = directory / "static" / "proto.WorkflowService"
    static.mkdir(parents=True, exist_ok=True)
    (static / "GetAction").write_bytes(b"\x00\x00\x00\x00\x00")
    location = (
        "    location /proto.WorkflowService/ {\n"
        f"      root {directory}/static; default_type application/grpc;\n"
        "      error_page 405 =200 $uri;\n"
        "      add_trailer grpc-status 0 always;\n    }\n"
    )
    return (
        f"  server {{\n    listen 127.0.0.1:{h2c} http2;\n{location}  }}\n"
        f"  server {{\n    listen 127.0.0.1:{tls} ssl http2;\n"
        f"    ssl_certificate {pki}/public.pem;\n"
        f"    ssl_certificate_key {pki}/public.key;\n{location}  }}\n"
    )


def grpcPassConfig(pki: Path, port: int, upstream: int) -> str:
    return (
        f"  upstream tink {{ server 127.0.0.1:{upstream}; keepalive 32; }}\n"
        f"  server {{\n    listen 127.0.0.1:{port} ssl http2;\n"
        f"    ssl_certificate {pki}/public.pem;\n"
        f"    ssl_certificate_key {pki}/public.key;\n"
        "    location / { grpc_pass grpc://tink; }\n  }\n"
    )


def channel(port: int, ca: bytes) -> grpc.Channel:
    return grpc.secure_channel(
        f"localhost:{port}", grpc.ssl_channel_credentials(root_certificates=ca)
    )


def openLoop(
    ch: grpc.Channel, rate: float, seconds: float, deadline: float | None
) -> list[float]:
    """Latencies (s) of calls started at C{rate}/s for C{seconds}."""
    call = ch.unary_unary(METHOD, lambda b: b, lambda b: b)
    call(REQUEST, timeout=10)  # connect first
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    pending = threading.Semaphore(0)
    total = int(rate * seconds)
    start = time.perf_counter()
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        began = time.perf_counter()
        future = call.future(REQUEST, timeout=deadline)

        def done(f: grpc.Future, began: float = began) -> None:
            try:
                ok = f.exception() is None
                with lock:
                    if ok:
                        latencies.append(time.perf_counter() - began)
                    else:
                        errors[0] += 1
                        if errors[0] == 1:
                            print(f"  first failure: {f.exception()!r}", flush=True)
            finally:
                pending.release()

        future.add_done_callback(done)
    until = time.monotonic() + 30
    for _ in range(total):
        pending.acquire(timeout=max(0.0, until - time.monotonic()))
    if errors[0]:
        print(f"  {errors[0]} of {total} calls failed", flush=True)
    return latencies


def closedLoop(
    ch: grpc.Channel, inflight: int, seconds: float, deadline: float | None
) -> int:
    """Calls completed with C{inflight} always in flight."""
    call = ch.unary_unary(METHOD, lambda b: b, lambda b: b)
    done = 0
    lock = threading.Lock()
    stop = time.perf_counter() + seconds
    finished = threading.Event()
    active = [inflight]

    def issue() -> None:
        call.future(REQUEST, timeout=deadline).add_done_callback(completed)

    def completed(f: grpc.Future) -> None:
        nonlocal done
        with lock:
            done += f.exception() is None
            if time.perf_counter() < stop:
                issue()
                return
            active[0] -= 1
            if active[0] == 0:
                finished.set()

    for _ in range(inflight):
        issue()
    finished.wait(seconds + 30)
    return done


def measure(
    name: str, port: int, ca: bytes, pid: int | None, args: argparse.Namespace
) -> dict[str, float]:
    ch = channel(port, ca)
    try:
        deadline = args.deadline or None
        latencies = openLoop(ch, args.rate, args.seconds, deadline)
        cpu0 = cpuSeconds(pid) if pid else 0.0
        calls = closedLoop(ch, args.inflight, args.seconds, deadline)
        cpu = (cpuSeconds(pid) - cpu0) if pid else 0.0
    finally:
        ch.close()
    latencies.sort()
    result = {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "rate": calls / args.seconds,
        "cpu_us_per_call": 1e6 * cpu / calls if pid else float("nan"),
    }
    print(
        f"{name:11} p50 {result['p50_ms']:6.2f} ms  p99 {result['p99_ms']:6.2f} ms"
        f" at {args.rate:.0f}/s  |  saturated {result['rate']:7.0f} calls/s,"
        f" {result['cpu_us_per_call']:6.1f} µs CPU per call",
        flush=True,
    )
    return result


def summary(results: dict[str, dict[str, float]]) -> None:
    """The ratios between the paths measured."""
    cpu = {name: r["cpu_us_per_call"] for name, r in results.items()}
    if {"direct", "fleetd", "nginx"} <= results.keys():
        f, n = results["fleetd"], results["nginx"]
        print(
            f"fleetd adds {f['p99_ms'] - results['direct']['p99_ms']:.2f} ms at p99;"
            f" CPU per call {f['cpu_us_per_call'] / n['cpu_us_per_call']:.1f}x nginx's;"
            f" saturated throughput {f['rate'] / n['rate']:.2f}x nginx's"
        )
    for floor in ("floor", "floor-plain"):
        ratios = [
            f"{a} ÷ {b} CPU {cpu[a] / cpu[b]:.2f}x"
            for a, b in (("fleetd", floor), (floor, "nginx"))
            if a in cpu and b in cpu
        ]
        if ratios:
            print("; ".join(ratios))
    if "fleetd" in cpu and "nginx" in cpu:
        print(f"fleetd ÷ nginx CPU {cpu['fleetd'] / cpu['nginx']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="give each call this deadline in seconds (sent as grpc-timeout,"
        " a new value every call); 0, the default, sends none, as tink-agent"
        " and tink-worker do",
    )
    parser.add_argument(
        "--paths",
        default="direct,fleetd,floor,nginx",
        help="which of direct, fleetd, floor, floor-plain, nginx to measure"
        " (comma-separated)",
    )
    args = parser.parse_args()
    paths = set(args.paths.split(","))
    for tool in ("nginx", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed")
    work = Path(tempfile.mkdtemp(prefix="tink-bench-"))
    vault = Path(tempfile.mkdtemp(prefix="tink-bench-", dir="/dev/shm"))
    h2c, direct, proxied = freePort(), freePort(), freePort()
    fleet = makeFleet(
        work / "fleetd",
        vault / "configs",
        # One load generator stands in for many nodes: lift the per-source
        # stream rate (issue 17), which would otherwise refuse most calls.
        {
            "tink": {
                "upstream": f"tcp:127.0.0.1:{h2c}",
                "source_stream_rate": 1e6,
                "source_stream_burst": 1e6,
            }
        },
    )
    pki = fleet.pki.directory
    ca = fleet.pki.public_ca.read_bytes()
    started: list[object] = []
    try:
        upstream = Nginx(
            work / "upstream", upstreamConfig(work, pki, h2c, direct), "1", h2c
        )
        started.append(upstream)
        daemon = Daemon(fleet, cpus="0")
        daemon.start(waitFor=b"listen.started tink ")
        started.append(daemon)
        results = {}
        if "direct" in paths:
            results["direct"] = measure("direct", direct, ca, None, args)
        if "fleetd" in paths:
            results["fleetd"] = measure(
                "fleetd", daemon.ports["tink"], ca, daemon.pid, args
            )
        daemon.stop()
        for name in ("floor", "floor-plain"):
            if name in paths:
                port = freePort()
                floor = Floor(pki, "0", port, h2c, memo=name == "floor")
                started.append(floor)
                results[name] = measure(name, port, ca, floor.pid, args)
                floor.stop()
        if "nginx" in paths:
            grpcPass = Nginx(
                work / "grpcpass", grpcPassConfig(pki, proxied, h2c), "0", proxied
            )
            started.append(grpcPass)
            results["nginx"] = measure("nginx", proxied, ca, grpcPass.pid, args)
        summary(results)
    finally:
        for each in reversed(started):
            each.stop()  # type: ignore[attr-defined]
        shutil.rmtree(vault, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    main()
