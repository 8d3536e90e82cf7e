"""
fleetd's own CPU per delivery, without the TLS handshake that dominates
(and blurs) the boot storm.

The boot storm (L{bench.boot_storm}) measures fleetd beside nginx and a
minimal twisted.web server, each over TLS; on this 2-core machine the
handshake alone is 1,000-1,400 us and varies by 20 % between runs, so
fleetd's own few hundred microseconds drown in it. Here the very same
objects serve plain HTTP instead: this script runs fleetd's real service
in-process (database thread, SQLite synchronous=FULL on disk, vault on
tmpfs, journal, releaser, the boot resource and its C{BoundedSite}) and
adds a plain-TCP listener in front of the boot site, wrapped in the same
connection-limit wrapper the TLS listener has. The same wrk workload as
the boot storm (every node its own code once, plus 404s, 403s and 410s;
a new connection per request, C{Connection: close}) is then sent to it
and to a minimal twisted.web C{Site} serving a 2 KiB C{static.Data}, in
alternating rounds. Server CPU (all threads) divided by requests, minus
the minimal server's, is fleetd's own work per connection on top of the
twisted.web floor; what TLS adds on top of that is the same for both.

    .venv/bin/python bench/delivery_cost.py [--nodes 2000] [--rounds 5]
        [--profile FILE] [--tls]

fleetd and the minimal server are pinned to CPU 0, wrk to CPU 1.
C{--profile FILE} writes a cProfile of fleetd's reactor thread during
the last round (slows it; for shares, not for figures; its count of
Python calls is the same from run to run within about 0.2 %), and
C{FILE.db}, one of the database thread timed by that thread's CPU.
C{--tls} sends the workload to fleetd's own TLS boot listener instead
(the real one: limit wrapper, TLS, site) and to the minimal server over
TLS with the same kind of certificate: every connection a full TLS 1.3
handshake, as in the boot storm, for the TLS layer's share.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# --serve-fleetd runs the fleetd of FLEETD_TREE when set (--baseline): its
# bench helpers from the tree, its fleetd from src/ (or the tree itself,
# for a checkout from before the src layout).
sys.path.insert(
    0, os.environ.get("FLEETD_TREE") or str(Path(__file__).resolve().parent.parent)
)
sys.path.insert(0, os.path.join(sys.path[0], "src"))  # absent in an older tree

from bench._fleet import (
    STORM_OVERRIDES,
    Admin,
    makeFleet,
    makeNodes,
)
from bench.boot_storm import (
    BACKLOG,
    BODY_BYTES,
    Run,
    buildWorkload,
    runWrk,
    waitIdle,
)


def serveFleetd(config: Path, log: Path, profile: Path | None) -> None:
    """
    fleetd's service in this process, plus a plain-TCP listener in front of
    the boot site; print the plain port (the TLS boot listener's with
    C{DELIVERY_TLS}) and the admin port once loaded.
    """
    from twisted.internet import reactor
    from twisted.internet.task import LoopingCall

    from fleetd.config import loadSettings
    from fleetd.listen.connections import LimitedFactory
    from fleetd.service import FleetdService, prepare

    r: Any = reactor
    settings = loadSettings(config)
    out = open(log, "a")
    import gc
    import inspect

    # As tap.py builds it for twistd; DELIVERY_GC=untuned leaves the
    # collector alone, and so does code from before fleetd.heap.
    options: dict[str, Any] = {}
    if os.environ.get("DELIVERY_GC") != "untuned" and (
        "collector" in inspect.signature(FleetdService).parameters
    ):
        options["collector"] = gc
    if profile is not None:
        _profileDatabaseThread(Path(f"{profile}.db"))
    service = FleetdService(prepare(settings), r, logOutput=out, **options)
    service.privilegedStartService()
    service.startService()
    boot = service.listeners["boot"].factory
    site = boot.wrappedFactory.wrappedFactory  # limit wrapper > TLS > site
    plain = LimitedFactory(
        site,
        name="boot-plain",
        clock=r,
        maxConnections=boot.maxConnections,
        maxPerSource=boot.maxPerSource,
        idleTimeout=boot.idleTimeout,
    )
    port = r.listenTCP(0, plain, backlog=BACKLOG, interface="127.0.0.1")
    admin: Any = service.listeners["admin"].port
    if os.environ.get("DELIVERY_TLS"):
        port = service.listeners["boot"].port

    def loaded() -> None:
        if service.runs.loaded:
            ready.stop()
            print(port.getHost().port, admin.getHost().port, flush=True)

    ready = LoopingCall(loaded)
    ready.start(0.05)
    if profile is not None:
        _profileOnSignal(profile)
    if os.environ.get("DELIVERY_GC"):
        _gcTimes()
    r.addSystemEventTrigger("before", "shutdown", service.stopService)
    r.run(installSignalHandlers=True)


def _gcTimes() -> None:
    """On SIGUSR2 (DELIVERY_GC set): the garbage collector's CPU since the last."""
    import gc

    spent = [[0.0, 0], [0.0, 0], [0.0, 0]]
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            generation = spent[info["generation"]]
            generation[0] += time.thread_time() - started[0]
            generation[1] += 1

    gc.callbacks.append(callback)

    def report(*_: object) -> None:
        shown = ", ".join(
            f"gen{i} {n} in {t * 1e3:.0f} ms" for i, (t, n) in enumerate(spent)
        )
        print(f"  gc since the last report: {shown}", file=sys.stderr, flush=True)
        spent[:] = [[0.0, 0], [0.0, 0], [0.0, 0]]

    signal.signal(signal.SIGUSR2, report)


_DATABASE_PROFILE: dict[str, Any] = {"on": False, "runner": None}


def _profileDatabaseThread(path: Path) -> None:
    """
    Between the reactor thread's SIGUSR1 and SIGUSR2 (L{_profileOnSignal}),
    profile the database thread's batches too, timed by that thread's CPU
    (waits for the disk or the GIL excluded), and write it to C{path}.
    """
    import cProfile

    from fleetd.store.runner import DatabaseRunner

    profiler = cProfile.Profile(time.thread_time)

    def loop(runner: Any) -> None:
        _DATABASE_PROFILE["runner"] = runner
        enabled = False
        while (work := runner._work.get()) is not None:
            if _DATABASE_PROFILE["on"] and not enabled:
                profiler.enable()
                enabled = True
            elif enabled and not _DATABASE_PROFILE["on"]:
                profiler.disable()
                enabled = False
                profiler.dump_stats(str(path))
            work()

    DatabaseRunner._loop = loop  # type: ignore[method-assign,assignment]


def _profileOnSignal(path: Path) -> None:
    """SIGUSR1 starts a cProfile of the reactor thread, SIGUSR2 writes it."""
    import cProfile

    profiler = cProfile.Profile()

    def start(*_: object) -> None:
        _DATABASE_PROFILE["on"] = True
        profiler.enable()

    signal.signal(signal.SIGUSR1, start)

    def dump(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(str(path))
        _DATABASE_PROFILE["on"] = False
        runner = _DATABASE_PROFILE["runner"]
        if runner is not None:  # one more turn of its loop writes its profile
            runner._work.put(lambda: None)

    signal.signal(signal.SIGUSR2, dump)


def serveMinimal() -> None:
    """
    twisted.web over plain TCP (over TLS with C{DELIVERY_TLS}, a dev
    certificate as fleetd's), a 2 KiB body at C{/config}, no access log.
    """
    from twisted.internet import reactor
    from twisted.web import resource, server, static

    root = resource.Resource()
    root.putChild(b"config", static.Data(b"x" * BODY_BYTES, "text/plain"))
    site = server.Site(root)
    site.log = lambda request: None  # type: ignore[method-assign]
    r: Any = reactor
    if os.environ.get("DELIVERY_TLS"):
        from OpenSSL import crypto
        from twisted.internet import ssl

        from fleetd.pki.dev import ensureDevPKI

        pki = ensureDevPKI(Path(os.environ["DELIVERY_TLS"]), "enroll.lolwtf.ca")
        options = ssl.CertificateOptions(
            privateKey=crypto.load_privatekey(
                crypto.FILETYPE_PEM, pki.public_key.read_bytes()
            ),
            certificate=crypto.load_certificate(
                crypto.FILETYPE_PEM, pki.public_cert.read_bytes()
            ),
            raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
        )
        port = r.listenSSL(0, site, options, backlog=BACKLOG, interface="127.0.0.1")
    else:
        port = r.listenTCP(0, site, backlog=BACKLOG, interface="127.0.0.1")
    print(port.getHost().port, flush=True)
    r.run()


def spawn(
    *args: str, tree: Path | None = None
) -> tuple[subprocess.Popen[str], list[int]]:
    env = dict(os.environ)
    if tree is not None:
        env["FLEETD_TREE"] = str(tree)
        env["PYTHONPATH"] = os.pathsep.join(
            str(p) for p in (tree / "src", tree) if p.is_dir()
        )
    process = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise SystemExit(f"server {args[0]} did not start")
    return process, [int(p) for p in line.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--profile", type=Path)
    parser.add_argument(
        "--tls",
        action="store_true",
        help="through fleetd's TLS boot listener (and the minimal server over TLS)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of other fleetd code, run beside this one round by round",
    )
    parser.add_argument("--serve-fleetd", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--serve-minimal", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fleetd is not None:
        config, log = args.serve_fleetd
        profile = os.environ.get("DELIVERY_PROFILE")
        serveFleetd(config, log, Path(profile) if profile else None)
        return
    if args.serve_minimal:
        serveMinimal()
        return

    os.sched_setaffinity(0, {1})
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fleetd-delivery-cost-"))
    shm = Path(tempfile.mkdtemp(prefix="fleetd-delivery-cost-", dir="/dev/shm"))
    overrides = {k: dict(v) for k, v in STORM_OVERRIDES.items()}
    if args.profile is not None:
        os.environ["DELIVERY_PROFILE"] = str(args.profile)
    scheme = "http"
    if args.tls:
        os.environ["DELIVERY_TLS"] = str(work / "minimal-pki")
        scheme = "https"
    servers: dict[str, tuple[Any, subprocess.Popen[str], int]] = {}
    trees = {"fleetd": None}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    minimal, (minimalPort,) = spawn("--serve-minimal")
    runs: dict[str, list[Run]] = {name: [] for name in [*trees, "minimal"]}
    try:
        for name, tree in trees.items():
            fleet = makeFleet(work / name, shm / name, overrides)
            log = work / f"{name}.log"
            process, (plain, adminPort) = spawn(
                "--serve-fleetd", str(fleet.config), str(log), tree=tree
            )
            servers[name] = (Admin(fleet, adminPort), process, plain)
        nodes = makeNodes(args.nodes)
        for admin, _, _ in servers.values():
            admin.importDevices(nodes)
        for i in range(args.rounds):
            figures = []
            for name, (admin, process, plain) in servers.items():
                fresh = admin.provision([n.name for n in nodes])
                waitIdle(process.pid)
                requests = buildWorkload(
                    nodes, fresh, rng, 0.10, 0.02, 0.05, args.concurrency
                )
                expect = {run: device for device, (run, _) in fresh.items()}
                profiling = (
                    args.profile is not None and i == args.rounds - 1
                    and name == "fleetd"
                )  # fmt: skip
                if profiling:
                    process.send_signal(signal.SIGUSR1)
                switches = contextSwitches(process.pid)
                run = runWrk(
                    name, work, plain, requests, expect, args.concurrency,
                    process.pid, "1", scheme=scheme,
                )  # fmt: skip
                switches = contextSwitches(process.pid) - switches
                print(
                    f"  {name}: {switches / len(requests):.1f} context switches"
                    " per connection (all threads)",
                    flush=True,
                )
                run.trailingCPU = waitIdle(process.pid)
                if os.environ.get("DELIVERY_GC"):
                    process.send_signal(signal.SIGUSR2)
                if profiling:
                    process.send_signal(signal.SIGUSR2)
                _check(run, args.nodes)
                runs[name].append(run)
                figures.append(run)
            peer = runWrk(
                "minimal", work, minimalPort, requests, None, args.concurrency,
                minimal.pid, "1", scheme=scheme,
            )  # fmt: skip
            runs["minimal"].append(peer)
            for name, run in zip(servers, figures, strict=True):
                print(_line(i, name, run, peer, len(requests), args.nodes), flush=True)
    finally:
        for _, process, _ in servers.values():
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        minimal.send_signal(signal.SIGTERM)
        minimal.wait(60)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    for name in servers:
        print(_summary(name, runs[name], runs["minimal"], args.nodes))


def contextSwitches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of C{pid}."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                total += int(line.split()[1])
    return total


def _check(run: Run, nodes: int) -> None:
    bad = run.figures["wrong"] + run.figures["dup"]
    statuses = [int(run.figures[k]) for k in ("s200", "s403", "s404", "s410")]
    if bad or statuses != [nodes, *_expected(nodes)]:
        raise SystemExit(f"{run.server} answered wrongly: {run.figures}")


def _expected(nodes: int) -> list[int]:
    return [round(nodes * 0.02), round(nodes * 0.10), round(nodes * 0.05)]


def _perConnection(run: Run, requests: int, extra: float = 0.0) -> float:
    return (run.serverCPU + extra) / requests * 1e6


def _line(i: int, name: str, run: Run, peer: Run, requests: int, nodes: int) -> str:
    mine = _perConnection(run, requests)
    withTail = _perConnection(run, requests, run.trailingCPU)
    floor = _perConnection(peer, requests)
    main = run.mainCPU / requests * 1e6
    return (
        f"round {i + 1}: {name} {mine:.0f} us/conn (main {main:.0f}, with the"
        f" trailing records {withTail:.0f}), minimal {floor:.0f} us/conn;"
        f" own work {withTail - floor:.0f} us/conn ="
        f" {(withTail - floor) * requests / nodes:.0f} us/delivery"
    )


def _summary(name: str, mine: list[Run], minimal: list[Run], nodes: int) -> str:
    requests = round(nodes * 1.17)
    own = [
        (_perConnection(f, requests, f.trailingCPU) - _perConnection(m, requests))
        * requests
        / nodes
        for f, m in zip(mine, minimal, strict=True)
    ]
    return (
        f"{name}: own work per delivery over {len(own)} rounds: median"
        f" {statistics.median(own):.0f} us, range {min(own):.0f}-{max(own):.0f} us"
    )


if __name__ == "__main__":
    main()
