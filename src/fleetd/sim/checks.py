"""
What fleetd recorded of a node, read from its journal through the owner
API (C{fleetctl journal --device}), never from the sim's own beliefs:
a clean node got exactly one delivery [C2], and with a cluster its first
kubelet certificate approved once [K2] and its bootstrap token deleted
after it [K4] (the deletion is awaited: it comes C{delete_after} later);
with the device flow, the owner's approval and the token issued once each;
with C{--disk-encryption}, its disk keys (L{keysRecorded}).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from twisted.internet.task import deferLater

from fleetd.sim import hookos
from fleetd.sim.luks import NONE, UNLOCKED
from fleetd.sim.node import Node

DELETION_POLLS = 20  # a deletion is looked for this many times...
POLL_GAP = 0.5  # ...this many seconds apart


async def events(node: Node) -> Counter[str]:
    """How many journal entries of each event name C{node} has."""
    shown = await node.fleetctl("--json", "journal", "--device", node.name)
    return Counter(str(entry["event"]) for entry in json.loads(shown))


async def unrecorded(node: Node) -> str | None:
    """What fleetd should have journaled of a clean C{node} and did not
    (one line), or L{None}."""
    seen = await events(node)
    if seen["run.delivered"] != 1:
        return f"journal: {seen['run.delivered']} deliveries, not 1"
    if node.rack.fetch == "device-flow":
        for event in ("deviceflow.approved", "deviceflow.issued"):
            if seen[event] != 1:
                return f"journal: {seen[event]} {event}, not 1"
    if node.rack.cluster is None:
        return None
    problem = await played(node)
    if problem is not None:
        return problem
    if seen["kube.csr-approved"] != 1:
        return f"journal: {seen['kube.csr-approved']} kubelet approvals, not 1"
    for _ in range(DELETION_POLLS):
        if seen["kube.token-deleted"] == 1:
            return None
        await deferLater(node.rack.clock, POLL_GAP, lambda: None)
        seen = await events(node)
    return f"journal: {seen['kube.token-deleted']} token deletions, not 1"


STATE_POLLS = 20  # the Workflow's end reaches fleetd's watch: looked for
STATE_GAP = 0.25  # this many times, this many seconds apart


async def played(node: Node) -> str | None:
    """
    With C{[tinkerbell]}: the workflow HookOS ran is the Workflow fleetd
    made for the node's run (journaled), and fleetd shows its end (read by
    its Workflow watch) beside the run, as long as that run is current.
    """
    if not node.rack.workflows or node.run_ is None:
        return None
    name = f"{hookos.NAMESPACE}/{node.name}-{node.run_}"
    if node.served != name:
        return f"hookos ran {node.served or 'nothing'}, not fleetd's Workflow {name}"
    shown = await node.fleetctl("--json", "journal", "--device", node.name)
    made = [
        e
        for e in json.loads(shown)
        if e["event"] == "tinkerbell.workflow-created" and e["run"] == node.run_
    ]
    if len(made) != 1:
        return f"journal: {len(made)} tinkerbell.workflow-created for {name}"
    state = None
    for _ in range(STATE_POLLS):
        doc = json.loads(await node.fleetctl("--json", "status", node.name))
        workflow = (doc.get("tinkerbell") or {}).get("workflow") or {}
        if workflow.get("run") != node.run_:
            return None  # provisioned again since (a fault's recovery)
        state = workflow.get("state")
        if state == "SUCCESS":
            return None
        await deferLater(node.rack.clock, STATE_GAP, lambda: None)
    return f"status: Workflow {name} is {state}, not SUCCESS"


MIRROR_POLLS = 40  # fleetd's NetBox outbox pushes asynchronously: looked
MIRROR_GAP = 0.25  # for this many times, this many seconds apart


async def mirrored(node: Node, status: str) -> str | None:
    """
    With NetBox as the inventory (C{--inventory netbox}): what NetBox
    lacks of C{node} (one line), or L{None}. Its status must become the
    one fleetd reports (pushed through fleetd's outbox, so awaited) and,
    once the configuration was delivered, carry the release
    (C{fleetd_release} with its run).
    """
    fake = node.rack.netbox
    assert fake is not None
    device: dict[str, Any] = {}
    for _ in range(MIRROR_POLLS):
        device = fake.byName(node.name)
        if device["status"] == status:
            break
        await deferLater(node.rack.clock, MIRROR_GAP, lambda: None)
    else:
        return f"netbox: status {device['status']}, fleetd says {status}"
    release = device["custom_fields"].get("fleetd_release")
    if (await events(node))["run.delivered"] and not (
        isinstance(release, dict) and release.get("run")
    ):
        return "netbox: no fleetd_release for the delivered configuration"
    return None


KEY_POLLS = 20  # a refusal's kms.refused entry is appended after the answer:
KEY_GAP = 0.25  # looked for this many times, this many seconds apart


async def keysRecorded(node: Node, state: str, reason: str | None) -> str | None:
    """
    With C{--disk-encryption}: what fleetd should have journaled of the
    node's disk keys and did not (one line), or L{None}. A node whose
    disk was sealed got one key (its one install; STATE and EPHEMERAL
    share it) [E2]; unlocked, no refusal naming it and no key destroyed;
    refused, the refusal with its reason, from the node's address for its
    uuid (the entry names no device: whoever asks may not be the node),
    and for C{retired} its key destroyed with the retirement [E3]; never
    sealed, no key.
    """
    seen = await events(node)
    created = seen["kms.key-created"]
    if state == NONE:
        return None if created == 0 else f"journal: {created} kms.key-created, not 0"
    if created != 1:
        return f"journal: {created} kms.key-created, not 1"
    if state == UNLOCKED:
        for event in ("kms.refused", "kms.key-destroyed"):
            if seen[event]:
                return f"journal: {seen[event]} {event} for a node that unlocked"
        return None
    for _ in range(KEY_POLLS):
        problem = await refusalsOf(node, str(reason))
        if problem is None:
            break
        await deferLater(node.rack.clock, KEY_GAP, lambda: None)
    if problem is not None or reason != "retired":
        return problem
    entries = json.loads(
        await node.fleetctl("--json", "journal", "--device", node.name)
    )
    why = [e["fields"].get("why") for e in entries if e["event"] == "kms.key-destroyed"]
    return None if why == ["retired"] else f"journal: kms.key-destroyed {why}"


async def refusalsOf(node: Node, expected: str) -> str | None:
    """Whether fleetd journaled the refusals of the node's calls (the
    whole journal's, for its uuid from its address) all for C{expected}."""
    entries = json.loads(await node.fleetctl("--json", "journal"))
    reasons = {
        str(e["fields"].get("reason"))
        for e in entries
        if e["event"] == "kms.refused"
        and e["fields"].get("node_uuid") == node.uuid
        and e["fields"].get("peer") == node.address
    }
    if reasons == {expected}:
        return None
    return f"journal: kms.refused {sorted(reasons)}, not [{expected!r}]"
