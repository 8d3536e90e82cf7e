"""
[K2] [K5] [R1] The approver's pure verdicts, directly: what the approver
tests cannot reach through the fake (a renewal for a device the inventory
does not know) and the order in which the reasons are named.
"""

from __future__ import annotations

from dataclasses import replace

from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import DeviceStatus
from fleetd.kube.csr import CSRFacts
from fleetd.kube.verdicts import (
    NodeToken,
    RenewingDevice,
    Verdict,
    firstVerdict,
    grantVerdict,
    renewalVerdict,
)

FIRST = CSRFacts(
    name="csr-1",
    uid="u-1",
    signer="kubernetes.io/kube-apiserver-client-kubelet",
    username="system:bootstrap:abc123",
    groups=("system:bootstrappers", "system:bootstrappers:fleetd"),
    usages=frozenset({"digital signature", "client auth"}),
    expirationSeconds=None,
    commonNames=("system:node:w1",),
    organizations=("system:nodes",),
    hasSANs=False,
    rsaKey=False,
    approved=False,
    denied=False,
    reason="",
    certificate=None,
)
RENEWAL = replace(FIRST, username="system:node:w1", groups=("system:nodes",))
TOKEN = NodeToken(
    device="w1", expiresAt=100.0, boundTo=None, approvedAt=None, revoked=False
)
ACTIVE = RenewingDevice(status=DeviceStatus.ACTIVE, retired=False)


class FirstVerdictTests(SynchronousTestCase):
    def test_firstVerdict_matching(self) -> None:
        """[K2] The token's first CSR, for its device, in time: approved."""
        self.assertEqual(firstVerdict(FIRST, TOKEN, 99.0), Verdict(device="w1"))

    def test_firstVerdict_boundToThisCSR(self) -> None:
        """[K2] A token bound to this very CSR (its intent) still approves it."""
        token = replace(TOKEN, boundTo="csr-1")
        self.assertTrue(firstVerdict(FIRST, token, 99.0).approve)

    def test_firstVerdict_order(self) -> None:
        """
        [K2] With everything wrong, the first reason in the documented
        order is named: groups, node, expiry, second CSR, revoked.
        """
        facts = replace(FIRST, groups=(), commonNames=("system:node:w2",))
        token = replace(TOKEN, boundTo="csr-0", revoked=True)
        reasons = []
        for fix in (
            lambda f, t: (replace(f, groups=FIRST.groups), t),
            lambda f, t: (replace(f, commonNames=FIRST.commonNames), t),
            lambda f, t: (f, replace(t, expiresAt=None)),
            lambda f, t: (f, replace(t, boundTo=None)),
            lambda f, t: (f, replace(t, revoked=False)),
        ):
            reasons.append(firstVerdict(facts, token, 200.0).reason)
            facts, token = fix(facts, token)
        self.assertEqual(
            reasons,
            [
                "wrong-groups",
                "wrong-node",
                "token-expired",
                "second-csr-for-token",
                "token-revoked",
            ],
        )
        self.assertEqual(firstVerdict(facts, token, 200.0), Verdict(device="w1"))

    def test_firstVerdict_noToken(self) -> None:
        """[K2] No live per-node token: unknown-token, naming no device."""
        self.assertEqual(firstVerdict(FIRST, None, 0.0), Verdict("unknown-token"))


class GrantVerdictTests(SynchronousTestCase):
    def test_grantVerdict(self) -> None:
        """[K5] Approved with an owner-approved request, left pending without."""
        self.assertTrue(grantVerdict(FIRST, "req-1").approve)
        self.assertEqual(
            grantVerdict(FIRST, None), Verdict("no-approved-cluster-token-request")
        )


class RenewalVerdictTests(SynchronousTestCase):
    def test_renewalVerdict_requesterOnly(self) -> None:
        """[R1] Before any look-up, only who asks: its own node, in system:nodes."""
        self.assertEqual(renewalVerdict(RENEWAL), Verdict(device="w1"))
        other = replace(RENEWAL, username="system:node:w2")
        self.assertEqual(renewalVerdict(other), Verdict("renewal-for-another-node"))
        self.assertEqual(
            renewalVerdict(replace(RENEWAL, groups=()), ACTIVE),
            Verdict("renewal-for-another-node"),
        )

    def test_renewalVerdict_unknownDevice(self) -> None:
        """[R1] A renewal for a device the inventory does not know is left."""
        self.assertEqual(
            renewalVerdict(RENEWAL, RenewingDevice(status=None, retired=True)),
            Verdict("renewal-unknown-device", "w1"),
        )

    def test_renewalVerdict_retiredBeforeStatus(self) -> None:
        """[R1] Retired is named before a status other than active."""
        device = RenewingDevice(status=DeviceStatus.DECOMMISSIONING, retired=True)
        self.assertEqual(
            renewalVerdict(RENEWAL, device).reason, "renewal-device-retired"
        )
        self.assertEqual(
            renewalVerdict(RENEWAL, replace(device, retired=False)).reason,
            "renewal-device-decommissioning",
        )
        self.assertEqual(renewalVerdict(RENEWAL, ACTIVE), Verdict(device="w1"))
