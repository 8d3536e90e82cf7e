"""
Races and faults of the kubelet approver and the cluster-wide token
(review M4, M1; formerly the probe test_review_cluster_race).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.kube.cluster import ClusterTokenError
from fleetd.kube.service import KubeService
from fleetd.testing.kube import csrPEM
from tests.kubesupport import KubeFleet, device


class OncePerTokenTests(SynchronousTestCase):
    """[K2] Once per token, even when the approval's commit fails (M4)."""

    def test_commitFails_secondCSRSameToken_leftPending(self) -> None:
        """
        [K2] [J1] The API approved the first CSR but its commit failed; a
        second CSR made with the same token is left pending
        (second-csr-for-token), and the first is recorded late.
        """
        fleet = KubeFleet(self)
        self.addCleanup(fleet.stopKube)
        fleet.add(device("w1", "SER1"))
        (run,) = fleet.provision(device("w1", "SER1"))
        bearer = fleet.bearer(run.run)
        fleet.fetch(run.code)
        faults = fleet.faults()
        # Only the record fails: the intent before the API call commits [K2].
        faults.journal.onlyEvents = frozenset({"kube.csr-approved"})
        faults.journal.failing = sqlite3.OperationalError("disk I/O error")
        fleet.fake.closeWatches()  # keep the MODIFIED event for later
        fleet.kube.watcher.stop()
        approver = fleet.kube.approver
        first = fleet.fake.fileCSR(bearer, csrPEM("system:node:w1"))
        approver.seen(fleet.fake.csrs[first["metadata"]["name"]])
        fleet.fake.flush()
        self.assertTrue(fleet.approved(first["metadata"]["name"]))
        faults.clear()
        second = fleet.fake.fileCSR(bearer, csrPEM("system:node:w1"))
        approver.seen(fleet.fake.csrs[second["metadata"]["name"]])
        fleet.fake.flush()
        self.assertFalse(fleet.approved(second["metadata"]["name"]))
        reasons = [
            e.fields["reason"]
            for e in fleet.entries("kube.csr-left-pending")
            if e.fields["csr"] == second["metadata"]["name"]
        ]
        self.assertEqual(reasons, ["second-csr-for-token"])
        approver.seen(fleet.fake.csrs[first["metadata"]["name"]])
        fleet.fake.flush()
        (entry,) = fleet.entries("kube.csr-approved")
        self.assertEqual(entry.fields["csr"], first["metadata"]["name"])
        self.assertTrue(entry.fields["late"])


def _clusterSecrets(fleet: KubeFleet) -> list[str]:
    return sorted(
        name
        for name, secret in fleet.fake.secrets.items()
        if "expiration" not in (secret.get("data") or {})
    )


class ClusterTokenRaceTests(SynchronousTestCase):
    """[K6] Concurrent approvals and rotations leave one cluster token (M1)."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.tokens = self.fleet.kube.cluster
        self.gates: list[Deferred[None]] = []
        self.real = self.tokens.client.createSecret

    def request(self, node: str) -> Any:
        d = Deferred.fromCoroutine(self.tokens.request(node, "x", "owner:o"))
        self.fleet.fake.flush()
        return self.successResultOf(d)

    def slowSecrets(self) -> None:
        """Secret creations wait at a gate: the API round trip."""

        async def slow(secret: Any) -> Any:
            gate: Deferred[None] = Deferred()
            self.gates.append(gate)
            await gate
            return await self.real(secret)

        self.tokens.client.createSecret = slow  # type: ignore[method-assign]

    def openGates(self) -> None:
        while self.gates:
            self.gates.pop(0).callback(None)
            self.fleet.fake.flush()
        self.tokens.client.createSecret = self.real  # type: ignore[method-assign]

    def test_twoApprovals_oneClusterToken(self) -> None:
        """
        [K6] [K5] Two approvals at once hand out the same cluster token;
        only one cluster Secret exists, and a rotation then leaves only
        the new one after the overlap.
        """
        a, b = self.request("cp1"), self.request("cp2")
        self.slowSecrets()
        d1 = Deferred.fromCoroutine(self.tokens.approve(a.id, "owner:o"))
        d2 = Deferred.fromCoroutine(self.tokens.approve(b.id, "owner:o"))
        self.openGates()
        (_, t1), (_, t2) = self.successResultOf(d1), self.successResultOf(d2)
        self.assertEqual(t1.id, t2.id)
        self.assertEqual(_clusterSecrets(self.fleet), [f"bootstrap-token-{t1.id}"])
        d3 = Deferred.fromCoroutine(self.tokens.rotate("owner:o"))
        self.fleet.fake.flush()
        new, _, _ = self.successResultOf(d3)
        self.fleet.clock.advance(10 * 86400)
        self.fleet.fake.flush()
        self.assertEqual(_clusterSecrets(self.fleet), [f"bootstrap-token-{new.id}"])

    def test_approveAndRotate_oneCurrentTokenOldExpires(self) -> None:
        """
        [K6] An approval and a rotation at once: the rotation replaces the
        token the approval created, which then gets its deletion deadline.
        """
        a = self.request("cp1")
        self.slowSecrets()
        d1 = Deferred.fromCoroutine(self.tokens.approve(a.id, "owner:o"))
        d2 = Deferred.fromCoroutine(self.tokens.rotate("owner:o"))
        self.openGates()
        _, approved = self.successResultOf(d1)
        new, old, _ = self.successResultOf(d2)
        self.assertEqual(old, approved.id)
        self.assertEqual(self.tokens.clusterTokenId(), new.id)
        self.fleet.clock.advance(10 * 86400)
        self.fleet.fake.flush()
        self.assertEqual(_clusterSecrets(self.fleet), [f"bootstrap-token-{new.id}"])

    def test_currentChangedUnderneath_conflictSecretDiscarded(self) -> None:
        """
        [K6] [J1] The transaction finds a current token the approval did
        not decide from: refused (conflict), its new Secret deleted,
        nothing recorded.
        """
        a, b = self.request("cp1"), self.request("cp2")
        d = Deferred.fromCoroutine(self.tokens.approve(a.id, "owner:o"))
        self.fleet.fake.flush()
        _, first = self.successResultOf(d)
        self.tokens._current = None  # memory behind the database
        d = Deferred.fromCoroutine(self.tokens.approve(b.id, "owner:o"))
        self.fleet.fake.flush()
        error = self.failureResultOf(d, ClusterTokenError).value
        self.assertEqual(error.kind, "conflict")
        self.assertEqual(_clusterSecrets(self.fleet), [f"bootstrap-token-{first.id}"])
        self.assertEqual(len(self.fleet.entries("cluster-token.approved")), 1)


class ClusterGrantTests(SynchronousTestCase):
    """[K5] A grant is used once, even when its commit fails."""

    def test_grantCommitFails_secondCSRLeftPending(self) -> None:
        """
        [K5] [J1] The API approved the grant's CSR but the commit failed:
        the grant is not handed to a second CSR, and the next sight of the
        approved CSR records its use late, once.
        """
        fleet = KubeFleet(self)
        self.addCleanup(fleet.stopKube)
        tokens = fleet.kube.cluster
        d = Deferred.fromCoroutine(tokens.request("cp1", "x", "owner:o"))
        fleet.fake.flush()
        request = self.successResultOf(d)
        d2 = Deferred.fromCoroutine(tokens.approve(request.id, "owner:o"))
        fleet.fake.flush()
        _, token = self.successResultOf(d2)
        faults = fleet.faults()
        faults.runner.failing = sqlite3.OperationalError("disk I/O error")
        first = fleet.fileCSR(token.bearer, "cp1")
        self.assertTrue(fleet.approved(first["metadata"]["name"]))
        faults.clear()
        second = fleet.fileCSR(token.bearer, "cp1")
        self.assertFalse(fleet.approved(second["metadata"]["name"]))
        self.assertIsNone(tokens.grantFor("cp1", token.id))
        self.assertEqual(fleet.entries("kube.csr-approved-cluster-token"), [])
        # The next sight of the approved CSR records the grant's use late.
        name = first["metadata"]["name"]
        fleet.kube.approver.seen(fleet.fake.csrs[name])
        fleet.fake.flush()
        (entry,) = fleet.entries("kube.csr-approved-cluster-token")
        self.assertEqual(
            dict(entry.fields),
            {"csr": name, "node": "cp1", "request": request.id, "late": True},
        )
        self.assertIsNone(tokens.claimedBy(name))
        used = self.successResultOf(
            fleet.runner.run(
                lambda db: db.execute(
                    "SELECT state, csr FROM cluster_token_requests WHERE id = ?",
                    (request.id,),
                ).fetchone()
            )
        )
        self.assertEqual(tuple(used), ("used", name))
        fleet.kube.approver.seen(fleet.fake.csrs[name])  # once only
        fleet.fake.flush()
        self.assertEqual(len(fleet.entries("kube.csr-approved-cluster-token")), 1)


class StartRetryTests(SynchronousTestCase):
    """A failed start of the Kubernetes services is tried again."""

    def test_startFails_retriedWithBackoff_thenWatches(self) -> None:
        """
        [K2] The database is down at start: the watch (and so the
        approver) starts once it answers, retried on the injected clock
        with backoff; stopping cancels a pending retry.
        """
        from tests.faultsupport import FaultyRunner
        from tests.kubesupport import SETTINGS

        fleet = KubeFleet(self)
        fleet.stopKube()
        runner = FaultyRunner(fleet.runner)
        runner.failing = sqlite3.OperationalError("disk I/O error")
        service = KubeService(
            clock=fleet.clock,
            settings=SETTINGS,
            client=fleet.client,
            runner=runner,
            journal=fleet.journal,
            inventory=fleet.inventory,
            sealKey=b"s" * 32,
        )
        service.startService()
        fleet.fake.flush()
        self.assertFalse(service.watcher._running)
        fleet.clock.advance(1)  # first retry: still down
        self.assertFalse(service.watcher._running)
        runner.failing = None
        fleet.clock.advance(1.5)  # not yet: the delay doubled
        self.assertFalse(service.watcher._running)
        fleet.clock.advance(0.5)
        fleet.fake.flush()
        self.assertTrue(service.watcher._running)
        d = service.stopService()
        fleet.fake.flush()
        self.successResultOf(d)
        self.assertEqual(fleet.clock.getDelayedCalls(), [])
        self.flushLoggedErrors(sqlite3.OperationalError)

    def test_stopWhileRetryPending_noDelayedCall(self) -> None:
        """Stopping while a retry waits cancels it: no delayed call is left."""
        from tests.faultsupport import FaultyRunner
        from tests.kubesupport import SETTINGS

        fleet = KubeFleet(self)
        fleet.stopKube()
        runner = FaultyRunner(fleet.runner)
        runner.failing = sqlite3.OperationalError("disk I/O error")
        service = KubeService(
            clock=fleet.clock,
            settings=SETTINGS,
            client=fleet.client,
            runner=runner,
            journal=fleet.journal,
            inventory=fleet.inventory,
            sealKey=b"s" * 32,
        )
        service.startService()
        self.assertEqual(len(fleet.clock.getDelayedCalls()), 1)
        self.successResultOf(service.stopService())
        self.assertEqual(fleet.clock.getDelayedCalls(), [])
        self.flushLoggedErrors(sqlite3.OperationalError)

    def test_partialStart_tokensLoadedOnce(self) -> None:
        """
        [K4] The tokens loaded but the cluster tokens did not: the retry
        does not load (and arm) the tokens a second time, so stopping
        leaves no timer behind.
        """
        from tests.faultsupport import FaultyRunner
        from tests.kubesupport import SETTINGS

        fleet = KubeFleet(self)
        fleet.add(device("w1", "SER1"))
        fleet.provision(device("w1", "SER1"))  # a live token with its expiry
        fleet.stopKube()
        self.assertEqual(fleet.clock.getDelayedCalls(), [])

        class SecondCallFails(FaultyRunner):
            calls = 0

            def run(self, f: Any) -> Any:
                self.calls += 1
                if self.calls == 2:
                    self.failing = sqlite3.OperationalError("disk I/O error")
                try:
                    return super().run(f)
                finally:
                    self.failing = None

        service = KubeService(
            clock=fleet.clock,
            settings=SETTINGS,
            client=fleet.client,
            runner=SecondCallFails(fleet.runner),
            journal=fleet.journal,
            inventory=fleet.inventory,
            sealKey=b"s" * 32,
        )
        service.startService()
        fleet.fake.flush()
        fleet.clock.advance(1)
        fleet.fake.flush()
        self.assertTrue(service.watcher._running)
        d = service.stopService()
        fleet.fake.flush()
        self.successResultOf(d)
        self.assertEqual(fleet.clock.getDelayedCalls(), [])
        self.flushLoggedErrors(sqlite3.OperationalError)
