"""
Issue 17 review, Kubernetes credentials: an approval whose answer is lost
(the API applied it, then the call timed out or its connection was cut)
is recorded once, late, and a cluster-token grant approves one CSR
[K5] [J1] [R1]; a CSR that met a busy database, NetBox or API is looked
at again after a backoff, without waiting for an event [K2].
"""

from __future__ import annotations

import sqlite3
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import DeviceStatus, InventoryError
from fleetd.k8s.client import CSRS
from fleetd.testing.kube import csrPEM
from tests.kubesupport import KubeFleet, TwoNodesMixin, device


def _pending(fleet: KubeFleet) -> list[tuple[str, str]]:
    return [
        (e.fields["csr"], e.fields["reason"])
        for e in fleet.entries("kube.csr-left-pending")
    ]


def _grant(test: SynchronousTestCase, fleet: KubeFleet) -> tuple[Any, Any]:
    """The owner approves cp1's request to join with the cluster token [K5]."""
    tokens = fleet.kube.cluster
    d = Deferred.fromCoroutine(tokens.request("cp1", "x", "owner:o"))
    fleet.fake.flush()
    request = test.successResultOf(d)
    d2 = Deferred.fromCoroutine(tokens.approve(request.id, "owner:o"))
    fleet.fake.flush()
    _, token = test.successResultOf(d2)
    return request, token


class LostGrantAnswerTests(SynchronousTestCase):
    """[K5] [J1] One grant, one CSR: also when the approval's answer is lost."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.request, self.token = _grant(self, self.fleet)

    def lose(self, cut: bool) -> str:
        """The API applies the approval; its answer never reaches fleetd."""
        fleet = self.fleet
        fleet.fake.loseAnswerNext("PUT", "/approval", cut=cut)
        name: str = fleet.fileCSR(self.token.bearer, "cp1")["metadata"]["name"]
        self.assertTrue(fleet.approved(name))
        if not cut:
            self.assertEqual(fleet.entries("kube.csr-approved-cluster-token"), [])
            fleet.clock.advance(fleet.client.timeout)  # the call's deadline
            fleet.fake.flush()
        return name

    def assertUsedOnceBy(self, name: str, late: bool) -> None:
        fleet = self.fleet
        (entry,) = fleet.entries("kube.csr-approved-cluster-token")
        self.assertEqual(
            dict(entry.fields),
            {"csr": name, "node": "cp1", "request": self.request.id, "late": late},
        )
        second = fleet.fileCSR(self.token.bearer, "cp1")["metadata"]["name"]
        self.assertFalse(fleet.approved(second))
        self.assertIn((second, "no-approved-cluster-token-request"), _pending(fleet))
        decisions = fleet.decisions()
        self.assertEqual(decisions.get(("approved", "cluster-token")), 1)
        self.assertNotIn(("approved", "first"), decisions)
        used = self.successResultOf(
            fleet.runner.run(
                lambda db: db.execute(
                    "SELECT state, csr FROM cluster_token_requests WHERE id = ?",
                    (self.request.id,),
                ).fetchone()
            )
        )
        self.assertEqual(tuple(used), ("used", name))

    def test_answerTimedOut_recordedLateSecondCSRLeftPending(self) -> None:
        """
        [K5] [J1] The API applied the grant's approval but the call timed
        out: the approved CSR's next sight (its MODIFIED event) records the
        grant used (late), and a second CSR on the grant is left pending.
        """
        name = self.lose(cut=False)
        self.assertUsedOnceBy(name, late=True)
        self.flushLoggedErrors()

    def test_connectionCut_recordedLateSecondCSRLeftPending(self) -> None:
        """[K5] [J1] The same when the connection is cut instead of answering."""
        name = self.lose(cut=True)
        self.assertUsedOnceBy(name, late=True)
        self.flushLoggedErrors()

    def test_neverApplied_sameCSRRetriedOthersLeftPending(self) -> None:
        """
        [K5] A call that timed out without being applied keeps the grant
        for that CSR: another CSR is left pending meanwhile, and the same
        CSR is approved when it is looked at again (after 1 s).
        """
        fleet = self.fleet
        fleet.fake.hangNext("PUT", "/approval")
        name = fleet.fileCSR(self.token.bearer, "cp1")["metadata"]["name"]
        fleet.clock.advance(fleet.client.timeout)
        fleet.fake.flush()
        self.assertFalse(fleet.approved(name))
        other = fleet.fileCSR(self.token.bearer, "cp1")["metadata"]["name"]
        self.assertIn((other, "no-approved-cluster-token-request"), _pending(fleet))
        fleet.clock.advance(1)
        fleet.fake.flush()
        self.assertTrue(fleet.approved(name))
        self.assertFalse(fleet.approved(other))
        self.assertUsedOnceBy(name, late=False)
        self.flushLoggedErrors()

    def test_refused_grantFree(self) -> None:
        """
        [K5] A definite refusal (403) did not approve: the grant is free
        again and the next CSR gets it.
        """
        fleet = self.fleet
        fleet.fake.failNext("PUT", "/approval", 403, "Forbidden")
        name = fleet.fileCSR(self.token.bearer, "cp1")["metadata"]["name"]
        self.assertFalse(fleet.approved(name))
        self.assertEqual(
            fleet.kube.cluster.grantFor("cp1", self.token.id), self.request.id
        )
        second = fleet.fileCSR(self.token.bearer, "cp1")["metadata"]["name"]
        self.assertTrue(fleet.approved(second))
        (entry,) = fleet.entries("kube.csr-approved-cluster-token")
        self.assertEqual(entry.fields["csr"], second)

    def test_humanApproved_neverRecordedAsGrant(self) -> None:
        """
        [K5] [J1] A CSR whose approval timed out unapplied and that a human
        then approved is never recorded as the grant's use: only
        C{FleetdApproved} approvals are.
        """
        fleet = self.fleet
        fleet.fake.hangNext("PUT", "/approval")
        name = fleet.fileCSR(self.token.bearer, "cp1")["metadata"]["name"]
        fleet.clock.advance(fleet.client.timeout)
        body = dict(fleet.fake.csrs[name])
        body["status"] = {
            "conditions": [
                {"type": "Approved", "status": "True", "reason": "KubectlApprove"}
            ]
        }
        fleet.fake.putApproval(name, body)
        fleet.fake.flush()
        fleet.clock.advance(60)
        fleet.fake.flush()
        self.assertEqual(fleet.entries("kube.csr-approved-cluster-token"), [])
        self.flushLoggedErrors()


class LostRenewalAnswerTests(SynchronousTestCase):
    """[R1] [J1] A renewal approved with a lost answer is journaled."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"))
        (run,) = self.fleet.provision(device("w1", "SER1"))
        bearer = self.fleet.bearer(run.run)
        self.fleet.fetch(run.code)
        self.fleet.fileCSR(bearer, "w1")

    def test_answerTimedOut_recordedLateOnce(self) -> None:
        """
        [R1] [J1] The API applied a renewal's approval but the call timed
        out: its next sight records it (kube.csr-renewal-approved, late),
        once.
        """
        fleet = self.fleet
        fleet.fake.loseAnswerNext("PUT", "/approval")
        renewal = fleet.fileCSR(fleet.fake.nodeCredential("w1"), "w1")
        name = renewal["metadata"]["name"]
        self.assertTrue(fleet.approved(name))
        self.assertEqual(fleet.entries("kube.csr-renewal-approved"), [])
        fleet.clock.advance(fleet.client.timeout)
        fleet.fake.flush()
        (entry,) = fleet.entries("kube.csr-renewal-approved")
        self.assertEqual((entry.fields["csr"], entry.fields["late"]), (name, True))
        self.assertEqual(fleet.kubelet("w1").last_csr, name)
        fleet.fake.sign()  # one more sight
        fleet.fake.flush()
        self.assertEqual(len(fleet.entries("kube.csr-renewal-approved")), 1)
        self.flushLoggedErrors()

    def test_answerLostThenRetired_afterRetirement(self) -> None:
        """
        [R1] [J1] A renewal applied by the API with its answer lost, seen
        again only after the device was retired: recorded late as
        kube.csr-approved-after-retirement (its certificate's notAfter
        following), never as a renewal; retired_at kept.
        """
        fleet = self.fleet
        fleet.kube.watcher.stop()  # its next sight is a re-list, later
        fleet.fake.flush()
        fleet.fake.loseAnswerNext("PUT", "/approval")
        renewal = fleet.fake.fileCSR(
            fleet.fake.nodeCredential("w1"), csrPEM("system:node:w1")
        )
        name = renewal["metadata"]["name"]
        approver = fleet.kube.approver
        approver.seen(fleet.fake.csrs[name])
        fleet.fake.flush()
        self.assertTrue(fleet.approved(name))
        fleet.clock.advance(fleet.client.timeout)
        fleet.fake.flush()
        fleet.fake.sign()
        retiring = Deferred.fromCoroutine(fleet.retirer.retire("w1", "owner:o"))
        fleet.fake.flush()
        self.successResultOf(retiring)
        approver.seen(fleet.fake.csrs[name])  # the re-list
        fleet.fake.flush()
        (entry,) = fleet.entries("kube.csr-approved-after-retirement")
        self.assertEqual(
            (entry.device, entry.fields["csr"], entry.fields["kind"]),
            ("w1", name, "renewal"),
        )
        self.assertTrue(entry.fields["late"])
        # Recorded with the facts of its decision (no certificate yet): the
        # notAfter is in the following kube.kubelet-certificate-issued.
        self.assertIsNone(entry.fields["not_after"])
        (issued,) = fleet.entries("kube.kubelet-certificate-issued")[-1:]
        self.assertEqual(
            (issued.fields["csr"], issued.fields["not_after"]),
            (name, fleet.clock.seconds() + 365 * 86400.0),
        )
        self.assertEqual(fleet.entries("kube.csr-renewal-approved"), [])
        self.assertEqual(
            fleet.decisions(),
            {("approved", "first"): 1, ("approved", "renewal-after-retirement"): 1},
        )
        self.assertIsNotNone(fleet.kubelet("w1").retired_at)
        self.assertEqual(fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        self.flushLoggedErrors()


class _InventoryDownOnce:
    """The inventory, whose next C{get} fails as NetBox down does, once C{down}."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, name: str) -> Any:
        if self.down:
            self.down = False
            raise InventoryError("NetBox unreachable", "unavailable")
        return await self.inner.get(name)


class BusyRetryTests(TwoNodesMixin):
    """[K2] A CSR that met a busy store is looked at again, backed off."""

    approverInventory = _InventoryDownOnce

    def setUp(self) -> None:
        super().setUp()
        self.fleet.fetch(self.run2.code)

    def looks(self, name: str) -> int:
        """How often fleetd read the CSR by name (each look again)."""
        return self.fleet.fake.calls.count(("GET", f"{CSRS}/{name}"))

    def test_databaseDownOnce_approvedWithoutEvent(self) -> None:
        """
        [K2] [J1] The intent could not be journaled (database down); once
        the database answers, the CSR is approved 1 s later without any
        new event.
        """
        fleet = self.fleet
        faults = fleet.faults()
        faults.inject("database")
        name = fleet.fileCSR(self.bearer1, "w1")["metadata"]["name"]
        self.assertFalse(fleet.approved(name))
        faults.clear()
        fleet.clock.advance(0.5)
        fleet.fake.flush()
        self.assertFalse(fleet.approved(name))
        fleet.clock.advance(0.5)
        fleet.fake.flush()
        self.assertTrue(fleet.approved(name))
        (entry,) = fleet.entries("kube.csr-approved")
        self.assertEqual(entry.fields["csr"], name)
        self.assertEqual(fleet.status("w1"), DeviceStatus.ACTIVE)
        self.flushLoggedErrors(sqlite3.OperationalError)

    def test_backoffDoublesToCap(self) -> None:
        """
        [K2] While the database stays down the CSR is looked at again
        after 1, 2, 4, 8, 16 s, then every 30 s (the cap).
        """
        fleet = self.fleet
        fleet.faults().inject("database")
        name = fleet.fileCSR(self.bearer1, "w1")["metadata"]["name"]
        start, seen, at = fleet.clock.seconds(), self.looks(name), []
        for _ in range(130):
            fleet.clock.advance(1)
            fleet.fake.flush()
            if self.looks(name) > seen:
                seen = self.looks(name)
                at.append(fleet.clock.seconds() - start)
        self.assertEqual(at, [1, 3, 7, 15, 31, 61, 91, 121])
        self.assertFalse(fleet.approved(name))
        self.flushLoggedErrors(sqlite3.OperationalError)

    def test_renewalNetBoxDownOnce_approvedWithoutEvent(self) -> None:
        """
        [R1] [K2] A renewal whose device lookup met NetBox down is approved
        once NetBox answers, 1 s later, without any new event.
        """
        fleet = self.fleet
        fleet.fileCSR(self.bearer1, "w1")
        fleet.kubeInventory.down = True
        renewal = fleet.fileCSR(fleet.fake.nodeCredential("w1"), "w1")
        name = renewal["metadata"]["name"]
        self.assertFalse(fleet.approved(name))
        fleet.clock.advance(1)
        fleet.fake.flush()
        self.assertTrue(fleet.approved(name))
        (entry,) = fleet.entries("kube.csr-renewal-approved")
        self.assertEqual((entry.fields["csr"], entry.fields["late"]), (name, False))
        self.flushLoggedErrors(InventoryError)

    def test_heldForRetryBounded(self) -> None:
        """
        [K2] At most C{held} CSRs wait for a retry; one more waits
        for its next sight (a re-list), as before.
        """
        fleet = self.fleet
        fleet.kube.approver.retries.held = 1
        faults = fleet.faults()
        faults.inject("database")
        first = fleet.fileCSR(self.bearer1, "w1")["metadata"]["name"]
        other = fleet.fileCSR(self.bearer2, "w2")["metadata"]["name"]
        faults.clear()
        fleet.clock.advance(60)
        fleet.fake.flush()
        self.assertTrue(fleet.approved(first))
        self.assertFalse(fleet.approved(other))
        fleet.kube.approver.seen(fleet.fake.csrs[other])  # the re-list
        fleet.fake.flush()
        self.assertTrue(fleet.approved(other))
        self.flushLoggedErrors(sqlite3.OperationalError)

    def test_stop_leavesNoDelayedCall(self) -> None:
        """[K2] Stopping cancels the retries waiting: no delayed call is left."""
        fleet = self.fleet
        before = set(fleet.clock.getDelayedCalls())
        fleet.faults().inject("database")
        fleet.fileCSR(self.bearer1, "w1")
        fleet.fileCSR(self.bearer2, "w2")
        added = [c for c in fleet.clock.getDelayedCalls() if c not in before]
        self.assertEqual(len(added), 2)
        fleet.stopKube()
        self.assertEqual([c for c in added if c.active()], [])
        self.assertEqual(
            [c for c in fleet.clock.getDelayedCalls() if c not in before], []
        )
        self.flushLoggedErrors(sqlite3.OperationalError)

    def test_readAgainUnavailable_backsOff_deletedForgotten(self) -> None:
        """
        [K2] The look again itself meets the API down (503): it is tried
        again after 2 s; a CSR deleted meanwhile (404) is forgotten, not
        looked at again.
        """
        fleet = self.fleet
        fleet.faults().inject("database")
        name = fleet.fileCSR(self.bearer1, "w1")["metadata"]["name"]
        fleet.fake.failNext("GET", f"/certificatesigningrequests/{name}", 503)
        fleet.clock.advance(1)
        fleet.fake.flush()
        self.assertEqual(self.looks(name), 1)
        fleet.fake.deleteFrom(fleet.fake.csrs, name)
        fleet.fake.flush()
        fleet.clock.advance(2)
        fleet.fake.flush()
        self.assertEqual(self.looks(name), 2)
        fleet.clock.advance(120)
        fleet.fake.flush()
        self.assertEqual(self.looks(name), 2)
        self.flushLoggedErrors(sqlite3.OperationalError)
