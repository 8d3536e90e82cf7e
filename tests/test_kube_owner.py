"""
The owner's side: cluster-wide tokens [K5][K6], retirement [R1], the
auto-approve check [K3], and what status says of credentials [K7].
"""

from __future__ import annotations

import sqlite3
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.fleet.status import DeviceReport
from fleetd.inventory.model import DeviceStatus
from fleetd.k8s.client import KubeUnavailable
from fleetd.kube.cluster import ClusterTokenError
from fleetd.kube.rbac import NODECLIENT_ROLE, RBACCheck
from fleetd.testing.kube import FakeKube
from tests.kubesupport import KubeFleet, device, secretData


def run(test: SynchronousTestCase, fleet: KubeFleet, coroutine: Any) -> Any:
    d = Deferred.fromCoroutine(coroutine)
    fleet.fake.flush()
    return test.successResultOf(d)


class ClusterTokenTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.tokens = self.fleet.kube.cluster

    def request(self, node: str = "cp1") -> Any:
        return run(
            self, self.fleet, self.tokens.request(node, "new control plane", "owner:o")
        )

    def test_request_journaledPending(self) -> None:
        """[K5] A request is journaled and pending; nothing is created yet."""
        request = self.request()
        self.assertEqual(request.state, "pending")
        (entry,) = self.fleet.entries("cluster-token.requested")
        self.assertEqual(entry.fields["node"], "cp1")
        self.assertEqual(self.fleet.fake.secrets, {})
        pending = run(self, self.fleet, self.tokens.pending())
        self.assertEqual([r.id for r in pending], [request.id])

    def test_approve_createsTokenOnce_neverJournaled(self) -> None:
        """
        [K5] The owner's approval creates the cluster token (Talos's group,
        no expiration, as cluster.token is); the answer carries it; the
        journal only its id. A second approval of the same request is refused.
        """
        request = self.request()
        decided, token = run(
            self, self.fleet, self.tokens.approve(request.id, "owner:o")
        )
        self.assertEqual(decided.state, "approved")
        data = secretData(self.fleet.fake, token.id)
        self.assertEqual(data["auth-extra-groups"], "system:bootstrappers:nodes")
        self.assertNotIn("expiration", data)
        for entry in self.successResultOf(self.fleet.journal.query()):
            self.assertNotIn(token.secret, repr(entry.toJSON()))
        d = Deferred.fromCoroutine(self.tokens.approve(request.id, "owner:o"))
        self.assertEqual(
            self.failureResultOf(d, ClusterTokenError).value.kind, "conflict"
        )

    def test_approvedGrant_approvesThatNodesCSROnce(self) -> None:
        """[K5] An approved request lets its node's first CSR through, once."""
        request = self.request()
        _, token = run(self, self.fleet, self.tokens.approve(request.id, "owner:o"))
        first = self.fleet.fileCSR(token.bearer, "cp1")
        self.assertTrue(self.fleet.approved(first["metadata"]["name"]))
        again = self.fleet.fileCSR(token.bearer, "cp1")
        other = self.fleet.fileCSR(token.bearer, "cp2")
        self.assertFalse(self.fleet.approved(again["metadata"]["name"]))
        self.assertFalse(self.fleet.approved(other["metadata"]["name"]))
        reasons = {
            e.fields["reason"] for e in self.fleet.entries("kube.csr-left-pending")
        }
        self.assertEqual(reasons, {"no-approved-cluster-token-request"})

    def test_rotate_newSecret_oldDeletedAfterOverlap(self) -> None:
        """[K6] Rotation replaces the token; the old one goes after the overlap."""
        request = self.request()
        _, old = run(self, self.fleet, self.tokens.approve(request.id, "owner:o"))
        new, oldId, deadline = run(self, self.fleet, self.tokens.rotate("owner:o"))
        self.assertEqual((oldId, deadline), (old.id, 3600.0))
        self.assertIn(f"bootstrap-token-{new.id}", self.fleet.fake.secrets)
        self.fleet.clock.advance(3599)
        self.assertIn(f"bootstrap-token-{old.id}", self.fleet.fake.secrets)
        self.fleet.clock.advance(1)
        self.fleet.fake.flush()
        self.assertNotIn(f"bootstrap-token-{old.id}", self.fleet.fake.secrets)
        (entry,) = self.fleet.entries("cluster-token.rotated")
        self.assertEqual(entry.fields["old_bootstrap_id"], old.id)
        self.assertEqual(self.tokens.clusterTokenId(), new.id)

    def test_rotate_survivesRestart(self) -> None:
        """[K6] The old token's deletion deadline is persisted across a restart."""
        request = self.request()
        _, old = run(self, self.fleet, self.tokens.approve(request.id, "owner:o"))
        new, _, _ = run(self, self.fleet, self.tokens.rotate("owner:o"))
        self.fleet.restart()
        self.tokens = self.fleet.kube.cluster
        self.assertEqual(self.tokens.clusterTokenId(), new.id)
        self.fleet.clock.advance(3600)
        self.fleet.fake.flush()
        self.assertNotIn(f"bootstrap-token-{old.id}", self.fleet.fake.secrets)
        _, again = run(
            self, self.fleet, self.tokens.approve(self.request().id, "owner:o")
        )
        self.assertEqual(again, new)  # unsealed from the database

    def test_rotate_apiDown_nothingChanged(self) -> None:
        """[K6] The new Secret cannot be created: nothing is recorded."""
        self.fleet.fake.reachable = False
        d = Deferred.fromCoroutine(self.tokens.rotate("owner:o"))
        self.failureResultOf(d, KubeUnavailable)
        self.assertEqual(self.fleet.entries("cluster-token.rotated"), [])
        self.assertIsNone(self.tokens.clusterTokenId())

    def test_approve_commitFails_secretDeleted(self) -> None:
        """[J1] The approval's commit fails: the new Secret is deleted again."""
        request = self.request()
        faults = self.fleet.faults()
        faults.runner.failing = sqlite3.OperationalError("disk I/O error")
        d = Deferred.fromCoroutine(self.tokens.approve(request.id, "owner:o"))
        self.fleet.fake.flush()
        self.failureResultOf(d, sqlite3.OperationalError)
        faults.clear()
        self.assertEqual(self.fleet.fake.secrets, {})
        self.assertIsNone(self.tokens.clusterTokenId())


class RetireTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"))
        (self.first,) = self.fleet.provision(device("w1", "SER1"))
        self.bearer = self.fleet.bearer(self.first.run)
        self.fleet.fetch(self.first.code)
        self.fleet.fileCSR(self.bearer, "w1")
        self.fleet.fake.sign()
        self.fleet.fake.addNode("w1")
        self.fleet.fake.flush()

    def retire(self) -> Any:
        return run(self, self.fleet, self.fleet.retirer.retire("w1", "owner:o"))

    def test_retire_nodeTokensStatusJournal(self) -> None:
        """
        [R1] Retirement deletes the Node and the live token, marks the device
        decommissioning, and journals the kubelet certificate (with its
        notAfter) and machine.token as unrevocable.
        """
        result = self.retire()
        self.fleet.fake.flush()
        self.assertTrue(result.node_deleted)
        self.assertNotIn("w1", self.fleet.fake.nodes)
        tokenId = self.bearer.split(".")[0]
        self.assertEqual(result.tokens, [tokenId])
        self.assertNotIn(f"bootstrap-token-{tokenId}", self.fleet.fake.secrets)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        unrevocable = self.fleet.entries("kube.unrevocable")
        self.assertEqual(
            [e.fields["credential"] for e in unrevocable],
            ["kubelet client certificate", "machine.token"],
        )
        self.assertEqual(unrevocable[0].fields["not_after"], 365 * 86400.0)
        self.assertEqual(result.not_after, 365 * 86400.0)

    def test_retired_renewalRefused(self) -> None:
        """[R1] After retirement, a renewal CSR from the node is left pending."""
        self.retire()
        renewal = self.fleet.fileCSR(self.fleet.fake.nodeCredential("w1"), "w1")
        name = renewal["metadata"]["name"]
        self.assertFalse(self.fleet.approved(name))
        reasons = [
            e.fields["reason"]
            for e in self.fleet.entries("kube.csr-left-pending")
            if e.fields["csr"] == name
        ]
        self.assertEqual(reasons, ["renewal-device-retired"])

    def test_apiDown_nothingChanged(self) -> None:
        """[R1][J1] The Node cannot be deleted: the retirement changes nothing."""
        self.fleet.fake.reachable = False
        d = Deferred.fromCoroutine(self.fleet.retirer.retire("w1", "owner:o"))
        self.failureResultOf(d, KubeUnavailable)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.ACTIVE)
        self.assertEqual(self.fleet.entries("device.retired"), [])

    def test_journalFails_nothingChanged(self) -> None:
        """[R1][J1] The journal refuses: status and tokens stay as they were."""
        from fleetd.store.db import StoreError

        faults = self.fleet.faults()
        faults.journal.failing = StoreError("journal head is not authentic")
        d = Deferred.fromCoroutine(self.fleet.retirer.retire("w1", "owner:o"))
        self.fleet.fake.flush()
        self.failureResultOf(d, StoreError)
        faults.clear()
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.ACTIVE)
        tokenId = self.bearer.split(".")[0]
        record = self.fleet.token(tokenId)
        assert record is not None
        self.assertEqual(record.delete_at, 60.0)  # still the approval's deadline


class RBACTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.fake = FakeKube(self.clock)
        self.client = self.fake.client()
        self.registry = CollectorRegistry()
        self.check = RBACCheck(self.clock, self.client, self.registry, 600)

    def gauge(self, name: str) -> float | None:
        return self.registry.get_sample_value(name)

    def test_talosBinding_found(self) -> None:
        """[K3] Talos's auto-approve binding is found: metric 1 and a warning."""
        self.fake.addBinding(
            "system-bootstrap-approve-node-client-csr",
            NODECLIENT_ROLE,
            ["system:bootstrappers:nodes"],
        )
        self.fake.addBinding(
            "system-bootstrap-node-renewal",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            ["system:nodes"],
        )
        self.check.start()
        self.fake.flush()
        self.addCleanup(self.check.stop)
        self.assertEqual(self.check.found, ["system-bootstrap-approve-node-client-csr"])
        self.assertEqual(self.gauge("fleetd_kube_autoapprove_bindings"), 1.0)
        self.assertEqual(self.gauge("fleetd_kube_rbac_check_success"), 1.0)

    def test_customRole_found(self) -> None:
        """[K3] Any ClusterRole granting create on nodeclient counts too."""
        self.fake.addRole(
            "mine",
            [
                {
                    "apiGroups": ["certificates.k8s.io"],
                    "resources": ["certificatesigningrequests/nodeclient"],
                    "verbs": ["create"],
                }
            ],
        )
        self.fake.addBinding("b", "mine", ["system:bootstrappers"])
        found = run(self, self, self.check.check())  # type: ignore[arg-type]
        self.assertEqual(found, ["b"])

    def test_clean_thenPeriodic(self) -> None:
        """[K3] A clean cluster gives 0; the check repeats every interval."""
        self.check.start()
        self.fake.flush()
        self.assertEqual(self.gauge("fleetd_kube_autoapprove_bindings"), 0.0)
        self.fake.addBinding("late", NODECLIENT_ROLE, ["system:bootstrappers:x"])
        self.clock.advance(600)
        self.fake.flush()
        self.assertEqual(self.gauge("fleetd_kube_autoapprove_bindings"), 1.0)
        self.check.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_apiDown_successZero(self) -> None:
        """[K3] RBAC cannot be read: the success gauge says so, nothing crashes."""
        self.fake.reachable = False
        self.check.start()
        self.addCleanup(self.check.stop)
        self.assertEqual(self.gauge("fleetd_kube_rbac_check_success"), 0.0)
        self.assertIsNone(self.check.found)


class StatusTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"))
        (self.first,) = self.fleet.provision(device("w1", "SER1"))
        self.bearer = self.fleet.bearer(self.first.run)

    def report(self) -> DeviceReport:
        result = run(self, self.fleet, self.fleet.statusService().report("w1"))
        assert result is not None
        return result  # type: ignore[no-any-return]

    def test_showsTokenAndKubelet(self) -> None:
        """[K7] Status shows the token id, expiry, deletion deadline and approval."""
        self.fleet.fetch(self.first.code)
        self.fleet.fileCSR(self.bearer, "w1")
        doc = self.report().toJSON()["kubernetes"]
        self.assertEqual(doc["token"]["token_id"], self.bearer.split(".")[0])
        self.assertEqual(doc["token"]["expires_at"], 86400.0)
        self.assertEqual(doc["token"]["delete_at"], 60.0)
        self.assertEqual(doc["kubelet"]["first_approved_at"], 0.0)
        self.assertIn("new provision", doc["note"])
        self.assertNotIn(self.bearer.split(".")[1], repr(self.report().toJSON()))

    def test_expiredToken_saysProvision(self) -> None:
        """[K7] A token expired before approval: a new provision is the recovery."""
        self.fleet.fetch(self.first.code)
        self.fleet.clock.advance(86400)
        self.fleet.fake.flush()
        report = self.report()
        self.assertIn("the node cannot join with this configuration", report.state)
        self.assertIn("expired", report.state)
        self.assertEqual(
            report.recovery, "fleetctl provision w1 (the new run carries a new token)"
        )

    def test_expiredKubeletCertificate_saysProvision(self) -> None:
        """[K7] An expired kubelet certificate: a new provision is the recovery."""
        self.fleet.fetch(self.first.code)
        self.fleet.fileCSR(self.bearer, "w1")
        self.fleet.fake.sign()
        self.fleet.fake.flush()
        self.fleet.clock.advance(366 * 86400)
        self.fleet.fake.flush()
        report = self.report()
        self.assertIn("kubelet client certificate expired", report.state)
        self.assertIn("fleetctl provision w1", report.recovery or "")
