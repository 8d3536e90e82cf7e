"""
HookOS playing the Workflow fleetd made (issue 28 item 7): with
C{[tinkerbell]} the sim's own fleetd writes each run's Workflow into the
Kubernetes fake; the tink-server stand-in then serves the node that
Workflow, read from the fake as tink-controller reads it (its
C{templateRef}'s Template, rendered with its C{hardwareMap}), never a
workflow the sim made up.

The Template is the enrollment Template itself
(C{conf/tinkerbell/fleetd-install.yaml}), applied to the fake as an
operator applies it. Its actions map onto the node's phases by name; the
image the node writes is the C{talos_image} fleetd put in the Workflow,
which must be the class's. As the agent reports, the stand-in moves the
Workflow's C{status.state} (RUNNING, then POST and SUCCESS) as
tink-server and tink-controller do, so fleetd's Workflow watch sees it.
Without C{[tinkerbell]} (a rack against C{--config}, or a provision
fleetd refused) the stand-in serves a workflow of the sim's own, as an
operator's hand-made one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from twisted.internet.interfaces import IReactorThreads, IReactorTime
from twisted.internet.task import deferLater

from fleetd.testing.kube import ApiError, FakeKube
from fleetd.testing.tinkserver import Workflows

TEMPLATE = Path(__file__).resolve().parents[3] / "conf/tinkerbell/fleetd-install.yaml"
NAMESPACE = "tink-system"
CLASS = "worker"  # the sim's nodes' class, the one [tinkerbell] names
IMAGE = "https://images.sim.invalid/talos/v1.9.0/metal-amd64.raw.zst"
# The Template's actions, by name, as the node's phases (None: no phase of
# its own: the code went to META with the plan, the reboot is the end).
PHASE_OF = {
    "fleetd-agent attest": "attest",
    "fleetd-agent disks": "disks",
    "fleetd-agent plan": "plan",
    "image2disk": "install",
    "fleetd-agent META 0x0b": "meta",
    "reboot": "reboot",
}
ACTIONS = ("attest", "disks", "plan", "install")  # a hand-made workflow's
LOOKS = 40  # the Workflow is looked for this many times...
LOOK_GAP = 0.25  # ...this many seconds apart (fleetd makes it as it answers)
_FIELD = re.compile(r"\{\{\s*\.([A-Za-z0-9_]+)\s*\}\}")


class WorkflowError(RuntimeError):
    """fleetd's Workflow cannot be played (one line)."""


def tables() -> dict[str, dict[str, Any]]:
    """The C{[tinkerbell]} tables of the sim's own fleetd."""
    return {
        "tinkerbell": {"namespace": NAMESPACE},
        f"tinkerbell.classes.{CLASS}": {
            "template": "fleetd-talos-install",
            "image": IMAGE,
            "toggle_allow_netboot": True,
        },
    }


def applyTemplate(fake: FakeKube) -> None:
    """C{kubectl apply -f conf/tinkerbell/fleetd-install.yaml}."""
    template = yaml.safe_load(TEMPLATE.read_text())
    name = template["metadata"]["name"]
    template["metadata"]["namespace"] = NAMESPACE
    fake.templates[f"{NAMESPACE}/{name}"] = template


def render(data: str, values: dict[str, str]) -> str:
    """C{{{.key}}} actions filled from C{values}; a missing key is an
    error (tink-controller renders with missingkey=error)."""

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise WorkflowError(f"template: no hardwareMap value for {key}")
        return values[key]

    return _FIELD.sub(value, data)


@dataclass(frozen=True)
class Played:
    """What the stand-in serves a node: the Workflow's id and its phases."""

    workflow: str  # namespace/name, as tink-agent's workflow id
    phases: tuple[str, ...]


def playOf(fake: FakeKube, workflow: dict[str, Any], mac: str) -> Played:
    """The Workflow fleetd made, as tink-controller renders it for C{mac}."""
    meta, spec = workflow["metadata"], workflow["spec"]
    template = fake.templates.get(f"{meta['namespace']}/{spec['templateRef']}")
    if template is None:
        raise WorkflowError(f"no Template {spec['templateRef']} in the cluster")
    values = dict(spec.get("hardwareMap") or {})
    rendered = yaml.safe_load(render(template["spec"]["data"], values))
    (task,) = rendered["tasks"]
    if str(task["worker"]).lower() != mac.lower():
        raise WorkflowError(f"the Workflow's worker is {task['worker']}, not {mac}")
    phases = []
    for action in task["actions"]:
        phase = PHASE_OF.get(action["name"])
        if phase is None:
            raise WorkflowError(f"unknown workflow action {action['name']!r}")
        if phase == "install" and action["environment"]["IMG_URL"] != IMAGE:
            raise WorkflowError(f"image2disk writes {action['environment']['IMG_URL']}")
        phases.append(phase)
    return Played(f"{meta['namespace']}/{meta['name']}", tuple(phases))


async def fleetdsWorkflow(
    clock: IReactorTime, fake: FakeKube, device: str, run: str
) -> dict[str, Any]:
    """The Workflow fleetd made for C{device}'s run C{run}, once it is there."""
    key = f"{NAMESPACE}/{device}-{run}"
    for _ in range(LOOKS):
        found = fake.workflows.get(key)
        if found is not None:
            labels = found["metadata"].get("labels") or {}
            if labels.get("fleetd.io/run") != run:
                raise WorkflowError(f"{key} does not carry fleetd's run label")
            return found
        await deferLater(clock, LOOK_GAP, lambda: None)
    raise WorkflowError(f"fleetd made no Workflow {key}")


def stateMover(reactor: IReactorThreads, fake: FakeKube) -> Callable[[str, str], None]:
    """The stand-in's (grpcio thread's) C{onState}: the Workflow's status
    moved in the fake on the reactor, as tink-server does; a Workflow
    deleted meanwhile (by someone else) is left deleted."""

    def move(workflow: str, state: str) -> None:
        namespace, _, name = workflow.partition("/")
        if not name or f"{namespace}/{name}" not in fake.workflows:
            return
        try:
            fake.setWorkflowState(namespace, name, state)
        except ApiError:
            pass

    return lambda workflow, state: reactor.callFromThread(move, workflow, state)


async def serveWorkflow(
    clock: IReactorTime,
    tink: Workflows,
    fake: FakeKube | None,
    device: str,
    mac: str,
    run: str | None,
) -> str:
    """
    Give the stand-in the node's workflow: with C{fake} (fleetd makes
    Workflows there), the one fleetd made for C{run}; else a hand-made
    one. Its id, as the agent will be served it.
    """
    if fake is None or run is None:
        tink.add(mac, f"sim/{device}", ACTIONS)
        return f"sim/{device}"
    played = playOf(fake, await fleetdsWorkflow(clock, fake, device, run), mac)
    tink.add(mac, played.workflow, played.phases)
    return played.workflow
