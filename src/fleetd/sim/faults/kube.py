"""
Faults of the kube part of the table (docs/design.md, the rack simulator's
faults), on the sim's own fleetd with its Kubernetes fake (C{retire} also
on any fleetd):

  - C{wrong-node-csr}: before its own CSR, the node files one with its
    bootstrap token for ANOTHER node's name. fleetd's approver leaves it
    pending and journals it (C{kube.csr-left-pending}, reason
    C{wrong-node}), counts it on C{/metrics}, and still approves the
    node's own first certificate: the device ends C{active} [K2];
  - C{retire}: once the node is C{active} and has registered its Node
    (as a kubelet does with its client certificate), the owner retires it
    (C{fleetctl retire NAME --yes}); fleetd deletes the Node and the
    device's bootstrap tokens, the device ends C{decommissioning}, and a
    renewal CSR the node then files with its client certificate is left
    pending and journaled (C{renewal-device-retired}) [R1]. Without a
    cluster (a rack against C{--config}), the node is retired once its
    configuration is delivered, and fleetd's journal must hold the
    retirement. With C{--disk-encryption}, the node then reboots: its
    Unseal is refused C{retired} and its key was destroyed with the
    retirement [E3] (L{fleetd.sim.checks.keysRecorded}).

Each check reads fleetd (its journal through the owner API, its metrics
on the admin listener) and the Kubernetes fake (what the cluster holds),
after the clean node's checks (one delivery, its first certificate
approved, its token deleted: L{fleetd.sim.checks.unrecorded}).
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from fleetd.sim.checks import unrecorded
from fleetd.sim.faults.model import Fault
from fleetd.sim.hookos import NAMESPACE
from fleetd.sim.kubelet import fileCSR, registerNode
from fleetd.sim.luks import REFUSED
from fleetd.sim.node import Cluster, Node, Step
from fleetd.testing.kube import FakeKube

DECISIONS = "fleetd_kube_csr_decisions_total"
POLLS = 40  # an asynchronous decision is looked for this many times...
POLL_GAP = 0.25  # ...this many seconds apart

# The CSRs a fault's node filed, by node name: which ones the checks
# look for in fleetd's journal and in the fake (names are not secrets).
_filed: dict[str, str] = {}


def _cluster(node: Node) -> Cluster:
    cluster = node.rack.cluster
    if cluster is None or cluster.fake is None:
        raise RuntimeError(f"{node.fault} needs the sim's own Kubernetes fake")
    return cluster


def _fake(node: Node) -> FakeKube:
    fake = _cluster(node).fake
    assert fake is not None
    return fake


def _before(phase: str, steps: list[Step], extra: Step) -> list[Step]:
    at = next(i for i, s in enumerate(steps) if s.phase == phase)
    return [*steps[:at], extra, *steps[at:]]


def otherNode(node: Node) -> str:
    """A name that is not C{node}'s: its rack neighbour's shape."""
    return f"sim-{node.index + 1:03d}-{node.name.rsplit('-', 1)[1]}"


async def journal(node: Node) -> list[dict[str, Any]]:
    """C{node}'s journal entries, through the owner API."""
    entries: list[dict[str, Any]] = json.loads(
        await node.fleetctl("--json", "journal", "--device", node.name)
    )
    return entries


async def leftPending(node: Node, csr: str) -> list[str]:
    """The reasons fleetd journaled C{csr} left pending with, once any is
    there (waiting for the approver, which decides asynchronously)."""
    for _ in range(POLLS):
        reasons = [
            str(e["fields"].get("reason"))
            for e in await journal(node)
            if e["event"] == "kube.csr-left-pending" and e["fields"].get("csr") == csr
        ]
        if reasons:
            return reasons
        await deferLater(node.rack.clock, POLL_GAP, lambda: None)
    return []


def scrape(node: Node) -> dict[tuple[str, str], float]:
    """C{fleetd_kube_csr_decisions_total} from the admin listener's
    C{/metrics} (blocking), by (decision, reason)."""
    fleetd = node.rack.fleetd
    host, _, port = fleetd.admin.removeprefix("https://").partition(":")
    context = ssl.create_default_context(cafile=str(fleetd.pki.public_ca))
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=30)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        if response.status != 200:
            raise RuntimeError(f"/metrics: HTTP {response.status}")
    finally:
        conn.close()
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == DECISIONS:
                key = (sample.labels["decision"], sample.labels["reason"])
                counts[key] = sample.value
    return counts


async def counted(node: Node, reason: str) -> str | None:
    """Whether /metrics counts a CSR left pending for C{reason}."""
    counts = await deferToThread(scrape, node)
    if counts.get(("left-pending", reason), 0) < 1:
        return f"metrics: no {DECISIONS}{{decision=left-pending,reason={reason}}}"
    return None


def approvedInFake(fake: FakeKube, csr: str) -> bool:
    """Whether the fake holds C{csr} approved (or signed)."""
    status = fake.csrs[csr].get("status") or {}
    types = {c.get("type") for c in status.get("conditions") or []}
    return "Approved" in types or bool(status.get("certificate"))


async def _fileCSR(node: Node, token: str, name: str) -> str:
    """A kubelet client CSR for C{name}, filed with C{token} from the
    node's own address; its name in the Kubernetes fake."""
    cluster = _cluster(node)
    filed: str = await deferToThread(
        fileCSR, port=cluster.port, ca=cluster.ca, token=token, node=name,
        source=node.address,
    )  # fmt: skip
    return filed


# wrong-node-csr [K2]


def wrongNodeCSR(node: Node, steps: list[Step]) -> list[Step]:
    """Before its own CSR, one for another node's name with its token."""

    async def fileWrong() -> None:
        _filed[node.name] = await _fileCSR(node, node.token, otherNode(node))

    return _before("kubelet", steps, Step(None, fileWrong))


async def checkWrongNodeCSR(node: Node) -> str | None:
    csr = _filed.get(node.name)
    if csr is None:
        return "the wrong-node CSR was not filed"
    reasons = await leftPending(node, csr)
    if reasons != ["wrong-node"]:
        return f"journal: CSR for another node left pending as {reasons}"
    if approvedInFake(_fake(node), csr):
        return "kubernetes: the CSR for another node was approved"
    return await counted(node, "wrong-node") or await unrecorded(node)


# retire [R1]


def _hasFake(node: Node) -> bool:
    cluster = node.rack.cluster
    return cluster is not None and cluster.fake is not None


def retire(node: Node, steps: list[Step]) -> list[Step]:
    """Once active: register the Node, be retired, file a renewal (with a
    cluster; without one, only the retirement); then, with an encrypted
    disk, reboot: the next Unseal."""
    credential: list[str] = []

    async def register() -> None:
        cluster = _cluster(node)
        # The bearer standing for its kubelet client certificate.
        credential.append(_fake(node).nodeCredential(node.name))
        await deferToThread(
            registerNode,
            port=cluster.port,
            ca=cluster.ca,
            token=credential[0],
            node=node.name,
            source=node.address,
        )

    async def retired() -> None:
        await node.fleetctl("retire", node.name, "--yes")

    async def renew() -> None:
        _filed[node.name] = await _fileCSR(node, credential[0], node.name)

    after: list[Callable[[], Any]] = [register, retired, renew]
    if not _hasFake(node):
        after = [retired]
    extra = [Step(None, run) for run in after]
    if node.encrypted is not None:
        extra.append(Step("unlock", node.encrypted.unlock))
    return [*steps, *extra]


async def retirementOf(node: Node) -> str | None:
    """Without a cluster: one delivery, then one retirement journaled
    (its Node deleted only where fleetd has a cluster: never refused)."""
    clean = await unrecorded(node)
    if clean is not None:
        return clean
    retirements = [e for e in await journal(node) if e["event"] == "device.retired"]
    if len(retirements) != 1 or retirements[0]["fields"].get("node_deleted") is False:
        return f"journal: retirements {[e['fields'] for e in retirements]}"
    return None


async def checkRetire(node: Node) -> str | None:
    if not _hasFake(node):
        return await retirementOf(node)
    fake = _fake(node)
    clean = await unrecorded(node)  # waits for the token's deletion
    if clean is not None:
        return clean
    entries = await journal(node)
    retirements = [e for e in entries if e["event"] == "device.retired"]
    if (
        len(retirements) != 1
        or retirements[0]["fields"].get("node_deleted") is not True
    ):
        return f"journal: retirements {[e['fields'] for e in retirements]}"
    if node.name in fake.nodes:
        return "kubernetes: the Node is still there"
    issued = [
        str(e["fields"]["bootstrap_id"])
        for e in entries
        if e["event"] == "kube.token-issued"
    ]
    if not issued:
        return "journal: no bootstrap token issued"
    kept = [t for t in issued if f"bootstrap-token-{t}" in fake.secrets]
    if kept:
        return f"kubernetes: bootstrap tokens {kept} still there"
    csr = _filed.get(node.name)
    if csr is None:
        return "the renewal CSR was not filed"
    reasons = await leftPending(node, csr)
    if reasons != ["renewal-device-retired"]:
        return f"journal: renewal after retirement left pending as {reasons}"
    if approvedInFake(fake, csr):
        return "kubernetes: the renewal after retirement was approved"
    return await counted(node, "renewal-device-retired") or objectsRetired(node)


def objectsRetired(node: Node) -> str | None:
    """With [tinkerbell]: the run's Workflow gone, network boot off [R1]."""
    if not node.rack.workflows:
        return None
    fake = _fake(node)
    workflow = f"{NAMESPACE}/{node.name}-{node.run_}"
    if workflow in fake.workflows:
        return f"kubernetes: {workflow} is still there"
    hardware = fake.hardware.get(f"{NAMESPACE}/{node.name}") or {}
    interfaces = (hardware.get("spec") or {}).get("interfaces") or [{}]
    if any((i.get("netboot") or {}).get("allowPXE") is not False for i in interfaces):
        return f"kubernetes: Hardware {NAMESPACE}/{node.name} still allows PXE"
    return None


FAULTS: tuple[Fault, ...] = (
    Fault(
        "wrong-node-csr",
        state="active",
        alter=wrongNodeCSR,
        check=checkWrongNodeCSR,
        ownFleetd=True,
    ),
    Fault(
        "retire",
        state="decommissioning",
        alter=retire,
        check=checkRetire,
        disk=REFUSED,
        diskReason="retired",
    ),
)
