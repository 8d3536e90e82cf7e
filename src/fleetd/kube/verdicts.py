"""
The approver's verdicts on kubelet client CSRs [K2] [K5] [R1], as pure
functions: the parsed CSR (L{fleetd.kube.csr.CSRFacts}, kubelet-shaped
by L{fleetd.kube.csr.shapeRefusal}) and the facts in, a L{Verdict} out.
No I/O, no clock, no state: L{fleetd.kube.approver} gathers the facts,
holds the device against a retirement, and carries the verdict out.

fleetd approves exactly:

  - a node's first kubelet client certificate (L{firstVerdict}):
    requester C{system:bootstrap:<id>} of a live per-node token fleetd
    issued, with the groups C{system:bootstrappers} and
    C{system:bootstrappers:fleetd}, CN C{system:node:<that token's
    device>}, the token's first CSR, before the token's C{expiration}.
    The approval and the device's move to C{active} then commit together
    with their journal entry [J1], and the token's deletion is armed for
    one minute later [K4];
  - a node holding an owner-approved cluster-wide token grant [K5]
    (L{grantVerdict}; L{fleetd.kube.cluster}), once per grant;
  - a renewal from C{system:node:<name>} (CN equal to the requester,
    group C{system:nodes}) for a device that is C{active} and not
    retired (L{renewalVerdict}).

Each function checks its reasons in a fixed order and names the first
that holds, so the journaled reason is the same whatever else is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetd.inventory.model import DeviceStatus
from fleetd.kube.csr import NODE_PREFIX, CSRFacts
from fleetd.kube.tokens import NODE_GROUP

BOOTSTRAPPERS = "system:bootstrappers"
NODES = "system:nodes"


@dataclass(frozen=True)
class Verdict:
    """
    Approve (no C{reason}), or leave the CSR pending for C{reason}.

    @ivar device: the device the CSR is for, when known (the pending
        entry names it; an approved renewal's node).
    """

    reason: str | None = None
    device: str | None = None

    @property
    def approve(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class NodeToken:
    """What a first certificate's verdict needs of a per-node token."""

    device: str
    expiresAt: float | None
    boundTo: str | None  # the one CSR it may still be used for [K2]
    approvedAt: float | None  # its recorded approval
    revoked: bool  # a retirement holds it, or its life no longer approves


@dataclass(frozen=True)
class RenewingDevice:
    """What a renewal's verdict needs of the device it renews."""

    status: DeviceStatus | None  # None: no such device
    retired: bool  # its kubelet certificates are retired [R1]


def firstVerdict(facts: CSRFacts, token: NodeToken | None, now: float) -> Verdict:
    """
    A node's first kubelet client certificate [K2], from a requester
    C{system:bootstrap:<id>}; C{token}: that id's live per-node token, if
    any. It must be in both bootstrappers groups, name its token's device,
    come before the token's expiration, be the token's one CSR, and the
    token must still approve.
    """
    if token is None:
        return Verdict("unknown-token")
    device = token.device
    if BOOTSTRAPPERS not in facts.groups or NODE_GROUP not in facts.groups:
        return Verdict("wrong-groups", device)
    if facts.node != device:
        return Verdict("wrong-node", device)
    if token.expiresAt is not None and now >= token.expiresAt:
        return Verdict("token-expired", device)
    if token.boundTo not in (None, facts.name) or token.approvedAt is not None:
        # Once per token [K2]: bound to another CSR by an approval in
        # flight, its persisted intent, or its recorded approval.
        return Verdict("second-csr-for-token", device)
    if token.revoked:
        return Verdict("token-revoked", device)
    return Verdict(device=device)


def grantVerdict(facts: CSRFacts, request: str | None) -> Verdict:
    """
    A join with the cluster-wide token [K5]; C{request}: the owner-approved,
    unused request letting the CSR's node join with it, if any.
    """
    if request is None:
        return Verdict("no-approved-cluster-token-request")
    return Verdict(device=facts.node)


def renewalVerdict(facts: CSRFacts, device: RenewingDevice | None = None) -> Verdict:
    """
    A renewal from C{system:node:<name>} [R1]. Without C{device} (before
    anything is looked up): only who asks, which must be the node the
    CSR names, in C{system:nodes}; the approving verdict names that node.
    With it: also the device, which must be known, not retired, active.
    """
    node = facts.node
    if facts.username != NODE_PREFIX + (node or "") or NODES not in facts.groups:
        return Verdict("renewal-for-another-node")
    if device is None:
        return Verdict(device=node)
    if device.status is None:
        return Verdict("renewal-unknown-device", node)
    if device.retired:
        return Verdict("renewal-device-retired", node)
    if device.status is not DeviceStatus.ACTIVE:
        return Verdict(f"renewal-device-{device.status.value}", node)
    return Verdict(device=node)
