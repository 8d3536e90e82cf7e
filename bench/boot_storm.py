"""
A boot storm on fleetd's boot listener, beside nginx and a minimal
twisted.web TLS server.

N simulated nodes (default 2,000) each fetch their own configuration
once, C{GET /config?code=&uuid=&serial=}, over a new TLS 1.3 connection
per request (nodes are separate machines: no keep-alive, no session
resumption), at concurrency 200. Mixed in: unknown codes (404), codes
sent with another machine's uuid/serial (403) and repeats of codes
already consumed (410). The load generator is C{wrk} (one thread,
C{Connection: close}, a Lua script that takes each request's path from a
pre-generated list and checks every 200 body: the run id, hostname and
C{fleetd.io/device} label must belong together, and no run may be
delivered twice). Status counts must match the workload exactly.

fleetd (C{twistd -n fleetd}), nginx (one worker) and the minimal Twisted
server run pinned to CPU 0, wrk to CPU 1. Each round runs the three
servers one after the other with the same request list and concurrency;
fleetd gets fresh runs every round. A last pass with a Python asyncio
client (slower, so not timed against the others) correlates every
response with its own request. Loopback only; bounded in requests and
time; everything started is stopped.

    .venv/bin/python bench/boot_storm.py [--nodes 2000] [--concurrency 200]
        [--rounds 3] [--write FILE] [--py-spy PATH]

Needs the Debian packages wrk and nginx-light (or nginx), and openssl.
C{--serve-minimal DIR} is the minimal server itself (used internally).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import random
import re
import resource
import secrets
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._fleet import (
    STORM_OVERRIDES,
    Admin,
    Daemon,
    Node,
    configOutcomes,
    configPath,
    cpuSeconds,
    makeFleet,
    makeNodes,
    procStatus,
)

BODY_BYTES = 2048
OVERSHOOT = "/bench-overshoot"
TIME_LIMIT = 120  # seconds, per wrk run
BACKLOG = 511  # nginx's default on Linux; Twisted's default is 50

LUA = r"""
-- One request per path in the list, Connection: close; checks 200 bodies.
-- wrk calls request() once in the first thread's state to check it, before
-- the run: the list's first line is a placeholder for that call.
local paths, n, i = {}, -1, -1
local expect, seen, checking = {}, {}, false
local headers = {["Host"] = "localhost", ["Connection"] = "close"}
real, overshoot, s200, s403, s404, s410, sother, wrong, dup = 0, 0, 0, 0, 0, 0, 0, 0, 0

function init(args)
  for line in io.lines(args[1]) do n = n + 1; paths[n] = line end
  -- paths[0] is the placeholder; paths[1..n] are the run
  if args[2] ~= "-" then
    checking = true
    for line in io.lines(args[2]) do
      local run, device = line:match("^(%S+) (%S+)$")
      expect[run] = device
    end
  end
end

function request()
  i = i + 1
  if i <= n then return wrk.format("GET", paths[i], headers) end
  return wrk.format("GET", "__OVERSHOOT__", headers)
end

function response(status, hdrs, body)
  if status == 404 and not (body and body:find("unknown code", 1, true)) then
    overshoot = overshoot + 1
    return
  end
  real = real + 1
  if status == 200 then
    s200 = s200 + 1
    if checking then
      local run = body:match("fleetd%.io/run: (r%-%x+)")
      local device = body:match("fleetd%.io/device: ([%w%-]+)")
      local host = body:match("hostname: ([%w%-]+)")
      if run == nil or expect[run] == nil or expect[run] ~= device
          or device ~= host then
        wrong = wrong + 1
      elseif seen[run] then
        dup = dup + 1
      else
        seen[run] = true
      end
    end
  elseif status == 403 then s403 = s403 + 1
  elseif status == 404 then s404 = s404 + 1
  elseif status == 410 then s410 = s410 + 1
  else sother = sother + 1 end
  if real >= n then
    -- wrk's main thread sleeps for -d regardless: tell the harness, which
    -- interrupts that sleep with SIGINT.
    io.open(os.getenv("WRK_DONE"), "w"):close()
    wrk.thread:stop()
  end
end

local threads = {}
function setup(thread) table.insert(threads, thread) end

function done(summary, latency, requests)
  local t = threads[1]
  local f = io.open(os.getenv("WRK_OUT"), "w")
  for _, k in ipairs({"real", "overshoot", "s200", "s403", "s404", "s410",
                      "sother", "wrong", "dup"}) do
    f:write(k, " ", tostring(t:get(k)), "\n")
  end
  local e = summary.errors
  f:write("duration ", summary.duration, "\n", "requests ", summary.requests, "\n")
  f:write("connect ", e.connect, "\n", "read ", e.read, "\n", "write ", e.write,
          "\n", "status ", e.status, "\n", "timeout ", e.timeout, "\n")
  f:write("mean ", latency.mean, "\n", "max ", latency.max, "\n")
  for _, p in ipairs({50, 90, 99}) do
    f:write("p", p, " ", latency:percentile(p), "\n")
  end
  f:close()
end
""".replace("__OVERSHOOT__", OVERSHOOT)


# --- the minimal twisted.web TLS server -------------------------------------


def serveMinimal(directory: Path) -> None:
    """
    twisted.web over TLS, the same certificate, a 2 KiB body at C{/config};
    print the port, run until SIGTERM.
    """
    from OpenSSL import crypto
    from twisted.internet import reactor
    from twisted.internet import ssl as tssl
    from twisted.web import resource, server, static

    cert = crypto.load_certificate(
        crypto.FILETYPE_PEM, (directory / "public.pem").read_bytes()
    )
    key = crypto.load_privatekey(
        crypto.FILETYPE_PEM, (directory / "public.key").read_bytes()
    )
    options = tssl.CertificateOptions(
        privateKey=key, certificate=cert, raiseMinimumTo=tssl.TLSVersion.TLSv1_2
    )
    root = resource.Resource()
    root.putChild(b"config", static.Data(b"x" * BODY_BYTES, "text/plain"))
    site = server.Site(root)
    site.log = lambda request: None  # type: ignore[method-assign]
    r: Any = reactor
    port = r.listenSSL(0, site, options, backlog=BACKLOG, interface="127.0.0.1")
    print(port.getHost().port, flush=True)
    r.run()


class Minimal:
    """The minimal server as a subprocess pinned to C{cpus}."""

    def __init__(self, pki: Path, cpus: str) -> None:
        argv = ["taskset", "-c", cpus, sys.executable, __file__]
        self.process = subprocess.Popen(
            [*argv, "--serve-minimal", str(pki)], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())
        self.pid = self.process.pid

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


# --- nginx ------------------------------------------------------------------


class Nginx:
    """nginx, one worker pinned to CPU 0, serving 2 KiB at C{/config}."""

    def __init__(
        self,
        directory: Path,
        pki: Path,
        port: int,
        tickets: bool = False,
        accessLog: bool = False,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "body").write_bytes(b"x" * BODY_BYTES)
        self.accessLog = directory / "access.log"
        log = (
            "log_format reuse '$ssl_session_reused $ssl_protocol $ssl_curve';\n"
            f"  access_log {self.accessLog} reuse;"
            if accessLog
            else "access_log off;"
        )
        session = "on" if tickets else "off"
        cache = "shared:S:1m" if tickets else "off"
        self.conf = directory / "nginx.conf"
        self.conf.write_text(
            "user root;\nworker_processes 1;\nworker_cpu_affinity 01;\n"
            f"daemon off;\npid {directory}/nginx.pid;\n"
            f"error_log {directory}/error.log warn;\n"
            "events { worker_connections 4096; }\n"
            "http {\n"
            f"  {log}\n"
            f"  client_body_temp_path {directory}/tmp;\n"
            "  ssl_protocols TLSv1.3;\n"
            f"  ssl_session_tickets {session};\n  ssl_session_cache {cache};\n"
            "  keepalive_timeout 30s;\n"
            "  server {\n"
            f"    listen 127.0.0.1:{port} ssl backlog={BACKLOG};\n"
            f"    ssl_certificate {pki}/public.pem;\n"
            f"    ssl_certificate_key {pki}/public.key;\n"
            "    location = /config {\n"
            f"      default_type text/plain; alias {directory}/body;\n"
            "    }\n"
            "    location / { return 404; }\n"
            "  }\n"
            "}\n"
        )
        self.port = port
        self.process = subprocess.Popen(
            ["taskset", "-c", "0", "nginx", "-c", str(self.conf), "-e", "stderr"]
        )
        self.pid = self._worker()

    def _worker(self) -> int:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"nginx exited with {self.process.returncode}")
            pids = children.read_text().split() if children.exists() else []
            if pids and listening(self.port):
                return int(pids[0])
            time.sleep(0.02)
        raise SystemExit("nginx did not start")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


def listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def freePort() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --- the workload -----------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request of the storm and what it must get."""

    kind: str  # good, unknown, wrong, repeat
    path: str
    node: Node
    run: str | None  # the run a good request must get
    after: int | None = None  # for a repeat: index of the request it repeats


EXPECTED_STATUS = {"good": 200, "unknown": 404, "wrong": 403, "repeat": 410}
STATUS_KEYS = ("s200", "s403", "s404", "s410", "sother")


def buildWorkload(
    nodes: Sequence[Node],
    runs: dict[str, tuple[str, str]],
    rng: random.Random,
    unknownShare: float,
    wrongShare: float,
    repeatShare: float,
    concurrency: int,
) -> list[Request]:
    """
    Every node's own request, shuffled with the bad ones. A repeat comes at
    least 2 x concurrency places after the request it repeats.
    """
    keyed: list[tuple[float, Request]] = []
    for node in nodes:
        run, code = runs[node.name]
        keyed.append((rng.random(), Request("good", configPath(node, code), node, run)))
    for _ in range(round(len(nodes) * unknownShare)):
        node = rng.choice(nodes)
        path = configPath(node, secrets.token_urlsafe(24))
        keyed.append((rng.random(), Request("unknown", path, node, None)))
    for _ in range(round(len(nodes) * wrongShare)):
        owner, other = rng.sample(list(nodes), 2)
        path = configPath(other, runs[owner.name][1])
        keyed.append((rng.random(), Request("wrong", path, other, None)))
    keyed.sort(key=lambda pair: pair[0])
    total = len(keyed) + round(len(nodes) * repeatShare)
    gap = 2 * concurrency / total
    goods = [(k, r) for k, r in keyed if r.kind == "good" and k < 1 - gap]
    for key, original in rng.sample(goods, min(len(goods), total - len(keyed))):
        later = rng.uniform(key + gap, 1.0)
        keyed.append((later, Request("repeat", original.path, original.node, None)))
    keyed.sort(key=lambda pair: pair[0])
    ordered = [r for _, r in keyed]
    index = {r.path: i for i, r in enumerate(ordered) if r.kind == "good"}
    return [
        Request(r.kind, r.path, r.node, r.run, index[r.path])
        if r.kind == "repeat"
        else r
        for r in ordered
    ]


# --- running wrk ------------------------------------------------------------


@dataclass
class Run:
    """One wrk run against one server."""

    server: str
    figures: dict[str, float]
    wall: float
    serverCPU: float
    clientCPU: float
    peakRSS: int = 0  # KiB, sampled
    trailingCPU: float = 0.0  # server CPU after the last response
    mainCPU: float = 0.0  # the server's main thread alone
    outcomes: dict[str, int] = field(default_factory=dict)  # fleetd's counters

    @property
    def serverBusy(self) -> float:
        """Share of its core the server used during the run."""
        return self.serverCPU / self.seconds

    @property
    def real(self) -> int:
        return int(self.figures["real"])

    @property
    def seconds(self) -> float:
        return self.figures["duration"] / 1e6

    @property
    def connectionsPerSecond(self) -> float:
        return self.real / self.seconds

    @property
    def deliveriesPerSecond(self) -> float:
        return self.figures["s200"] / self.seconds

    @property
    def cpuPerRequest(self) -> float:
        """Server CPU seconds per connection, during the run."""
        return self.serverCPU / self.figures["requests"]

    @property
    def capacity(self) -> float:
        """Connections a second one core would sustain at this CPU cost."""
        return 1 / self.cpuPerRequest

    @property
    def errors(self) -> int:
        f = self.figures
        return int(f["connect"] + f["read"] + f["write"] + f["timeout"])


class RSSSampler:
    """Sample a process's VmRSS every 10 ms in a thread; keep the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, procStatus(self.pid, "VmRSS"))
            except (OSError, RuntimeError):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def threadCPU(pid: int) -> float:
    """CPU seconds of C{pid}'s main thread alone."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1]
    ticks = os.sysconf("SC_CLK_TCK")
    user, system = fields.split()[11:13]
    return (int(user) + int(system)) / ticks


def childCPU() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def waitIdle(pid: int, limit: float = 30.0) -> float:
    """Wait until C{pid} uses under 2 % CPU over 0.25 s; return CPU used."""
    start = before = cpuSeconds(pid)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = cpuSeconds(pid)
        if now - before < 0.005:
            break
        before = now
    return cpuSeconds(pid) - start


def runWrk(
    name: str,
    work: Path,
    port: int,
    requests: Sequence[Request],
    expect: dict[str, str] | None,
    concurrency: int,
    serverPid: int,
    clientCPUs: str,
    sampleRSS: bool = False,
    scheme: str = "https",
) -> Run:
    paths = work / "paths.txt"
    # The first line is the placeholder for wrk's own check of request().
    paths.write_text(OVERSHOOT + "\n" + "".join(r.path + "\n" for r in requests))
    expectFile = "-"
    if expect is not None:
        expectFile = str(work / "expect.txt")
        Path(expectFile).write_text("".join(f"{r} {d}\n" for r, d in expect.items()))
    script = work / "storm.lua"
    script.write_text(LUA)
    out = work / f"wrk-{name}.out"
    out.unlink(missing_ok=True)
    argv = ["taskset", "-c", clientCPUs, "wrk", "-t1", f"-c{concurrency}"]
    argv += [f"-d{TIME_LIMIT}s", "--timeout", "10s", "-s", str(script)]
    argv += [f"{scheme}://127.0.0.1:{port}", "--", str(paths), expectFile]
    sampler = RSSSampler(serverPid) if sampleRSS else None
    cpuBefore, clientBefore = cpuSeconds(serverPid), childCPU()
    mainBefore = threadCPU(serverPid)
    started = time.monotonic()
    doneFile = work / f"wrk-{name}.done"
    doneFile.unlink(missing_ok=True)
    process = subprocess.Popen(
        argv,
        env=dict(os.environ, WRK_OUT=str(out), WRK_DONE=str(doneFile)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while process.poll() is None and not doneFile.exists():
        time.sleep(0.001)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=TIME_LIMIT + 30)
    wall = time.monotonic() - started
    serverCPU = cpuSeconds(serverPid) - cpuBefore
    mainCPU = threadCPU(serverPid) - mainBefore
    clientCPU = childCPU() - clientBefore
    peak = sampler.stop() if sampler is not None else 0
    if process.returncode != 0 or not out.exists():
        raise SystemExit(f"wrk failed: {stdout}\n{stderr}")
    figures = {}
    for line in out.read_text().splitlines():
        key, value = line.split()
        figures[key] = float(value)
    if figures["real"] < len(requests):
        print(f"  {name}: only {figures['real']:.0f} of {len(requests)} answered")
    return Run(name, figures, wall, serverCPU, clientCPU, peak, mainCPU=mainCPU)


# --- TLS checks -------------------------------------------------------------


def sClient(port: int, ca: Path) -> dict[str, str]:
    """
    C{openssl s_client -reconnect}: the protocol, key exchange group and
    whether the server resumed any of the five reconnections.
    """
    result = subprocess.run(
        [
            *("openssl", "s_client", "-connect", f"127.0.0.1:{port}"),
            *("-servername", "localhost", "-CAfile", str(ca), "-reconnect"),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    text = result.stdout
    group = re.search(r"(?:Server Temp Key|Negotiated TLS1.3 group): (\S+)", text)
    protocol = re.search(r"^(?:New|Reused), (TLSv[\d.]+)", text, re.M)
    verify = re.search(r"Verify return code: (\d+)", text)
    return {
        "protocol": protocol.group(1) if protocol else "?",
        "group": group.group(1).rstrip(",") if group else "?",
        "new": str(len(re.findall(r"^New, ", text, re.M))),
        "reused": str(len(re.findall(r"^Reused, ", text, re.M))),
        "verify": verify.group(1) if verify else "?",
    }


def resumptionProbe(work: Path, pki: Path, requests: int, concurrency: int) -> str:
    """
    Does wrk resume TLS sessions when the server lets it? nginx with
    session tickets and a cache on, access log of C{$ssl_session_reused}.
    """
    nginx = Nginx(work / "nginx-probe", pki, freePort(), tickets=True, accessLog=True)
    try:
        fake = [
            Request("good", f"/config?probe={i}", Node("p", "p", "p"), None)
            for i in range(requests)
        ]
        runWrk("probe", work, nginx.port, fake, None, concurrency, nginx.pid, "1")
    finally:
        nginx.stop()
    flags = Counter(
        line.split()[0] for line in nginx.accessLog.read_text().splitlines()
    )
    protocols = Counter(
        line.split()[1] for line in nginx.accessLog.read_text().splitlines()
    )
    return (
        f"{flags.get('r', 0)} of {sum(flags.values())} connections resumed"
        f" ({dict(protocols)})"
    )


# --- the Python correctness pass --------------------------------------------


@dataclass
class Verified:
    statuses: Counter[int] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    delivered: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    seconds: float = 0.0


def parseResponse(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        decoded, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            length = int(size.split(b";")[0], 16)
            if length == 0:
                break
            decoded, rest = decoded + rest[:length], rest[length + 2 :]
        body = decoded
    return status, body


async def verifyPass(
    port: int, ca: Path, requests: Sequence[Request], concurrency: int
) -> Verified:
    """Every request on its own TLS 1.3 connection; check each answer."""
    context = ssl.create_default_context(cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    result = Verified()
    finished = [asyncio.Event() for _ in requests]
    position = iter(range(len(requests)))

    async def one(i: int) -> None:
        request = requests[i]
        if request.after is not None:
            await finished[request.after].wait()
        started = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    "127.0.0.1", port, ssl=context, server_hostname="localhost"
                ),
                30,
            )
            writer.write(
                f"GET {request.path} HTTP/1.1\r\nHost: localhost\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            raw = await asyncio.wait_for(reader.read(), 30)
            writer.close()
        except (OSError, TimeoutError, ssl.SSLError):
            result.errors += 1
            finished[i].set()
            return
        result.latencies.append(time.monotonic() - started)
        status, body = parseResponse(raw)
        result.statuses[status] += 1
        want = EXPECTED_STATUS[request.kind]
        if status == 200:
            run = re.search(rb"fleetd\.io/run: (\S+)", body)
            device = re.search(rb"fleetd\.io/device: (\S+)", body)
            host = re.search(rb"hostname: (\S+)", body)
            got = tuple(m.group(1).decode() if m else None for m in (run, device, host))
            if run is not None:
                result.delivered[got[0] or ""] += 1
            mine = (request.run, request.node.name, request.node.name)
            if request.kind != "good" or got != mine:
                result.wrong.append(f"{request.kind} {request.node.name} got {got}")
        elif status != want:
            result.wrong.append(f"{request.kind} {request.node.name}: {status}")
        finished[i].set()

    async def worker() -> None:
        for i in position:
            await one(i)

    started = time.monotonic()
    await asyncio.wait_for(
        asyncio.gather(*(worker() for _ in range(concurrency))), TIME_LIMIT
    )
    result.seconds = time.monotonic() - started
    return result


# --- the report -------------------------------------------------------------


def ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    import OpenSSL

    import twisted

    nginxVersion = subprocess.run(
        ["nginx", "-v"], capture_output=True, text=True, check=False
    ).stderr.strip()
    system = subprocess.run(
        ["openssl", "version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC;"
        f" {os.cpu_count()} CPUs (`nproc`), `{model}`; Python"
        f" {platform.python_version()}, Twisted {twisted.__version__},"
        f" pyOpenSSL {OpenSSL.__version__} ("
        f"{OpenSSL.SSL.OpenSSL_version(OpenSSL.SSL.OPENSSL_VERSION).decode()});"
        f" {nginxVersion} ({system} from Debian); wrk 4.1.0 (Debian)"
    )


_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def _frame(text: str) -> tuple[str, bool]:
    """C{"function (file.py)"} and whether the frame is fleetd's own code."""
    match = _FRAME.match(text)
    if match is None:
        return text, False
    function, path = match.groups()
    ours = path.startswith("fleetd/") or "/fleetd/" in path
    return f"{function} ({path.rsplit('/', 1)[-1]})", ours


def pySpyReport(path: Path, top: int = 12) -> list[str]:
    """
    Per thread: the functions with the most samples of their own, and the
    fleetd frames with the most samples below them (py-spy's raw output).
    """
    own: dict[str, Counter[str]] = {}
    inclusive: dict[str, Counter[str]] = {}
    total: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():  # py-spy's own notices share the file
            continue
        n = int(count)
        names = stack.split(";")
        thread = "main thread" if "MainThread" in names[0] else "other threads"
        frames = [_frame(f) for f in names[1:]]
        if not frames:
            continue
        total[thread] += n
        own.setdefault(thread, Counter())[frames[-1][0]] += n
        for name in {f for f, ours in frames if ours}:
            inclusive.setdefault(thread, Counter())[name] += n
    everything = sum(total.values())
    lines: list[str] = []
    for thread, samples in total.most_common():
        lines += [
            f"{thread}: {samples} samples ({samples / everything:.0%} of all)",
            "",
            "| self | function | inclusive | fleetd frame |",
            "|---:|---|---:|---|",
        ]
        mine = inclusive.get(thread, Counter()).most_common(top)
        for i, (f1, c1) in enumerate(own[thread].most_common(top)):
            f2, c2 = mine[i] if i < len(mine) else ("", 0)
            share = f"{c2 / samples:.1%}" if f2 else ""
            name = f"`{f2}`" if f2 else ""
            lines.append(f"| {c1 / samples:.1%} | `{f1}` | {share} | {name} |")
        lines.append("")
    return lines


# --- main -------------------------------------------------------------------


class Hog:
    """A busy loop pinned to CPU 0 (bounded to the wrk time limit)."""

    def __init__(self) -> None:
        loop = f"import time\nt = time.monotonic() + {TIME_LIMIT}\n"
        loop += "while time.monotonic() < t: pass\n"
        self.process = subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, "-c", loop]
        )

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


class Spy:
    """py-spy recording one process (raw collapsed stacks) until L{stop}."""

    def __init__(self, binary: Path, pid: int, out: Path) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [
                *("taskset", "-c", "1", str(binary), "record", "--pid", str(pid)),
                *("--rate", "500", "--format", "raw", "--threads"),
                *("--nonblocking", "-o", str(out)),
                *(("--gil",) if os.environ.get("SPY_GIL") else ()),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1)  # attached

    def stop(self) -> list[str]:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)
        return pySpyReport(self.out)


def parseArguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--unknown", type=float, default=0.10, help="share: 404")
    parser.add_argument("--wrong", type=float, default=0.02, help="share: 403")
    parser.add_argument("--repeats", type=float, default=0.05, help="share: 410")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="fleetd only")
    parser.add_argument("--no-verify", action="store_true", help="skip Python pass")
    parser.add_argument(
        "--state-tmpfs",
        action="store_true",
        help="what-if: paths.state on /dev/shm too (fsync costs next to nothing)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=BACKLOG,
        help=f"listen backlog of fleetd's boot listener (default {BACKLOG}, as"
        " nginx; Twisted's own default is 50)",
    )
    parser.add_argument(
        "--contend",
        action="store_true",
        help="what-if: a busy loop shares CPU 0 with fleetd during its storms",
    )
    parser.add_argument("--write", type=Path, help="append the markdown here")
    parser.add_argument(
        "--py-spy", type=Path, help="py-spy binary: profile fleetd and the minimal"
    )
    parser.add_argument("--serve-minimal", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_minimal is None:
        if not 2 <= args.nodes <= 50_000 or not 1 <= args.concurrency <= 1000:
            parser.error("--nodes 2..50000, --concurrency 1..1000")
        if not 1 <= args.rounds <= 10:
            parser.error("--rounds 1..10")
    return args


def main() -> None:
    args = parseArguments()
    if args.serve_minimal is not None:
        serveMinimal(args.serve_minimal)
        return
    for tool in ("wrk", "nginx", "openssl", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (see bench/README.md)")

    # The orchestrator (and so the Python client) shares CPU 1 with wrk.
    os.sched_setaffinity(0, {1})
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fleetd-boot-storm-"))
    shm = Path(tempfile.mkdtemp(prefix="fleetd-boot-storm-", dir="/dev/shm"))
    overrides = {k: dict(v) for k, v in STORM_OVERRIDES.items()}
    bootListen = f"tcp:0:interface=127.0.0.1:backlog={args.backlog}"
    overrides["listen"] = {"boot": bootListen}
    if args.state_tmpfs:
        overrides["paths"] = {"state": str(shm / "state")}
    fleet = makeFleet(work / "fleet", shm / "vault", overrides)
    pki = fleet.pki.directory
    daemon = Daemon(fleet, cpus="0")
    minimal: Minimal | None = None
    nginx: Nginx | None = None
    runs: dict[str, list[Run]] = {"fleetd": [], "nginx": [], "twisted": []}
    tls: dict[str, dict[str, str]] = {}
    probe = ""
    profiles: dict[str, list[str]] = {}
    verified: Verified | None = None

    def spy(name: str, pid: int, i: int) -> Spy | None:
        if args.py_spy is None or i != 0:
            return None
        return Spy(
            args.py_spy,
            pid,
            Path(os.environ.get("SPY_DIR", str(work))) / f"spy-{name}.txt",
        )

    try:
        daemon.start(waitFor=b"runs.loaded")
        admin = Admin(fleet, daemon.ports["admin"])
        nodes = makeNodes(args.nodes)
        admin.importDevices(nodes)
        boot = daemon.ports["boot"]

        def workload() -> tuple[list[Request], dict[str, str]]:
            started = time.monotonic()
            fresh = admin.provision([n.name for n in nodes])
            print(f"provisioned {len(fresh)} runs in", end=" ")
            print(f"{time.monotonic() - started:.1f} s")
            waitIdle(daemon.pid)
            shares = (args.unknown, args.wrong, args.repeats)
            requests = buildWorkload(nodes, fresh, rng, *shares, args.concurrency)
            return requests, {run: name for name, (run, _) in fresh.items()}

        tls["fleetd"] = sClient(boot, fleet.pki.public_ca)
        if not args.no_peers:
            nginx = Nginx(work / "nginx", pki, freePort())
            minimal = Minimal(pki, "0")
            tls["nginx"] = sClient(nginx.port, fleet.pki.public_ca)
            tls["twisted"] = sClient(minimal.port, fleet.pki.public_ca)
            probe = resumptionProbe(work, pki, 1000, args.concurrency)
            print(f"wrk against nginx with tickets on: {probe}")
        print(f"TLS: {tls}")
        for i in range(args.rounds):
            print(f"round {i + 1}:", end=" ")
            requests, expect = workload()
            spying = spy("fleetd", daemon.pid, i)
            before = configOutcomes(daemon.ports["admin"], fleet.pki.public_ca)
            hog = Hog() if args.contend else None
            try:
                run = runWrk(
                    "fleetd",
                    work,
                    boot,
                    requests,
                    expect,
                    args.concurrency,
                    daemon.pid,
                    "1",
                    sampleRSS=True,
                )
            finally:
                if hog is not None:
                    hog.stop()
            run.trailingCPU = waitIdle(daemon.pid)
            after = configOutcomes(daemon.ports["admin"], fleet.pki.public_ca)
            run.outcomes = {
                k: int(v - before.get(k, 0))
                for k, v in after.items()
                if v > before.get(k, 0)
            }
            if spying is not None:
                profiles["fleetd"] = spying.stop()
            check(run, requests)
            runs["fleetd"].append(run)
            report(run)
            if nginx is None or minimal is None:
                continue
            for name, port, pid in (
                ("nginx", nginx.port, nginx.pid),
                ("twisted", minimal.port, minimal.pid),
            ):
                spying = spy(name, pid, i) if name == "twisted" else None
                peer = runWrk(
                    name, work, port, requests, None, args.concurrency, pid, "1"
                )
                if spying is not None:
                    profiles[name] = spying.stop()
                runs[name].append(peer)
                report(peer)
        hwm = daemon.hwmKiB()
        if not args.no_verify:
            print("Python pass:", end=" ")
            requests, _ = workload()
            verified = asyncio.run(
                verifyPass(boot, fleet.pki.public_ca, requests, args.concurrency)
            )
            print(
                f"  {dict(verified.statuses)}, wrong {len(verified.wrong)},"
                f" errors {verified.errors}, {len(requests) / verified.seconds:.0f}/s"
            )
            for w in verified.wrong[:10]:
                print("  wrong:", w)
        hwmEnd = daemon.hwmKiB()
        logText = daemon.logText()
    finally:
        daemon.stop()
        if nginx is not None:
            nginx.stop()
        if minimal is not None:
            minimal.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    tracebacks = logText.count("Traceback")
    lines = tables(args, runs, tls, probe, hwm, hwmEnd, verified, tracebacks)
    for name, profile in profiles.items():
        lines += ["", f"py-spy of {name} during round 1:", "", *profile]
    text = "\n".join(lines)
    print()
    print(text)
    if args.write is not None:
        with open(args.write, "a") as f:
            f.write(text + "\n")


def check(run: Run, requests: Sequence[Request]) -> None:
    """Print any difference between the status counts and the workload."""
    want = Counter(EXPECTED_STATUS[r.kind] for r in requests)
    got = {s: int(run.figures[f"s{s}"]) for s in (200, 403, 404, 410)}
    if got != dict(want) or run.figures["sother"]:
        print(f"  status counts {got} other {run.figures['sother']:.0f}, want {want}")


def report(run: Run) -> None:
    f = run.figures
    print(
        f"  {run.server}: {run.real} in {run.seconds:.2f} s ="
        f" {run.connectionsPerSecond:.0f} conn/s, {run.deliveriesPerSecond:.0f}"
        f" 200/s, p50 {ms(f['p50'])} p99 {ms(f['p99'])}, errors {run.errors},"
        f" server CPU {run.cpuPerRequest * 1e6:.0f} µs/conn, client CPU"
        f" {run.clientCPU / run.wall:.0%} of its core"
    )
    if run.outcomes:
        print("    fleetd's /config outcomes:", run.outcomes)
    if run.errors:
        kinds = ("connect", "read", "write", "timeout")
        print("    socket errors:", {k: int(f[k]) for k in kinds})


def triple(runs: Sequence[Run], key: str) -> str:
    """p50 / p90 / p99 style: the medians over rounds of C{key}s."""
    return ms(median([r.figures[key] for r in runs]))


def fleetdRows(
    args: argparse.Namespace,
    fleetd: Sequence[Run],
    hwm: int,
    hwmEnd: int,
    tracebacks: int,
) -> list[tuple[str, str]]:
    conn = median([r.connectionsPerSecond for r in fleetd])

    def perRequest(cpu: Callable[[Run], float]) -> float:
        return median([cpu(r) / r.figures["requests"] for r in fleetd]) * 1e6

    statuses = " ; ".join(
        "/".join(f"{r.figures[k]:.0f}" for k in STATUS_KEYS) for r in fleetd
    )
    wrong = sum(int(r.figures["wrong"] + r.figures["dup"]) for r in fleetd)
    latency = " / ".join(triple(fleetd, k) for k in ("p50", "p90", "p99"))
    return [
        (
            "deliveries/s (200s / storm time)",
            f"{median([r.deliveriesPerSecond for r in fleetd]):.0f}",
        ),
        ("requests/s (new TLS connections/s)", f"{conn:.0f}"),
        ("storm time", f"{median([r.seconds for r in fleetd]):.2f} s"),
        (
            "latency p50 / p90 / p99 (wrk: request written to response read;"
            " excludes the TCP and TLS handshakes)",
            latency,
        ),
        (
            "mean time per connection incl. handshakes (concurrency / rate)",
            ms(1e6 * args.concurrency / conn),
        ),
        ("status 200/403/404/410/other, each round", statuses),
        (
            "fleetd's own count of outcomes (`fleetd_config_requests_total`),"
            " each round",
            " ; ".join(
                ", ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items()))
                for r in fleetd
            ),
        ),
        (
            "socket errors (connect, read, write, timeout), all rounds",
            str(sum(r.errors for r in fleetd)),
        ),
        (
            "**wrong deliveries** (a 200 body not the node's own, or a run"
            " twice), all rounds",
            f"**{wrong}**",
        ),
        (
            "fleetd CPU per request during the storm: all threads (main thread"
            " + database thread); share of CPU 0 used",
            f"{perRequest(lambda r: r.serverCPU):.0f} \u00b5s"
            f" ({perRequest(lambda r: r.mainCPU):.0f}"
            f" + {perRequest(lambda r: r.serverCPU - r.mainCPU):.0f});"
            f" {median([r.serverBusy for r in fleetd]):.0%}",
        ),
        (
            "server CPU after the last response (releases, journal)",
            f"{median([r.trailingCPU for r in fleetd]) * 1e3:.0f} ms a round",
        ),
        (
            "fleetd peak RSS (VmRSS sampled every 10 ms during the storms)",
            f"{max(r.peakRSS for r in fleetd) / 1024:.1f} MiB",
        ),
        (
            "fleetd VmHWM after the timed rounds / after the Python pass",
            f"{hwm / 1024:.1f} / {hwmEnd / 1024:.1f} MiB",
        ),
        ("tracebacks in fleetd's log", str(tracebacks)),
    ]


def verifiedRows(verified: Verified) -> list[tuple[str, str]]:
    lat = sorted(verified.latencies) or [0.0]
    p50, p99 = (lat[int(q * (len(lat) - 1))] * 1000 for q in (0.5, 0.99))
    twice = sum(1 for c in verified.delivered.values() if c > 1)
    rate = sum(verified.statuses.values()) / verified.seconds
    return [
        ("statuses", str(dict(sorted(verified.statuses.items())))),
        (
            "**wrong answers** (status or body not the request's own)",
            f"**{len(verified.wrong)}**",
        ),
        ("runs delivered twice", str(twice)),
        ("socket errors", str(verified.errors)),
        ("rate (client-bound)", f"{rate:.0f}/s"),
        ("latency incl. TCP and TLS handshakes p50 / p99", f"{p50:.1f} / {p99:.1f} ms"),
    ]


def table(header: str, rows: Sequence[tuple[str, str]]) -> list[str]:
    return [f"| {header} | value |", "|---|---:|"] + [f"| {a} | {b} |" for a, b in rows]


def tables(
    args: argparse.Namespace,
    runs: dict[str, list[Run]],
    tls: dict[str, dict[str, str]],
    probe: str,
    hwm: int,
    hwmEnd: int,
    verified: Verified | None,
    tracebacks: int,
) -> list[str]:
    fleetd = runs["fleetd"]
    lines = [
        f"Machine: {machine()}.",
        "",
        f"Workload per round: {args.nodes} nodes, each its own code once;"
        f" +{args.unknown:.0%} unknown codes (404), +{args.wrong:.0%} codes with"
        f" another machine's uuid/serial (403), +{args.repeats:.0%} repeats of"
        f" consumed codes (410): {fleetd[0].real} requests, shuffled, concurrency"
        f" {args.concurrency}, one new TLS connection per request. fleetd, nginx"
        " and the minimal server pinned to CPU 0, wrk to CPU 1. Medians of"
        f" {len(fleetd)} rounds (fresh runs each round). fleetd: dev-style config,"
        f" boot listener backlog {args.backlog}, brute-force and per-source"
        " limits lifted (one source address), vault on tmpfs, state (SQLite,"
        f" synchronous=FULL) on {'tmpfs (what-if)' if args.state_tmpfs else 'disk'}."
        + (
            " What-if: a busy loop shared CPU 0 with fleetd during its storms."
            if args.contend
            else ""
        ),
        "",
    ]
    lines += table(
        "fleetd boot storm", fleetdRows(args, fleetd, hwm, hwmEnd, tracebacks)
    )
    if verified is not None:
        lines += [
            "",
            "Correctness pass (Python asyncio client on CPU 1, fresh runs, same"
            " mix; each response checked against its own request; a repeat is"
            " sent only after its original finished):",
            "",
        ]
        lines += table("Python pass", verifiedRows(verified))
    if runs["nginx"]:
        lines += ["", *comparison(runs, tls, probe)]
    return lines


def ownWork(fleetd: Sequence[Run], minimal: Sequence[Run]) -> list[str]:
    """
    fleetd's own work round by round: fleetd's CPU per request minus the
    minimal server's in the same round, which ran a minute apart at most
    (the medians of each alone drift apart when the machine's speed
    changes between rounds).
    """
    pairs = list(zip(fleetd, minimal, strict=False))
    if not pairs:
        return []
    own = [(f.cpuPerRequest - m.cpuPerRequest) * 1e6 for f, m in pairs]
    perDelivery = [
        o * f.figures["requests"] / max(1.0, f.figures["s200"])
        for o, (f, _) in zip(own, pairs, strict=True)
    ]
    return [
        f"- fleetd's own work round by round (fleetd minus minimal twisted.web"
        f" in the same round, {len(own)} rounds): **median {median(own):.0f} µs"
        f" a request** (range {min(own):.0f} to {max(own):.0f}); charged to the"
        f" deliveries alone (refusals' work included), median"
        f" {median(perDelivery):.0f} µs a delivery."
    ]


def comparison(
    runs: dict[str, list[Run]], tls: dict[str, dict[str, str]], probe: str
) -> list[str]:
    def per(key: str, value: Callable[[Run], float]) -> float:
        return median([value(r) for r in runs[key]])

    n = per("nginx", lambda r: r.connectionsPerSecond)
    t = per("twisted", lambda r: r.connectionsPerSecond)
    fc = per("fleetd", lambda r: r.connectionsPerSecond)
    fd = per("fleetd", lambda r: r.deliveriesPerSecond)
    cpu = {k: per(k, lambda r: r.cpuPerRequest) * 1e6 for k in runs}
    lines = [
        "Side by side (same request list, same wrk, same concurrency, rounds"
        " interleaved; nginx: 2 KiB static body, `ssl_session_tickets off`,"
        " `ssl_session_cache off`, TLS 1.3 only; minimal twisted.web: `Site`"
        " + `static.Data` 2 KiB, `CertificateOptions` like fleetd's, no access"
        " log; fleetd: its real config bodies and refusals):",
        "",
        "| server | new connections/s | deliveries/s | x nginx (conn/s)"
        " | server CPU per connection | server core busy | one-core capacity"
        " (1 / CPU) | p50 / p99 | wrk core busy | TLS (s_client)"
        " | resumed (s_client -reconnect) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for key, label, conn, deliveries in (
        ("nginx", "nginx, 1 worker", n, n),
        ("twisted", "minimal twisted.web", t, t),
        ("fleetd", "fleetd", fc, fd),
    ):
        info = tls.get(key, {})
        tries = int(info.get("reused", "0")) + int(info.get("new", "1")) - 1
        busy = per(key, lambda r: r.clientCPU / r.wall)
        serverBusy = per(key, lambda r: r.serverBusy)
        latency = f"{triple(runs[key], 'p50')} / {triple(runs[key], 'p99')}"
        lines.append(
            f"| {label} | {conn:.0f} | {deliveries:.0f} | {conn / n:.2f}x"
            f" | {cpu[key]:.0f} \u00b5s | {serverBusy:.0%} | {1e6 / cpu[key]:.0f}/s"
            f" | {latency} | {busy:.0%}"
            f" | {info.get('protocol')} {info.get('group')}"
            f" | {info.get('reused')} of {tries} |"
        )
    capacity = 1e6 / cpu["nginx"]
    nginxBusy = per("nginx", lambda r: r.serverBusy)
    lines += [
        "",
        f"- As measured: **fleetd deliveries/s / nginx new connections/s ="
        f" {fd / n:.2f}x** (target >= 0.40x); fleetd connections / nginx ="
        f" {fc / n:.2f}x; minimal twisted.web / nginx = {t / n:.2f}x. nginx"
        f" used only {nginxBusy:.0%} of its core while wrk's core was"
        f" {per('nginx', lambda r: r.clientCPU / r.wall):.0%} busy: the"
        " client, not nginx, set nginx's rate.",
        f"- Against nginx's one-core capacity ({capacity:.0f}/s = 1 /"
        f" {cpu['nginx']:.0f} \u00b5s): **fleetd deliveries/s / capacity ="
        f" {fd / capacity:.2f}x**; by CPU per connection, nginx / fleetd ="
        f" {cpu['nginx'] / cpu['fleetd']:.2f}x, nginx / minimal twisted.web ="
        f" {cpu['nginx'] / cpu['twisted']:.2f}x, minimal twisted.web / fleetd ="
        f" {cpu['twisted'] / cpu['fleetd']:.2f}x (fleetd's own work is"
        f" {cpu['fleetd'] - cpu['twisted']:.0f} \u00b5s a request on top of"
        " Twisted + TLS).",
        *ownWork(runs["fleetd"], runs["twisted"]),
        "",
        "Session resumption: wrk keeps the previous connection's TLS session"
        " for its next connection and offers it, so a server that allows"
        " resumption gets abbreviated handshakes. Measured against nginx with"
        f" tickets and a session cache on: {probe}. All three servers above"
        " refuse resumption (last column), so every connection measured was a"
        " full handshake.",
    ]
    return lines


if __name__ == "__main__":
    main()
