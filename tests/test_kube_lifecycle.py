"""
[K4] Token deletion deadlines across restarts, API outages and stops; the
CSR watch loop (list, watch, bookmarks, 410, backoff); the service's stop
leaving nothing armed.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.kube.csrwatcher import CSRWatcher
from fleetd.kube.machine import TokenEffects, TokenMachine
from fleetd.testing.kube import FakeKube, csrPEM
from tests.kubesupport import KubeFleet, bootstrapSecret, device


class MachineTests(SynchronousTestCase):
    class Effects(TokenEffects):
        def __init__(self) -> None:
            self.calls: list[Any] = []

        def arm(self, deadline: float) -> None:
            self.calls.append(("arm", deadline))

        def disarm(self) -> None:
            self.calls.append("disarm")

        def startDelete(self) -> None:
            self.calls.append("delete")

        def cancelDelete(self) -> None:
            self.calls.append("cancel")

        def armRetry(self) -> None:
            self.calls.append("retry")

        def forget(self) -> None:
            self.calls.append("forget")

    def test_issued_onlyStateThatMayApprove(self) -> None:
        """[K2] Once per token: only an issued token may have its CSR approved."""
        effects = self.Effects()
        machine = TokenMachine(effects)
        machine.restoreIssued(10.0)
        self.assertTrue(machine.firstCSR())
        machine.approved(70.0)
        self.assertFalse(machine.firstCSR())
        self.assertEqual(effects.calls, [("arm", 10.0), "disarm", ("arm", 70.0)])

    def test_failedDelete_retried_stopCancels(self) -> None:
        """[K4] A failed delete arms a retry; stop while deleting cancels the call."""
        effects = self.Effects()
        machine = TokenMachine(effects)
        machine.restoreApproved(5.0)
        machine.deadline()
        machine.failed()
        machine.deadline()
        machine.stop()
        self.assertEqual(
            effects.calls,
            [("arm", 5.0), "disarm", "delete", "retry", "disarm", "delete", "cancel"],
        )
        machine.deleted()  # a late answer after stop changes nothing
        self.assertEqual(machine.describe(), "stopped")


class DeletionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.fleet.add(device("w1", "SER1"))
        (self.theRun,) = self.fleet.provision(device("w1", "SER1"))
        self.bearer = self.fleet.bearer(self.theRun.run)
        self.tokenId = self.bearer.split(".")[0]
        self.secret = f"bootstrap-token-{self.tokenId}"

    def approve(self) -> None:
        self.fleet.fetch(self.theRun.code)
        self.fleet.fileCSR(self.bearer, "w1")
        record = self.fleet.token(self.tokenId)
        assert record is not None
        self.assertEqual(record.delete_at, self.fleet.clock.seconds() + 60)

    def test_restart_rearmsPersistedDeadline(self) -> None:
        """[K4] A restart before the deadline re-arms it from the database."""
        self.approve()
        self.fleet.clock.advance(30)
        self.fleet.restart()
        self.addCleanup(self.fleet.stopKube)
        self.fleet.clock.advance(29)
        self.fleet.fake.flush()
        self.assertIn(self.secret, self.fleet.fake.secrets)
        self.fleet.clock.advance(1)
        self.fleet.fake.flush()
        self.assertNotIn(self.secret, self.fleet.fake.secrets)
        record = self.fleet.token(self.tokenId)
        assert record is not None
        self.assertEqual(record.deleted_at, 60.0)

    def test_restart_overdueFiresAtStart(self) -> None:
        """[K4] A deadline that passed while fleetd was down fires at start."""
        self.approve()
        self.fleet.stopKube()
        self.fleet.clock.advance(600)
        self.fleet.registry.stop()
        self.fleet.db.close()
        self.fleet.start()
        self.addCleanup(self.fleet.stopKube)
        self.fleet.clock.advance(0)  # the next reactor turn after start
        self.fleet.fake.flush()
        self.assertNotIn(self.secret, self.fleet.fake.secrets)
        (entry,) = self.fleet.entries("kube.token-deleted")
        self.assertEqual(entry.at, 600.0)

    def test_apiDown_retriedUntilDeleted(self) -> None:
        """[K4] The API is down at the deadline: retried with backoff until it works."""
        self.addCleanup(self.fleet.stopKube)
        self.approve()
        self.fleet.fake.reachable = False
        self.fleet.clock.advance(60)
        for _ in range(5):
            self.fleet.clock.advance(30)
        self.assertIn(self.secret, self.fleet.fake.secrets)
        self.assertEqual(self.fleet.entries("kube.token-deleted"), [])
        self.fleet.fake.reachable = True
        self.fleet.clock.advance(60)
        self.fleet.fake.flush()
        self.assertNotIn(self.secret, self.fleet.fake.secrets)
        self.assertEqual(len(self.fleet.entries("kube.token-deleted")), 1)

    def test_deleteServerError_retried(self) -> None:
        """[K4] A 500 on the delete is retried; a 404 (already gone) counts as done."""
        self.addCleanup(self.fleet.stopKube)
        self.approve()
        self.fleet.fake.failNext("DELETE", "/secrets/", 500)
        self.fleet.clock.advance(60)
        self.assertIn(self.secret, self.fleet.fake.secrets)
        del self.fleet.fake.secrets[self.secret]  # someone else deleted it
        self.fleet.clock.advance(1)
        (entry,) = self.fleet.entries("kube.token-deleted")
        self.assertFalse(entry.fields["was_present"])

    def test_expiryBackstop_unapprovedTokenDeleted(self) -> None:
        """[K1] An unapproved token's Secret is deleted at its expiration."""
        self.addCleanup(self.fleet.stopKube)
        self.fleet.clock.advance(86400)
        self.fleet.fake.flush()
        self.assertNotIn(self.secret, self.fleet.fake.secrets)

    def test_stop_leavesNoDelayedCalls(self) -> None:
        """[K4] Stopping cancels every timer: the deletion, the watch, the check."""
        self.approve()
        self.fleet.fake.reachable = False
        self.fleet.clock.advance(60)  # a retry is armed
        self.assertTrue(self.fleet.clock.getDelayedCalls())
        self.fleet.stopKube()
        self.assertEqual(self.fleet.clock.getDelayedCalls(), [])
        self.assertEqual(self.fleet.fake.watchers, [])


class WatcherTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.fake = FakeKube(self.clock)
        self.client = self.fake.client()
        self.seen: list[str] = []
        self.watcher = CSRWatcher(
            self.clock,
            self.client,
            lambda csr: self.seen.append(csr["metadata"]["name"]),
            timeoutSeconds=100,
        )
        self.fake.postSecret(bootstrapSecret())

    def tearDown(self) -> None:
        self.watcher.stop()
        self.fake.flush()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def file(self) -> str:
        csr = self.fake.fileCSR("abcdef.0123456789abcdef", csrPEM("system:node:w1"))
        self.fake.flush()
        name: str = csr["metadata"]["name"]
        return name

    def test_listThenWatch(self) -> None:
        """CSRs filed before start are listed; later ones arrive by the watch."""
        before = self.file()
        self.watcher.start()
        self.fake.flush()
        after = self.file()
        self.assertEqual(self.seen, [before, after])
        self.assertEqual(self.watcher.lists, 1)

    def test_bookmark_advancesVersion(self) -> None:
        """A BOOKMARK moves the resume point without an object."""
        self.watcher.start()
        self.fake.flush()
        self.fake.rv += 5
        self.fake.bookmark()
        self.assertEqual(self.watcher.resourceVersion, str(self.fake.rv))

    def test_serverEndsStream_resumesWithoutList(self) -> None:
        """A watch the server ends (timeoutSeconds) resumes from the last version."""
        self.watcher.start()
        self.fake.flush()
        self.clock.advance(100)
        self.fake.flush()
        name = self.file()
        self.assertEqual(self.seen, [name])
        self.assertEqual(self.watcher.lists, 1)

    def test_gone_relists(self) -> None:
        """A 410 ERROR event (version compacted away) lists again, missing nothing."""
        self.watcher.start()
        self.fake.flush()
        self.fake.reachable = False  # the API server restarts...
        self.fake.closeWatches()
        name = self.file()
        self.fake.compact()  # ...and its history is gone
        self.fake.reachable = True
        self.clock.advance(1)
        self.fake.flush()
        self.assertEqual(self.watcher.lists, 2)
        self.assertEqual(self.seen, [name])

    def test_apiDown_backoffThenRecovers(self) -> None:
        """API down: retried with growing delays; back up, the CSRs are listed."""
        self.fake.reachable = False
        self.watcher.start()
        self.assertEqual(self.watcher.failures, 1)
        self.clock.advance(1)
        self.assertEqual(self.watcher.failures, 2)
        self.clock.advance(1)  # the second delay is 2 s
        self.assertEqual(self.watcher.failures, 2)
        self.fake.reachable = True
        name = self.file()
        self.clock.advance(1)
        self.fake.flush()
        self.assertEqual(self.seen, [name])

    def test_listServerError_backoff(self) -> None:
        """A 5xx on the list is a failure with backoff, not a crash."""
        self.fake.failNext("GET", "/certificatesigningrequests", 503)
        self.watcher.start()
        self.fake.flush()
        self.assertEqual(self.watcher.failures, 1)
        self.clock.advance(1)
        self.fake.flush()
        self.assertEqual(self.watcher.lists, 1)

    def test_goneRightAfterList_backsOff(self) -> None:
        """A server answering 410 even to a fresh version is retried with backoff."""
        self.fake.oldest = 10**9  # every version is too old
        self.watcher.start()
        self.fake.flush()
        self.assertEqual(self.watcher.lists, 1)
        self.clock.advance(1)
        self.fake.flush()
        self.assertEqual(self.watcher.lists, 2)
        self.clock.advance(1)  # the next delay is 2 s
        self.fake.flush()
        self.assertEqual(self.watcher.lists, 2)
