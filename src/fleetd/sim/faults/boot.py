"""
Faults of the boot part of the table (docs/design.md, the rack simulator's
faults), each ending as docs/operations.md says ("Boot completion",
"Consumed configurations", "Lost configurations"), checked from fleetd's
journal and from the alerts its rules raise on a scrape of its metrics
(L{fleetd.sim.alerts}):

    pxe-first              after its workflow's SUCCESS the node
                           network-boots HookOS again (twice: a fresh tink
                           agent polling on a new connection) and never its
                           disk: C{planned}, C{boot.hookos-after-install}
                           once [B2], FleetNodeBootedHookOSAfterInstall
    pxe-first-netboot      the same node provisioned by the owner with
                           C{--desired-action netboot}: the return is
                           expected [B3] (no entry, no alert), then it
                           boots its disk: C{active} (C{staged} without
                           a cluster)
    power-loss-after-read  Talos reads its configuration and loses power
                           before writing STATE; the next boot asks with
                           the consumed code (410 consumed, Talos's
                           retries): C{staged}, C{config.refetched} once
                           [C2], FleetInstallConfigRefetched; then the
                           check recovers the node as the operations page
                           says, by a new provision [C3]: the new code is
                           delivered, once
    spore-reboot           (the sim's own fleetd only) after the node's
                           plan action (its code issued, its configuration
                           in the vault) and before its install action,
                           spore reboots: fleetd stopped, its vault (a
                           tmpfs) emptied, fleetd started again on the
                           same state. The node's workflow goes on through
                           the restarted proxy [V3] (one
                           C{boot.rebooting}, no new run); its fetch gets
                           410 lost: C{planned}, C{config.missing} once
                           [V4], FleetInstallConfigMissing

The reboot waits until no other node of the rack is on its way
(L{fleetd.sim.pause}): nodes started before it have ended and been
checked, nodes after it start on the rebooted fleetd. So it hits the
fault node's run, and the unread runs of nodes already ended (a
pxe-first node's), never a node whose outcome is still to come.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import grpc
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from fleetd.sim.alerts import alertsOf
from fleetd.sim.checks import events, unrecorded
from fleetd.sim.daemon import launchFleetd
from fleetd.sim.faults.model import Fault
from fleetd.sim.luks import NONE
from fleetd.sim.node import DISK_PHASES, Node, Step, StepFailed
from fleetd.sim.talos import fetchConfig
from fleetd.testing.tinkagent import getAction

BOOTS = 2  # HookOS boots after the workflow's end (each a fresh agent)...
POLLS = 2  # ...each polling this many times
AGENT_TRIES = 20  # a restarted fleetd's Tink proxy is polled this often...
AGENT_GAP = 0.5  # ...this many seconds apart, until it answers
REBOOT_MARGIN = 0.5  # seconds past fleetd's tink.min_reboot before HookOS polls


def agentChannel(node: Node) -> grpc.Channel:
    """A tink agent's own channel, as after a boot: its own subchannel
    pool, so a new connection (grpcio otherwise shares one per target),
    through the node's relay (from its own address)."""
    return node.tinkChannel(("grpc.use_local_subchannel_pool", 1))


async def provisionNetboot(node: Node) -> None:
    """The owner's C{fleetctl provision NAME --desired-action netboot}."""
    await node.provision("--desired-action", "netboot")


async def bootHookOS(node: Node) -> None:
    """The node network-boots HookOS again after its workflow ended: each
    boot a fresh agent whose polls tink-server answers "not running". The
    first comes no sooner than fleetd counts a return as a boot (its
    C{tink.min_reboot} after the workflow's end, on fleetd's own clock: a
    reconnect comes sooner than a reboot)."""
    minReboot = node.rack.fleetd.minReboot
    if minReboot > 0:
        await deferLater(node.rack.clock, minReboot + REBOOT_MARGIN, lambda: None)
    for boot in range(BOOTS):
        if boot:
            await deferLater(node.rack.clock, 0.5, lambda: None)

        def polls(ch: grpc.Channel) -> list[Any]:
            try:
                return [getAction(ch, node.mac) for _ in range(POLLS)]
            finally:
                ch.close()

        served = await deferToThread(polls, agentChannel(node))
        if any(action is not None for action in served):
            raise StepFailed("hookos: tink-server served an action after the end")


async def fetch(node: Node, code: str) -> tuple[int, bytes]:
    """Talos's fetch with C{code}, retried on its schedule."""
    fleetd = node.rack.fleetd
    return await deferToThread(
        fetchConfig,
        port=fleetd.boot,
        ca=fleetd.pki.public_ca,
        source=node.address,
        query={"code": code, "uuid": node.uuid, "serial": node.serial},
        timeScale=node.rack.timeScale,
    )


async def refused(node: Node, code: str, word: str) -> None:
    """The fetch ends in fleetd's C{410 WORD: ...}, never a configuration."""
    status, body = await fetch(node, code)
    if status != 410 or not body.startswith(word.encode() + b":"):
        raise StepFailed(f"config: HTTP {status} {body[:40]!r}, not 410 {word}")


async def alertFor(node: Node, name: str, firing: bool = True) -> str | None:
    """Whether fleetd's rules raise C{name} for the node on a scrape of
    fleetd now (one line when not as C{firing} says)."""
    found = await alertsOf(node.rack.fleetd)
    fires = any(f.name == name and f.device == node.name for f in found)
    if fires == firing:
        return None
    return f"alerts: {name} {'not ' if firing else ''}firing for {node.name}"


def counted(seen: dict[str, int], expected: dict[str, int]) -> str | None:
    """The first journal event whose count is not as C{expected}."""
    for event, times in expected.items():
        if seen.get(event, 0) != times:
            return f"journal: {seen.get(event, 0)} {event}, not {times}"
    return None


# pxe-first [B2], pxe-first-netboot [B3]


def pxeFirst(node: Node, steps: list[Step]) -> list[Step]:
    """Its workflow, then HookOS again, never the disk."""
    until = [s for s in steps if s.phase not in ("config", "kubelet", *DISK_PHASES)]
    return [*until, Step(None, lambda: bootHookOS(node))]


def pxeFirstNetboot(node: Node, steps: list[Step]) -> list[Step]:
    """Provisioned for a network boot; HookOS again, then its disk."""
    changed = []
    for step in steps:
        if step.phase == "provision":
            step = Step("provision", lambda: provisionNetboot(node))
        changed.append(step)
        if step.phase is None:  # the workflow
            changed.append(Step(None, lambda: bootHookOS(node)))
    return changed


async def returnedOnce(node: Node) -> str | None:
    seen = await events(node)
    wrong = counted(
        seen, {"boot.rebooting": 1, "boot.hookos-after-install": 1, "run.delivered": 0}
    )
    return wrong or await alertFor(node, "FleetNodeBootedHookOSAfterInstall")


async def netbootSilent(node: Node) -> str | None:
    seen = await events(node)
    wrong = counted(seen, {"boot.rebooting": 1, "boot.hookos-after-install": 0})
    if wrong is None:
        wrong = await unrecorded(node)  # then a clean node's delivery
    if wrong is None and not sawNetboot(node):
        wrong = f"fleetd's log: no boot.netboot-expected for {node.name}"
    return wrong or await alertFor(
        node, "FleetNodeBootedHookOSAfterInstall", firing=False
    )


def sawNetboot(node: Node) -> bool:
    """fleetd logged the return it expected [B3] (its log, when the sim
    started fleetd; a fleetd of C{--config} logs where it was told)."""
    log = node.rack.work / "fleetd.log"
    if not log.is_file():
        return True
    return f"boot.netboot-expected {node.name} " in log.read_text(errors="replace")


# power-loss-after-read [C1] [C2] [C3]


def powerLoss(node: Node, steps: list[Step]) -> list[Step]:
    """Its configuration read, then the next boot asks again with the
    consumed code; no STATE, so no kubelet (and nothing sealed)."""
    until = [s for s in steps if s.phase not in ("kubelet", *DISK_PHASES)]
    return [*until, Step(None, lambda: refused(node, node.code, "consumed"))]


async def refetchedThenRecovered(node: Node) -> str | None:
    seen = await events(node)
    wrong = counted(seen, {"config.refetched": 1, "run.delivered": 1})
    wrong = wrong or await alertFor(node, "FleetInstallConfigRefetched")
    if wrong is not None:
        return wrong
    # [C3] the operator's recovery: a new provision, its code to the node
    run: dict[str, Any] = json.loads(
        await node.fleetctl("--json", "provision", node.name)
    )
    status, _ = await fetch(node, str(run["code"]))
    if status != 200:
        return f"recovery: the new code got HTTP {status}"
    await refused(node, str(run["code"]), "consumed")
    return counted(await events(node), {"run.provisioned": 2, "run.delivered": 2})


# spore-reboot [V2] [V3] [V4]


def vaultOf(config: Path) -> Path:
    with config.open("rb") as f:
        tables: dict[str, Any] = tomllib.load(f)
    return config.parent / str(tables["paths"]["vault"])


def rebootSpore(node: Node) -> None:
    """Blocking: fleetd stopped, its vault emptied (a tmpfs after a
    reboot), fleetd started again on the same configuration and state."""
    rack = node.rack
    if rack.started.stopNewest("fleetd") is None:
        raise StepFailed("spore-reboot: no fleetd of the sim's own to reboot")
    vault = vaultOf(rack.fleetd.config)
    for entry in vault.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    launchFleetd(rack.work, rack.fleetd.config, rack.started)


async def pollAgain(node: Node, ch: grpc.Channel) -> Any:
    """A poll through a proxy that may still be starting (UNAVAILABLE)."""
    for _ in range(AGENT_TRIES - 1):
        try:
            return await deferToThread(getAction, ch, node.mac)
        except RuntimeError:
            await deferLater(node.rack.clock, AGENT_GAP, lambda: None)
    return await deferToThread(getAction, ch, node.mac)


async def workflowThroughReboot(node: Node) -> None:
    """The node's workflow with spore rebooting after its plan action: the
    agent (its connection gone) polls again and the workflow goes on."""
    ch = agentChannel(node)
    rebooted = False
    try:
        while True:
            action = await pollAgain(node, ch)
            if action is None:
                return
            await node.timed(action.action_id, node.reported(ch, action))
            if action.action_id == "plan" and not rebooted:
                rebooted = True
                ch.close()
                await node.rack.pause.alone(lambda: deferToThread(rebootSpore, node))
                ch = agentChannel(node)
    finally:
        ch.close()
    if not rebooted:
        raise StepFailed("spore-reboot: the workflow ended before its plan")


def sporeReboot(node: Node, steps: list[Step]) -> list[Step]:
    """Its workflow through a spore reboot; then Talos asks for the
    configuration fleetd no longer holds (410 lost); no kubelet, no
    disk."""
    changed = []
    for step in steps:
        if step.phase is None:
            step = Step(None, lambda: workflowThroughReboot(node))
        elif step.phase == "config":
            step = Step("config", lambda: refused(node, node.code, "lost"))
        elif step.phase in ("kubelet", *DISK_PHASES):
            continue
        changed.append(step)
    return changed


async def missingOnce(node: Node) -> str | None:
    seen = await events(node)
    expected = {
        "run.provisioned": 1,  # fleetd did not provision again by itself [V3]
        "boot.rebooting": 1,  # the workflow went on through the reboot [V3]
        "config.missing": 1,
        "run.delivered": 0,
    }
    wrong = counted(seen, expected)
    return wrong or await alertFor(node, "FleetInstallConfigMissing")


# The faults whose node returns to HookOS after its workflow (bootHookOS).
REBOOTING = frozenset({"pxe-first", "pxe-first-netboot"})

FAULTS: tuple[Fault, ...] = (
    Fault("pxe-first", "planned", pxeFirst, returnedOnce, disk=NONE),
    Fault(
        "pxe-first-netboot",
        "active",
        pxeFirstNetboot,
        netbootSilent,
        stateWithout="staged",
    ),
    Fault(
        "power-loss-after-read",
        "staged",
        powerLoss,
        refetchedThenRecovered,
        disk=NONE,
    ),
    Fault(
        "spore-reboot", "planned", sporeReboot, missingOnce, ownFleetd=True, disk=NONE
    ),
)
