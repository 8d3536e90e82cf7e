"""
Disk keys (issue 30): fleetd as the site's Talos KMS, measured on a real
C{twistd -n fleetd} with C{[kms]} and a client of its own (asyncio,
C{bench/_kmsclient.py}). Both are left to the scheduler: on a machine
shared with other work, a process pinned to a busy core waits for it
(C{--pin} puts fleetd on CPU 0 and the client on CPU 1, as the other
benchmarks do); fleetd's CPU per call does not depend on it.

N nodes (default 2,000) are imported, their EK evidence imported and
every binding approved by the owner, as a site's are; each is
provisioned and fetches its configuration from its own loopback address
(127.1.x.y: [E1] answers a node only from the address its configuration
went to, and each node is its own source for the per-source limits).
Each node then Seals 32 random bytes (its key made and journaled, [E2]);
the blobs are kept as Talos keeps them. Then:

  - rate, new connections: closed loop at C{--concurrency}, each Unseal
    on a new TLS connection from the node's address, as a booting Talos
    calls (C{--rounds} passes over the nodes). fleetd's CPU (user+system
    of the process, all threads, from C{/proc/PID/stat}) per call gives
    the calls per second one core of fleetd answers, TLS handshakes
    included;
  - rate, kept connections: one connection per node, C{--kept} Unseals
    on it one after the other: the call's own cost with the handshake
    spread over them;
  - the rack's reboot: every node reboots within C{--windows} seconds
    (each window one storm, default 60 then 10): each node's Unseal on a
    new connection at a uniform random moment of the window and, beside
    it, the same node's configuration delivery (a fresh run provisioned
    for every node before the storm: boot_storm's deliveries, one each,
    from the node's address) at another. Reported: the Unseal's and the
    delivery's p50/p99/max from the client (connect to answer), fleetd's
    own C{fleetd_kms_unlock_seconds} share under 1 s, and fleetd's CPU
    over the storm. The target: p99 under 1 s.

Every answer is checked: each Unseal returns the node's own bytes, each
delivery is a 200. /proc/loadavg is printed with each phase (the machine
may be shared). Loopback only; bounded; everything started is stopped.

    PYTHONPATH=. .venv/bin/python bench/kms.py [--nodes 2000]
        [--concurrency 32] [--rounds 2] [--kept 10] [--windows 60,10]
        [--pin] [--state-tmpfs] [--keep]
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
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._fleet import (
    STORM_OVERRIDES,
    Admin,
    Daemon,
    Node,
    configPath,
    makeFleet,
    makeNodes,
    tlsContext,
)
from bench._kmsclient import (
    SEAL,
    UNSEAL,
    Answer,
    KMSConnection,
    bootContext,
    fetchConfig,
    kmsContext,
    oneCall,
)

ENROLLMENT = "enroll.lolwtf.ca"
SEAL_CONCURRENCY = 32


def address(index: int) -> str:
    """Node C{index}'s own loopback address (0-based): 127.1.1.1 on."""
    return f"127.{1 + index // 62500}.{1 + index // 250 % 250}.{1 + index % 250}"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
        if ordered
        else 0.0
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def clientCPU() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def enroll(admin: Admin, nodes: Sequence[Node]) -> None:
    """The devices, their EK evidence, every binding approved (eight
    owner requests at a time)."""
    admin.importDevices(nodes)
    manifest = ["serial,ek_sha256"]
    manifest += [f"{n.serial},{os.urandom(32).hex()}" for n in nodes]
    status, body = admin.call(
        "POST", "/v1/admin/evidence/import?kind=receiving-scan&ref=bench",
        ("\n".join(manifest) + "\n").encode(), "text/csv",
    )  # fmt: skip
    if status != 200:
        raise RuntimeError(f"evidence: {status} {body[:200]!r}")

    def approve(node: Node) -> None:
        doc = f'{{"serial": "{node.serial}"}}'.encode()
        status, body = admin.call("POST", "/v1/admin/bindings/approve", doc)
        if status not in (200, 201):
            raise RuntimeError(f"approve {node.serial}: {status} {body[:200]!r}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(approve, nodes))


async def bounded(
    jobs: Sequence[Callable[[], Awaitable[Any]]], concurrency: int
) -> list[Any]:
    """Run C{jobs} with at most C{concurrency} at once; their results in order."""
    results: list[Any] = [None] * len(jobs)
    position = iter(range(len(jobs)))

    async def worker() -> None:
        for i in position:
            results[i] = await jobs[i]()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def line(
    what: str, count: int, seconds: float, used: float, latencies: list[float]
) -> str:
    """One phase's figures: rate, fleetd's CPU per call and per core."""
    return (
        f"{what}: {count} in {seconds:.1f} s ({count / seconds:.0f}/s); fleetd CPU"
        f" {ms(used / count)}/call = {count / used:.0f} calls/s per core"
        f" ({used / seconds:.0%} of a core busy); p50 {ms(percentile(latencies, 0.5))}"
        f" p99 {ms(percentile(latencies, 0.99))}; load {loadavg()}"
    )


class Bench:
    def __init__(self, daemon: Daemon, nodes: Sequence[Node], ca: Path) -> None:
        self.daemon = daemon
        self.nodes = nodes
        self.kms = daemon.ports["kms"]
        self.boot = daemon.ports["boot"]
        self.context = kmsContext(ca)
        self.bootContext = bootContext(ca)
        self.passphrases = [os.urandom(32) for _ in nodes]
        self.blobs: list[bytes] = []
        self.idle = 0.0  # fleetd's CPU seconds per second with nothing asked

    def call(self, i: int, path: str) -> Callable[[], Awaitable[Answer]]:
        """Node C{i}'s Seal of its bytes or Unseal of its blob, on a new
        connection from its address."""
        node, source = self.nodes[i], address(i)
        data = self.passphrases[i] if path == SEAL else self.blobs[i]
        return lambda: oneCall(self.kms, self.context, ENROLLMENT, source, path,
                               node.uuid, data)  # fmt: skip

    def deliver(self, i: int, code: str) -> Callable[[], Awaitable[Answer]]:
        """Node C{i}'s configuration fetch with C{code}, from its address."""
        path = configPath(self.nodes[i], code)
        return lambda: fetchConfig(self.boot, self.bootContext, ENROLLMENT,
                                   address(i), path)  # fmt: skip

    def check(self, answers: Sequence[Answer], which: Sequence[int], what: str) -> None:
        wrong = [
            (self.nodes[i].name, a.status, a.message[:80])
            for a, i in zip(answers, which, strict=True)
            if a.status != 0 or a.data != self.passphrases[i]
        ]
        if wrong:
            raise SystemExit(f"{what}: {len(wrong)} wrong answers, first {wrong[:3]}")

    async def install(self, runs: dict[str, tuple[str, str]]) -> None:
        """Each node's first configuration, from its address: where [E1]
        then answers it from."""
        jobs = [self.deliver(i, runs[n.name][1]) for i, n in enumerate(self.nodes)]
        started = time.monotonic()
        delivered = await bounded(jobs, SEAL_CONCURRENCY)
        failed = [(a.status, a.message) for a in delivered if a.status != 200]
        if failed:
            raise SystemExit(f"install: {len(failed)} deliveries failed: {failed[:3]}")
        print(f"installed: {len(delivered)} configurations delivered in"
              f" {time.monotonic() - started:.1f} s; load {loadavg()}")  # fmt: skip

    async def seal(self) -> None:
        jobs = [self.call(i, SEAL) for i in range(len(self.nodes))]
        cpu, started = self.daemon.cpu(), time.monotonic()
        answers = await bounded(jobs, SEAL_CONCURRENCY)
        seconds, used = time.monotonic() - started, self.daemon.cpu() - cpu
        bad = [a for a in answers if a.status != 0 or not a.data]
        if bad:
            raise SystemExit(f"seal: {len(bad)} refused, first {bad[0].message}")
        self.blobs = [a.data for a in answers]
        latencies = [a.seconds for a in answers]
        print(line("seal, new connections", len(answers), seconds, used, latencies))

    async def rateFresh(self, rounds: int, concurrency: int) -> None:
        which = [i for _ in range(rounds) for i in range(len(self.nodes))]
        jobs = [self.call(i, UNSEAL) for i in which]
        cpu, mine, started = self.daemon.cpu(), clientCPU(), time.monotonic()
        answers = await bounded(jobs, concurrency)
        seconds, used = time.monotonic() - started, self.daemon.cpu() - cpu
        self.check(answers, which, "unseal")
        latencies = [a.seconds for a in answers]
        what = f"unseal, new connections, {concurrency} in flight"
        print(line(what, len(answers), seconds, used, latencies))
        print(f"  client CPU {ms((clientCPU() - mine) / len(answers))}/call")

    async def rateKept(self, calls: int, concurrency: int) -> None:
        def one(i: int) -> Callable[[], Awaitable[list[Answer]]]:
            async def run() -> list[Answer]:
                node = self.nodes[i]
                connection = KMSConnection(
                    self.kms, self.context, ENROLLMENT, address(i)
                )
                try:
                    await connection.open()
                    return [await connection.call(UNSEAL, node.uuid, self.blobs[i])
                            for _ in range(calls)]  # fmt: skip
                finally:
                    connection.close()

            return run

        cpu, started = self.daemon.cpu(), time.monotonic()
        results = await bounded([one(i) for i in range(len(self.nodes))], concurrency)
        seconds, used = time.monotonic() - started, self.daemon.cpu() - cpu
        answers = [a for r in results for a in r]
        which = [i for i in range(len(self.nodes)) for _ in range(calls)]
        self.check(answers, which, "unseal (kept)")
        latencies = [a.seconds for a in answers]
        what = f"unseal, kept connections ({calls} calls each, {concurrency} at once)"
        print(line(what, len(answers), seconds, used, latencies))

    async def storm(
        self, window: float, runs: dict[str, tuple[str, str]], rng: random.Random
    ) -> None:
        """Every node's Unseal and delivery at random moments of C{window}."""
        loop = asyncio.get_running_loop()
        begin = loop.time() + 0.5

        async def at(moment: float, job: Callable[[], Awaitable[Any]]) -> Any:
            await asyncio.sleep(max(0.0, begin + moment - loop.time()))
            return await job()

        count = len(self.nodes)
        before = unlockBuckets(self.daemon)
        cpu, mine, started = self.daemon.cpu(), clientCPU(), time.monotonic()
        unseals = [
            at(rng.uniform(0, window), self.call(i, UNSEAL)) for i in range(count)
        ]
        fetches = [
            at(rng.uniform(0, window), self.deliver(i, runs[n.name][1]))
            for i, n in enumerate(self.nodes)
        ]
        results = await asyncio.gather(*unseals, *fetches)
        seconds, used = time.monotonic() - started, self.daemon.cpu() - cpu
        mine = clientCPU() - mine
        answers: list[Answer] = list(results[:count])
        delivered: list[Answer] = list(results[count:])
        self.check(answers, range(count), f"storm {window:g} s")
        failed = [(a.status, a.message) for a in delivered if a.status != 200]
        if failed:
            raise SystemExit(f"storm {window:g} s: {len(failed)} deliveries failed:"
                             f" {failed[:3]}")  # fmt: skip
        after = unlockBuckets(self.daemon)
        under = after.get("1.0", 0) - before.get("1.0", 0)
        total = after.get("+Inf", 0) - before.get("+Inf", 0)
        unlock = [a.seconds for a in answers]
        config = [a.seconds for a in delivered]

        def spread(values: list[float]) -> str:
            p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
            return f"p50 {ms(p50)} p99 {ms(p99)} max {ms(max(values))}"

        print(f"storm over {window:g} s: {count} Unseals and {count} deliveries in"
              f" {seconds:.1f} s; load {loadavg()}")  # fmt: skip
        print(f"  Unseal {spread(unlock)}; fleetd's fleetd_kms_unlock_seconds:"
              f" {under:.0f}/{total:.0f} under 1 s, p99 at most"
              f" {bucketP99(before, after)}")  # fmt: skip
        print(f"  delivery {spread(config)}")
        own = max(0.0, used - self.idle * seconds)
        each = ms(own / (2 * count))
        print(f"  fleetd CPU {used:.1f} s ({used / seconds:.0%} of a core); less its"
              f" idle rate, {own:.1f} s: {each} per request")  # fmt: skip
        print(f"  client CPU {mine:.1f} s ({mine / seconds:.0%} of a core)")

    async def measureIdle(self, seconds: float = 10.0) -> None:
        """fleetd's CPU while nothing asks it anything (its timers)."""
        cpu = self.daemon.cpu()
        await asyncio.sleep(seconds)
        self.idle = (self.daemon.cpu() - cpu) / seconds
        print(f"idle: fleetd CPU {self.idle:.1%} of a core over {seconds:g} s;"
              f" load {loadavg()}")  # fmt: skip


BUCKET = re.compile(
    rb'^fleetd_kms_unlock_seconds_bucket\{le="([^"]+)"\} ([\d.e+]+)$', re.M
)


def bucketP99(before: dict[str, float], after: dict[str, float]) -> str:
    """The smallest bucket bound holding 99 % of the calls in between."""
    total = after.get("+Inf", 0) - before.get("+Inf", 0)
    bounds = sorted((float(le), le) for le in after if le != "+Inf")
    for bound, le in bounds:
        if after[le] - before.get(le, 0) >= 0.99 * total:
            return ms(bound)
    return "+Inf"


def unlockBuckets(daemon: Daemon) -> dict[str, float]:
    """fleetd's C{fleetd_kms_unlock_seconds} buckets from C{/metrics}."""
    import http.client

    conn = http.client.HTTPSConnection(
        "localhost", daemon.ports["admin"], timeout=30,
        context=tlsContext(daemon.fleet.pki.public_ca),
    )  # fmt: skip
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read()
    finally:
        conn.close()
    return {le.decode(): float(v) for le, v in BUCKET.findall(text)}


def machine() -> str:
    import OpenSSL

    import twisted

    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC;"
        f" {os.cpu_count()} CPUs (`nproc`), `{model}`; Python"
        f" {platform.python_version()}, Twisted {twisted.__version__},"
        f" pyOpenSSL {OpenSSL.__version__}"
        f" ({OpenSSL.SSL.OpenSSL_version(OpenSSL.SSL.OPENSSL_VERSION).decode()})"
    )


def parseArguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32,
                        help="calls in flight in the rate phases")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2,
                        help="passes over the nodes, new connections")  # fmt: skip
    parser.add_argument("--kept", type=int, default=10,
                        help="calls per kept connection (0: skip)")  # fmt: skip
    parser.add_argument("--windows", default="60,10",
                        help="seconds each rack reboot is spread over")  # fmt: skip
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--pin", action="store_true",
                        help="fleetd on CPU 0, the client on CPU 1")  # fmt: skip
    parser.add_argument("--state-tmpfs", action="store_true",
                        help="the state database on tmpfs")  # fmt: skip
    parser.add_argument("--keep", action="store_true",
                        help="keep the state directory and fleetd's log")  # fmt: skip
    args = parser.parse_args()
    args.windowList = [float(w) for w in args.windows.split(",") if w]
    if not 1 <= args.nodes <= 60000:
        parser.error("--nodes 1..60000")
    return args


async def measure(args: argparse.Namespace, bench: Bench, admin: Admin) -> None:
    rng = random.Random(args.seed)
    names = [n.name for n in bench.nodes]
    await bench.install(await asyncio.to_thread(admin.provision, names))
    await bench.seal()
    if args.rounds:
        await bench.rateFresh(args.rounds, args.concurrency)
    if args.kept:
        await bench.rateKept(args.kept, args.concurrency)
    for window in args.windowList:
        started = time.monotonic()
        runs = await asyncio.to_thread(admin.provision, names)
        print(f"provisioned {len(runs)} runs in {time.monotonic() - started:.1f} s")
        await asyncio.sleep(2)  # the provision's journal and vault writes settle
        await bench.measureIdle()
        await bench.storm(window, runs, rng)


def main() -> None:
    args = parseArguments()
    if args.pin and shutil.which("taskset") is None:
        raise SystemExit("taskset is not installed (util-linux)")
    if args.pin:
        os.sched_setaffinity(0, {1})  # the client; fleetd on CPU 0
    work = Path(tempfile.mkdtemp(prefix="fleetd-bench-kms-"))
    shm = Path(tempfile.mkdtemp(prefix="fleetd-bench-kms-", dir="/dev/shm"))
    overrides = {k: dict(v) for k, v in STORM_OVERRIDES.items()}
    overrides["listen"] = {"kms": "tcp:0:interface=127.0.0.1:backlog=511",
                           "boot": "tcp:0:interface=127.0.0.1:backlog=511"}  # fmt: skip
    overrides["kms"] = {}
    if args.state_tmpfs:
        overrides["paths"] = {"state": str(shm / "state")}
    fleet = makeFleet(work / "fleet", shm / "vault", overrides)
    daemon = Daemon(fleet, cpus="0" if args.pin else None)
    print(machine())
    pinned = "fleetd on CPU 0, the client on CPU 1" if args.pin else "unpinned"
    print(f"{args.nodes} nodes, {pinned}; load {loadavg()}")
    try:
        daemon.start(waitFor=b"runs.loaded")
        admin = Admin(fleet, daemon.ports["admin"])
        nodes = makeNodes(args.nodes)
        started = time.monotonic()
        enroll(admin, nodes)
        print(f"enrolled (devices, evidence, {len(nodes)} bindings approved) in"
              f" {time.monotonic() - started:.1f} s; load {loadavg()}")  # fmt: skip
        bench = Bench(daemon, nodes, fleet.pki.public_ca)
        asyncio.run(measure(args, bench, admin))
        print(f"fleetd peak RSS {daemon.hwmKiB() / 1024:.0f} MiB")
    finally:
        daemon.stop()
        if args.keep:
            print(f"kept {work} (fleetd's log: {daemon.log})")
        else:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
