"""
C{fleetd-sim [--config FILE] --nodes N [--faults NAME[:COUNT],...]
[--parallel P] [--time-scale X] [--fetch code|device-flow]
[--inventory sqlite|netbox] [--disk-encryption] [--json]}: a rack of
virtual nodes enrolled end to end (docs/design.md, the rack simulator's
faults), some with a fault (L{fleetd.sim.faults}); the command line is
L{fleetd.sim.args}'s.

Without C{--config} it starts everything itself on a temporary directory:
the grpcio tink-server stand-in, a fleetd whose Tink upstream it is, and
one D-Bus session bus for the nodes' tpm2-abrmds; each node adds its
swtpm and tpm2-abrmd. Whatever it started is stopped on every way out
(the end, a failure, SIGINT or SIGTERM), and the directory removed.

Each node's final C{state} is what fleetd says: the device's inventory
status through the owner API (C{fleetctl status}), with its open alerts;
with C{--disk-encryption}, its disk's end too (L{fleetd.sim.luks}): the
sim's own fleetd then has C{[kms]} and opts the nodes' class in, a fleetd
of C{--config} must have C{[kms]}, and each node encrypts as its
delivered configuration says (a class not opted in: not as expected).
Exit 0 when every node ended as expected, 1 otherwise, 2 when the rack
could not start, 128+N when signal N stopped it (after stopping all it
started). With C{--json}, stdout holds one object and nothing else.
Entered through L{fleetd.sim.main}, which first checks for the C{sim}
extra.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, cast

from twisted.internet.defer import Deferred, DeferredSemaphore, gatherResults
from twisted.internet.interfaces import IReactorThreads
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure

from fleetd.sim import hookos, luks
from fleetd.sim.args import parseArgs
from fleetd.sim.checks import keysRecorded, mirrored, unrecorded
from fleetd.sim.daemon import (
    DaemonFailed,
    Fleetd,
    Started,
    devPKI,
    healthy,
    startFleetd,
)
from fleetd.sim.faults import FAULTS
from fleetd.sim.faults.boot import REBOOTING
from fleetd.sim.kubelet import serveFake
from fleetd.sim.netbox import serveNetBox
from fleetd.sim.node import Cluster, Node, Rack, Refused, StepFailed
from fleetd.sim.report import Outcome, progressLine, summary, table
from fleetd.sim.tpm import RM_AVAILABLE, SessionBus
from fleetd.testing.netbox import FakeNetBox
from fleetd.testing.tinkserver import FakeTinkServer, Workflows
from fleetd.topology import ConfigError

# What fleetd should say of a clean node at the end, with a cluster and
# without one. A clean node is released ("staged") once its configuration
# is delivered, and becomes "active" when its kubelet certificate is
# approved; a rack against a fleetd of --config has no Kubernetes fake, so
# no kubelet phase. A fault says its own (fleetd.sim.faults.model.Fault).
CLEAN = ("active", "staged")


class Console:
    """stderr for people: progress lines (redrawn in place on a terminal)."""

    def __init__(self, err: IO[str]) -> None:
        self.err = err
        self.tty = err.isatty()
        self.last = ""

    def say(self, line: str) -> None:
        self.end()
        self.err.write(line + "\n")
        self.err.flush()

    def progress(self, line: str) -> None:
        if line == self.last:
            return
        self.last = line
        self.err.write(("\r\x1b[K" + line) if self.tty else line + "\n")
        self.err.flush()

    def end(self) -> None:
        if self.tty and self.last:
            self.err.write("\n")
        self.last = ""


async def finalState(node: Node) -> Outcome:
    """What fleetd says of C{node}: status and open alerts."""
    cluster = node.rack.cluster is not None
    fault = None if node.fault is None else FAULTS[node.fault]
    if fault is None:
        expected = CLEAN[0] if cluster else CLEAN[1]
    else:
        expected = fault.expected(cluster)
    try:
        doc: dict[str, Any] = json.loads(
            await node.fleetctl("--json", "status", node.name)
        )
        state, alerts = str(doc["device"]["status"]), list(doc["alerts"])
    except (Refused, StepFailed) as e:
        state, alerts = "unknown", []
        node.error = node.error or f"status: {e}"
    if node.reason is not None:
        state = "refused"
    if fault is not None and node.reason != fault.reason:
        node.error = node.error or (
            f"refusal {node.reason or 'none'}, expected {fault.reason or 'none'}"
        )
    if node.error is None:
        node.error = await (unrecorded(node) if fault is None else fault.check(node))
    if node.error is None and node.reason is None and node.rack.netbox is not None:
        node.error = await mirrored(node, state)
    disk, expectedDisk = None, None
    if node.encrypted is not None:
        disk = node.encrypted.state
        expectedDisk = (luks.UNLOCKED, None) if fault is None else fault.expectedDisk()
        node.error = node.error or disk.error
        if node.error is None and (disk.state, disk.reason) == expectedDisk:
            node.error = await keysRecorded(node, *expectedDisk)
    return Outcome(
        node.name, node.fault, state, node.reason, node.phases, alerts,
        expected, node.error, disk, expectedDisk,
    )  # fmt: skip


@dataclass(frozen=True)
class Result:
    """The rack's outcomes, its seconds, and the seconds to its last
    kubelet certificate (L{None} unless every node got one)."""

    outcomes: list[Outcome]
    seconds: float
    active: float | None


async def runRack(
    clock: Any, args: argparse.Namespace, rack: Rack, console: Console
) -> Result:
    """Every node on its path, C{args.parallel} at a time; their outcomes
    and the rack's seconds."""
    faults: list[str | None] = list(args.faultNames)
    faults += [None] * (args.nodes - len(faults))
    nodes = [
        Node(
            index, rack, fault=name, alter=None if name is None else FAULTS[name].alter
        )
        for index, name in enumerate(faults, start=1)
    ]
    started = clock.seconds()

    def changed() -> None:
        phases = [n.phase for n in nodes]
        console.progress(progressLine(clock.seconds() - started, phases, len(nodes)))

    rack.changed = changed
    changed()
    gate = DeferredSemaphore(args.parallel)

    def one(node: Node) -> Deferred[Outcome]:
        async def path() -> Outcome:
            async with rack.pause.running():  # a spore reboot waits for it
                await node.run()
                return await finalState(node)

        return gate.run(lambda: Deferred.fromCoroutine(path()))

    outcomes: list[Outcome] = await gatherResults([one(n) for n in nodes])
    console.end()
    # When the last node's kubelet certificate was approved (None: not all).
    approved = [n.ended["kubelet"] for n in nodes if "kubelet" in n.ended]
    active = max(approved) - started if len(approved) == len(nodes) else None
    return Result(outcomes, clock.seconds() - started, active)


async def setUp(
    reactor: Any,
    args: argparse.Namespace,
    work: Path,
    started: Started,
    console: Console,
) -> tuple[Fleetd, FakeTinkServer, Cluster | None, FakeNetBox | None]:
    """
    The tink-server stand-in and the fleetd the rack runs against; when
    the sim starts its own fleetd, also the Kubernetes fake it names, and
    with C{--inventory netbox} the NetBox fake.
    """
    if args.config is not None:
        try:
            fleetd = Fleetd.fromConfig(args.config.resolve())
        except ConfigError as e:
            raise DaemonFailed(f"{args.config}: {e}") from None
        if args.disk_encryption and not fleetd.kms:
            raise DaemonFailed(
                f"--disk-encryption: {args.config} has no [kms] table: fleetd"
                " is no KMS there (conf/fleetd.dev.toml has one)"
            )
        if not await deferToThread(healthy, fleetd):
            raise DaemonFailed(
                f"fleetd does not answer on {fleetd.admin}/healthz: start it"
                " with `make run` (or run fleetd-sim without --config)"
            )
        tink = FakeTinkServer(port=fleetd.upstream)
    else:
        tink = FakeTinkServer()

    def stopTink() -> None:
        tink.stop(None).wait(10)

    started.add("tink-server", lambda: None, stopTink)
    console.say(f"tink-server stand-in on 127.0.0.1:{tink.port}")
    if args.config is not None:
        rebooting = sorted(REBOOTING & set(args.faultNames))
        if rebooting and fleetd.minReboot > 0:
            console.say(
                f"{', '.join(rebooting)}: back in HookOS {fleetd.minReboot:g} s"
                " after the workflow (fleetd's tink.min_reboot: sooner is a"
                " reconnect, not a boot)"
            )
        return fleetd, tink, None, None
    pki = await deferToThread(devPKI, work)
    fake, listening = serveFake(reactor, pki)
    started.add("kubernetes-fake", lambda: None, fake.closeWatches)
    tokenFile = work / "kube-token"
    tokenFile.write_text(fake.adminToken + "\n")
    port: int = listening.getHost().port  # type: ignore[attr-defined]
    kubernetes = {
        "api": f"https://127.0.0.1:{port}",
        "ca": str(pki.public_ca),
        "token_file": str(tokenFile),
        # [K4]'s minute before the token's deletion, scaled like Talos's waits
        "delete_after": 60.0 / args.time_scale,
    }
    netbox, table = None, None
    if args.inventory == "netbox":
        # In this process, on its reactor: gone with it.
        netbox, _, table = serveNetBox(reactor, work)
        console.say(f"NetBox fake on {table['url']}")
    hookos.applyTemplate(fake)  # [tinkerbell]: fleetd makes the Workflows
    fleetd = await deferToThread(
        lambda: startFleetd(
            work, tink.port, started, kubernetes, table, hookos.tables(),
            kms=args.disk_encryption,
        )
    )  # fmt: skip
    console.say(f"fleetd on {fleetd.admin} (state in {work})")
    return fleetd, tink, Cluster(port, pki.public_ca, fake), netbox


async def rackOf(
    reactor: Any,
    args: argparse.Namespace,
    work: Path,
    started: Started,
    console: Console,
) -> Result:
    """Set up, then run the rack."""
    fleetd, tink, cluster, netbox = await setUp(reactor, args, work, started, console)
    bus = SessionBus(work / "bus")
    started.add("dbus-daemon", lambda: bus.pid, bus.stop)
    await deferToThread(bus.start)
    fake = None if cluster is None else cluster.fake
    moved = None if fake is None else hookos.stateMover(reactor, fake)
    rack = Rack(
        fleetd=fleetd,
        work=work,
        bus=bus,
        tink=Workflows(tink, onState=moved),
        clock=reactor,
        timeScale=args.time_scale,
        started=started,
        cluster=cluster,
        changed=lambda: None,
        fetch=args.fetch,
        netbox=netbox,
        workflows=fake is not None,
        diskEncryption=args.disk_encryption,
    )
    return await runRack(reactor, args, rack, console)


def simulate(
    args: argparse.Namespace, work: Path, started: Started, console: Console
) -> Result:
    """Run the reactor until the rack is done (or a signal)."""
    from twisted.internet import reactor

    result: list[Result] = []
    failure: list[Failure] = []
    interrupted: list[int] = []

    def stop(_: object = None) -> None:
        if reactor.running:
            reactor.stop()

    def onSignal(signum: int, frame: object) -> None:
        interrupted.append(signum)
        cast(IReactorThreads, reactor).callFromThread(stop)  # wakes it

    def handleSignals() -> None:
        # The reactor's own handlers would stop it too, but say nothing
        # of which signal it was (the exit status names it).
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, onSignal)

    def begin() -> None:
        # Once running: a set-up that fails at once must still stop it.
        d = Deferred.fromCoroutine(rackOf(reactor, args, work, started, console))
        d.addCallbacks(result.append, failure.append)
        d.addBoth(stop)

    reactor.callWhenRunning(handleSignals)
    reactor.callWhenRunning(begin)
    reactor.run()
    if failure:
        failure[0].raiseException()
    if not result:  # stopped by a signal before the rack was done
        console.say("fleetd-sim: interrupted; stopping what it started")
        raise SystemExit(128 + (interrupted or [signal.SIGINT])[0])
    return result[0]


def exitOnSignal(signum: int, frame: object) -> NoReturn:
    """Before the reactor runs (fleetd starting): unwind, stopping it."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parseArgs(argv)
    console = Console(sys.stderr)
    if not RM_AVAILABLE:
        console.say(
            "fleetd-sim: needs swtpm, swtpm_setup, tpm2-abrmd, dbus-daemon and"
            " OpenSSL's tpm2 provider (make demo installs them)"
        )
        return 2
    if args.disk_encryption and not luks.AVAILABLE:
        console.say(
            "fleetd-sim: --disk-encryption needs cryptsetup (Debian"
            " cryptsetup-bin; make demo installs it)"
        )
        return 2
    signal.signal(signal.SIGTERM, exitOnSignal)
    started = Started()
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="fleetd-sim-"))
        stack.callback(shutil.rmtree, work, True)
        stack.callback(lambda: console.say(started.stopAll()))
        try:
            result = simulate(args, work, started, console)
        except DaemonFailed as e:
            console.say(f"fleetd-sim: {e}")
            return 2
    total = summary(result.outcomes, result.seconds, result.active)
    if args.json:
        document = {
            "nodes": [o.asJSON() for o in result.outcomes],
            "summary": total,
        }
        sys.stdout.write(json.dumps(document) + "\n")
    else:
        table(result.outcomes, total, sys.stdout)
    return 0 if all(o.ok for o in result.outcomes) else 1


__all__ = ["Console", "main", "parseArgs", "simulate"]
