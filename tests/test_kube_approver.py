"""
[K2] The CSR approver: exactly the matching node's first kubelet client
CSR; every other CSR left pending and journaled. [K4] the token deleted a
minute after approval. [R1] renewals only for active, non-retired devices.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from fleetd.inventory.model import DeviceStatus
from fleetd.testing.kube import csrPEM
from tests.kubesupport import TwoNodesMixin, device


class ApproverTests(TwoNodesMixin):
    def setUp(self) -> None:
        super().setUp()
        self.id1 = self.bearer1.split(".")[0]

    @property
    def fake(self) -> Any:
        return self.fleet.fake

    def pending(self) -> list[tuple[str, str]]:
        return [
            (e.fields["csr"], e.fields["reason"])
            for e in self.fleet.entries("kube.csr-left-pending")
        ]

    def test_firstCSR_approvedDeviceActive(self) -> None:
        """
        [K2] The node's first kubelet CSR, made with its own token for its
        own name, is approved; the device becomes active in the same commit
        as the journal entry [J1].
        """
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.STAGED)
        csr = self.fleet.fileCSR(self.bearer1, "w1")
        name = csr["metadata"]["name"]
        self.assertTrue(self.fleet.approved(name))
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.ACTIVE)
        (entry,) = self.fleet.entries("kube.csr-approved")
        self.assertEqual(
            (entry.device, entry.fields["csr"], entry.fields["bootstrap_id"]),
            ("w1", name, self.id1),
        )
        self.assertEqual(self.pending(), [])
        self.assertEqual(self.fleet.decisions(), {("approved", "first"): 1})

    def test_tokenDeletedOneMinuteLater(self) -> None:
        """[K4] The token is deleted one minute after approval, not before."""
        self.fleet.fileCSR(self.bearer1, "w1")
        secret = f"bootstrap-token-{self.id1}"
        self.fleet.clock.advance(59)
        self.fake.flush()
        self.assertIn(secret, self.fake.secrets)
        self.fleet.clock.advance(1)
        self.fake.flush()
        self.assertNotIn(secret, self.fake.secrets)
        (deleted,) = self.fleet.entries("kube.token-deleted")
        self.assertEqual(deleted.fields["bootstrap_id"], self.id1)
        self.assertIsNone(self.fake.authenticate(self.bearer1))

    # The refusal matrix: each left pending, journaled with its reason.

    def refused(self, csr: dict[str, Any], reason: str) -> None:
        name = csr["metadata"]["name"]
        self.assertFalse(self.fleet.approved(name))
        self.assertIn((name, reason), self.pending())
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.STAGED)

    def test_wrongRequester_refused(self) -> None:
        """[K2] w2's token asking for w1's name is refused (wrong requester)."""
        self.refused(self.fleet.fileCSR(self.bearer2, "w1"), "wrong-node")

    def test_requesterNotANode_refused(self) -> None:
        """
        [K2] A kubelet-shaped CSR for w1 filed by a requester that is neither
        a bootstrap token nor a node (a service account) is left pending.
        """
        csr = self.fake.fileCSR(self.fake.adminToken, csrPEM("system:node:w1"))
        self.fake.flush()
        self.refused(csr, "requester-not-a-node")

    def test_cnNotANodeName_refused(self) -> None:
        """[K2] Its own token, but a CN that is not system:node:<name>."""
        for cn in ("w1", "system:node:", "system:nodes:w1"):
            csr = self.fake.fileCSR(self.bearer1, csrPEM(cn))
            self.fake.flush()
            self.refused(csr, "wrong-common-name")

    def test_tokenOutsideFleetdsGroup_refused(self) -> None:
        """
        [K2] [K1] fleetd's token whose Secret no longer carries the group
        system:bootstrappers:fleetd (edited in the cluster) is not trusted.
        """
        import base64

        secret = self.fake.secrets[f"bootstrap-token-{self.id1}"]
        secret["data"]["auth-extra-groups"] = base64.b64encode(
            b"system:bootstrappers:other"
        ).decode()
        self.refused(self.fleet.fileCSR(self.bearer1, "w1"), "wrong-groups")

    def test_unknownToken_refused(self) -> None:
        """[K2] A token fleetd did not issue (Talos's shared one) is refused."""
        from tests.kubesupport import bootstrapSecret

        self.fake.postSecret(bootstrapSecret("talos0"))
        csr = self.fleet.fileCSR("talos0.0123456789abcdef", "w1")
        self.refused(csr, "unknown-token")

    def test_wrongCN_refused(self) -> None:
        """[K2] Its own token, but the CN names another node."""
        self.refused(self.fleet.fileCSR(self.bearer1, "w9"), "wrong-node")

    def test_extraSANs_refused(self) -> None:
        """[K2] A DNS or IP SAN in a client CSR is refused."""
        self.refused(
            self.fleet.fileCSR(self.bearer1, "w1", dnsNames=("w1.example",)),
            "has-subject-alternative-names",
        )
        self.refused(
            self.fleet.fileCSR(self.bearer1, "w1", ips=("10.0.0.1",)),
            "has-subject-alternative-names",
        )

    def test_wrongOrganization_refused(self) -> None:
        """[K2] O must be exactly system:nodes."""
        csr = self.fake.fileCSR(
            self.bearer1, csrPEM("system:node:w1", ("system:masters",))
        )
        self.fake.flush()
        self.refused(csr, "wrong-organization")

    def test_wrongUsages_refused(self) -> None:
        """[K2] Usages other than the kubelet client's are refused."""
        csr = self.fake.fileCSR(
            self.bearer1,
            csrPEM("system:node:w1"),
            usages=["digital signature", "server auth"],
        )
        self.fake.flush()
        self.refused(csr, "wrong-usages")

    def test_secondCSRForToken_refused(self) -> None:
        """[K2] Once per token: a second CSR with the same token is refused."""
        self.fleet.fileCSR(self.bearer1, "w1")
        second = self.fleet.fileCSR(self.bearer1, "w1")
        name = second["metadata"]["name"]
        self.assertFalse(self.fleet.approved(name))
        self.assertIn((name, "second-csr-for-token"), self.pending())

    def test_supersededRunsToken_refused(self) -> None:
        """
        [K2] A re-provision revokes the old run's token; while its delete is
        retried (API trouble) a CSR made with it is still refused.
        """
        self.fake.failNext("DELETE", "/secrets/", 503)
        self.fleet.provision(device("w2", "SER2"))
        csr = self.fleet.fileCSR(self.bearer2, "w2")
        name = csr["metadata"]["name"]
        self.assertFalse(self.fleet.approved(name))
        self.assertIn((name, "token-revoked"), self.pending())

    def test_afterExpiry_refused(self) -> None:
        """
        [K2] A CSR after the token's expiration is refused (the fake's
        authenticator would refuse the token; here the CSR arrives as if
        filed just before, and is seen after).
        """
        self.fleet.kube.watcher.stop()
        self.fake.flush()
        csr = self.fake.fileCSR(self.bearer1, csrPEM("system:node:w1"))
        self.fake.reachable = False  # the expiry's deletion is being retried
        self.fleet.clock.advance(86400)
        self.fake.reachable = True
        self.fleet.kube.approver.seen(self.fake.csrs[csr["metadata"]["name"]])
        self.fake.flush()
        self.refused(csr, "token-expired")

    def test_otherSigner_ignored(self) -> None:
        """CSRs for other signers (serving certificates) are not fleetd's."""
        self.fake.fileCSR(
            self.bearer1,
            csrPEM("system:node:w1"),
            signer="kubernetes.io/kubelet-serving",
        )
        self.fake.flush()
        self.assertEqual(self.pending(), [])

    def test_leftPending_journaledOncePerCSR(self) -> None:
        """[K2] A refused CSR seen again and again is journaled once an hour."""
        csr = self.fleet.fileCSR(self.bearer2, "w1")
        obj = self.fake.csrs[csr["metadata"]["name"]]
        for _ in range(5):
            self.fleet.kube.approver.seen(obj)
        self.assertEqual(len(self.pending()), 1)
        # Counted with each entry, not with each sight.
        self.assertEqual(self.fleet.decisions(), {("left-pending", "wrong-node"): 1})
        self.fleet.clock.advance(3600)
        self.fake.flush()
        self.fleet.kube.approver.seen(obj)
        self.assertEqual(len(self.pending()), 2)
        self.assertEqual(self.fleet.decisions(), {("left-pending", "wrong-node"): 2})

    # Faults

    def test_conflict_retried(self) -> None:
        """[K2] A 409 on the approval reads the CSR again and approves it."""
        self.fake.failNext("PUT", "/approval", 409, "Conflict")
        name = self.fleet.fileCSR(self.bearer1, "w1")["metadata"]["name"]
        self.assertTrue(self.fleet.approved(name))
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.ACTIVE)

    def test_apiDown_notApproved_thenApproved(self) -> None:
        """[K2] The approval fails (5xx): nothing recorded; a later sight approves."""
        self.fake.failNext("PUT", "/approval", 503, "ServiceUnavailable")
        name = self.fleet.fileCSR(self.bearer1, "w1")["metadata"]["name"]
        self.assertFalse(self.fleet.approved(name))
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.STAGED)
        self.assertEqual(self.fleet.entries("kube.csr-approved"), [])
        self.fleet.kube.approver.seen(self.fake.csrs[name])
        self.fake.flush()
        self.assertTrue(self.fleet.approved(name))

    def test_commitFails_recordedLate(self) -> None:
        """
        [J1] The API approved but the commit failed: nothing recorded, and
        the next sight of the approved CSR records it ("late").
        """
        faults = self.fleet.faults()
        # Only the record fails: the intent before the API call commits [K2].
        faults.journal.onlyEvents = frozenset({"kube.csr-approved"})
        faults.journal.failing = sqlite3.OperationalError("disk I/O error")
        self.fake.closeWatches()  # keep the MODIFIED event for later
        self.fleet.kube.watcher.stop()
        csr = self.fake.fileCSR(self.bearer1, csrPEM("system:node:w1"))
        name = csr["metadata"]["name"]
        self.fleet.kube.approver.seen(self.fake.csrs[name])
        self.fake.flush()
        self.assertTrue(self.fleet.approved(name))
        faults.clear()
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.STAGED)
        self.assertEqual(self.fleet.decisions(), {})  # approved, not recorded
        self.fleet.kube.approver.seen(self.fake.csrs[name])
        self.fake.flush()
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.ACTIVE)
        (entry,) = self.fleet.entries("kube.csr-approved")
        self.assertTrue(entry.fields["late"])
        self.assertEqual(self.fleet.decisions(), {("approved", "first"): 1})

    def test_certificateIssued_notAfterRecorded(self) -> None:
        """The issued certificate's notAfter is recorded and journaled."""
        name = self.fleet.fileCSR(self.bearer1, "w1")["metadata"]["name"]
        self.fake.sign()
        self.fake.flush()
        record = self.fleet.kubelet("w1")
        self.assertEqual(record.last_csr, name)
        self.assertEqual(record.not_after, 365 * 86400.0)
        self.assertEqual(len(self.fleet.entries("kube.kubelet-certificate-issued")), 1)

    # Renewals [R1]

    def test_renewal_activeApproved(self) -> None:
        """[R1] A renewal from system:node:w1 for active w1 is approved."""
        self.fleet.fileCSR(self.bearer1, "w1")
        renewal = self.fleet.fileCSR(self.fake.nodeCredential("w1"), "w1")
        self.assertTrue(self.fleet.approved(renewal["metadata"]["name"]))
        self.assertEqual(len(self.fleet.entries("kube.csr-renewal-approved")), 1)
        self.assertEqual(
            self.fleet.decisions(),
            {("approved", "first"): 1, ("approved", "renewal"): 1},
        )

    def test_renewal_notActive_refused(self) -> None:
        """[R1] A renewal for a device that is not active is left pending."""
        renewal = self.fleet.fileCSR(self.fake.nodeCredential("w1"), "w1")
        self.assertFalse(self.fleet.approved(renewal["metadata"]["name"]))
        self.assertIn(
            (renewal["metadata"]["name"], "renewal-device-staged"), self.pending()
        )

    def test_renewal_forAnotherNode_refused(self) -> None:
        """[R1] A node renewing under another node's name is refused."""
        self.fleet.fileCSR(self.bearer1, "w1")
        renewal = self.fleet.fileCSR(self.fake.nodeCredential("w2"), "w1")
        self.assertIn(
            (renewal["metadata"]["name"], "renewal-for-another-node"), self.pending()
        )
