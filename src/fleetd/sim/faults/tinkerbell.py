"""
The Tinkerbell part of the table (docs/design.md, the rack simulator's
faults), on the sim's own fleetd (its Kubernetes fake holds the Workflows
fleetd makes, issue 28):

  - C{workflow-deleted}: the owner provisions the node, fleetd makes its
    Workflow, and someone else deletes it before HookOS runs it (as a
    C{clusterctl move} or a careless C{kubectl delete} does). tink-server
    then has nothing to serve the node: its agent polls and is answered
    NOT_FOUND, so nothing is installed and the device stays C{planned}.
    fleetd reports it (C{tinkerbell.workflow-lost} once,
    C{fleetd_tinkerbell_workflows_missing}, FleetTinkerbellWorkflowLost,
    C{fleetctl status}) and never makes the Workflow again [V3].

The check reads fleetd (its journal, its status, its alerts) and the
fake (no Workflow came back), never the sim's own beliefs.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from fleetd.sim.faults.boot import agentChannel, alertFor
from fleetd.sim.faults.kube import journal
from fleetd.sim.faults.model import Fault
from fleetd.sim.hookos import NAMESPACE, fleetdsWorkflow
from fleetd.sim.luks import NONE
from fleetd.sim.node import DISK_PHASES, Node, Step, StepFailed
from fleetd.testing.kube import FakeKube
from fleetd.testing.tinkagent import getAction

POLLS = 3  # the agent's polls answered NOT_FOUND
LOOKS = 40  # fleetd's report is looked for this many times...
LOOK_GAP = 0.25  # ...this many seconds apart (the watch tells it)
STAYS = 2.0  # seconds the Workflow is watched not to come back


def _fake(node: Node) -> FakeKube:
    cluster = node.rack.cluster
    if cluster is None or cluster.fake is None or not node.rack.workflows:
        raise StepFailed("workflow-deleted needs the sim's own fleetd")
    return cluster.fake


def deleted(node: Node, steps: list[Step]) -> list[Step]:
    """Provisioned, its Workflow deleted by someone else, HookOS polls in
    vain; no configuration is fetched."""

    async def provision() -> None:
        fake = _fake(node)
        shown = await node.fleetctl("--json", "provision", node.name)
        node.run_ = str(json.loads(shown)["run"])
        workflow = await fleetdsWorkflow(node.rack.clock, fake, node.name, node.run_)
        fake.deleteWorkflow(NAMESPACE, workflow["metadata"]["name"])  # someone else

    async def hookos() -> None:
        def polls() -> list[str]:
            ch = agentChannel(node)
            answers = []
            try:
                for _ in range(POLLS):
                    try:
                        getAction(ch, node.mac)
                        answers.append("served")
                    except RuntimeError as e:
                        answers.append(str(e))
            finally:
                ch.close()
            return answers

        answers = await deferToThread(polls)
        if not all("NOT_FOUND" in answer for answer in answers):
            raise StepFailed(f"hookos: tink-server answered {answers}")

    gone = ("provision", None, "config", "kubelet", *DISK_PHASES)
    kept = [s for s in steps if s.phase not in gone]
    return [*kept, Step("provision", provision), Step(None, hookos)]


async def entries(node: Node, event: str) -> list[dict[str, Any]]:
    return [e for e in await journal(node) if e["event"] == event]


async def checkDeleted(node: Node) -> str | None:
    fake = _fake(node)
    lost: list[dict[str, Any]] = []
    for _ in range(LOOKS):
        lost = [
            e for e in await journal(node) if e["event"] == "tinkerbell.workflow-lost"
        ]
        if lost:
            break
        await deferLater(node.rack.clock, LOOK_GAP, lambda: None)
    if [(e["run"], e["fields"].get("how")) for e in lost] != [(node.run_, "deleted")]:
        return f"journal: tinkerbell.workflow-lost {[e['fields'] for e in lost]}"
    await deferLater(node.rack.clock, STAYS, lambda: None)
    key = f"{NAMESPACE}/{node.name}-{node.run_}"
    if key in fake.workflows:
        return f"kubernetes: {key} was made again"
    made = [
        e for e in await journal(node) if e["event"] == "tinkerbell.workflow-created"
    ]
    if len(made) != 1:
        return f"journal: {len(made)} tinkerbell.workflow-created, not 1"
    status = json.loads(await node.fleetctl("--json", "status", node.name))
    if "deleted by someone else" not in status["state"]:
        return f"status: {status['state']!r}"
    return await alertFor(node, "FleetTinkerbellWorkflowLost")


FAULTS: tuple[Fault, ...] = (
    Fault(
        "workflow-deleted",
        state="planned",
        alter=deleted,
        check=checkDeleted,
        ownFleetd=True,
        disk=NONE,
    ),
)
