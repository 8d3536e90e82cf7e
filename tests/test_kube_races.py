"""
Races and faults of the kubelet approver and the cluster-wide token
(review M4, M1; formerly the probe test_review_cluster_race).
"""

from __future__ import annotations

import sqlite3

from twisted.trial.unittest import SynchronousTestCase

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
        faults.runner.failing = sqlite3.OperationalError("disk I/O error")
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
