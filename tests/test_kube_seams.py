"""
Issue 17, Kubernetes credentials: one malformed CSR does not stop the
approver [K2]; once per token survives a restart at any point [K2] [J1];
a retirement stops approvals already in flight [R1].
"""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import DeviceStatus
from fleetd.k8s.client import KubeError, KubeUnavailable
from fleetd.kube.csr import Unreadable, readCSR
from fleetd.kube.csrwatcher import CSRWatcher
from fleetd.store.db import StoreError
from fleetd.testing.kube import csrPEM, malformedBasicConstraintsPEM
from tests.kubesupport import KubeFleet, TwoNodesMixin, device


def _pending(fleet: KubeFleet) -> list[tuple[str, str]]:
    return [
        (e.fields["csr"], e.fields["reason"])
        for e in fleet.entries("kube.csr-left-pending")
    ]


class MalformedCSRTests(TwoNodesMixin):
    """[K2] A CSR fleetd cannot read never stops approvals for other nodes."""

    def fileMalformed(self) -> str:
        """Anyone holding any bootstrap token (here w2's) files the bad CSR."""
        csr = self.fleet.fake.fileCSR(
            self.bearer2,
            malformedBasicConstraintsPEM("system:node:w2"),
        )
        self.fleet.fake.flush()
        name: str = csr["metadata"]["name"]
        return name

    def test_malformedCSR_restart_honestFirstCSRApproved(self) -> None:
        """
        [K2] A kubelet-shaped CSR whose basicConstraints value is malformed
        (an INTEGER, re-signed; kube-apiserver accepts it) is left pending
        and journaled once (unreadable); after a restart, whose LIST holds
        it, an honest node's first CSR is still approved.
        """
        bad = self.fileMalformed()
        self.fleet.restart()
        self.assertTrue(self.fleet.kube.watcher._running)
        csr = self.fleet.fileCSR(self.bearer1, "w1")
        name = csr["metadata"]["name"]
        self.assertTrue(self.fleet.approved(name))
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.ACTIVE)
        self.assertFalse(self.fleet.approved(bad))
        reasons = [r for c, r in _pending(self.fleet) if c == bad]
        # Once per sight's process: before the restart and after it.
        self.assertEqual(reasons, ["unreadable", "unreadable"])
        self.fleet.kube.approver.seen(self.fleet.fake.csrs[bad])
        self.assertEqual(len([c for c, _ in _pending(self.fleet) if c == bad]), 2)

    def test_malformedCSR_watched_honestCSRApproved(self) -> None:
        """
        [K2] The same CSR arriving on the watch does not end the stream:
        later CSRs are approved with no re-list and no wait.
        """
        watcher = self.fleet.kube.watcher
        lists = watcher.lists
        self.fileMalformed()
        csr = self.fleet.fileCSR(self.bearer1, "w1")
        self.assertTrue(self.fleet.approved(csr["metadata"]["name"]))
        self.assertEqual((watcher.lists, watcher.failures), (lists, 0))


class WatchCallbackContainedTests(SynchronousTestCase):
    """[K2] A callback that raises is contained per object in the watch loop."""

    def test_callbackRaises_skippedCountedWatchGoesOn(self) -> None:
        """
        [K2] The CSR handler raising on one object (listed, then watched)
        is logged and counted in fleetd_kube_csr_handler_errors_total; the
        other objects are still handed over and the watch keeps running.
        """
        fleet = KubeFleet(self)
        self.addCleanup(fleet.stopKube)
        fleet.stopKube()
        fake = fleet.fake
        admin = fake.adminToken
        bad = csrPEM("system:node:bad")
        fake.fileCSR(admin, bad)
        fake.fileCSR(admin, csrPEM("system:node:a"))
        seen: list[str] = []

        def onCSR(obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if base64.b64decode(obj["spec"]["request"]) == bad:
                raise RuntimeError(f"cannot handle {name}")
            seen.append(name)

        registry = CollectorRegistry()
        watcher = CSRWatcher(fleet.clock, fleet.client, onCSR, registry=registry)
        watcher.start()
        fake.flush()
        self.addCleanup(fake.flush)
        self.addCleanup(watcher.stop)
        self.assertEqual(len(seen), 1)
        fake.fileCSR(admin, csrPEM("system:node:b"))
        fake.fileCSR(admin, bad)  # on the watch this time
        fake.fileCSR(admin, csrPEM("system:node:c"))
        fake.flush()
        self.assertEqual(len(seen), 3)
        self.assertTrue(watcher._running)
        self.assertEqual((watcher.lists, watcher.failures), (1, 0))
        errors = registry.get_sample_value("fleetd_kube_csr_handler_errors_total")
        self.assertEqual(errors, 2.0)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
_PATHS = (
    ("metadata",),
    ("metadata", "name"),
    ("spec",),
    ("spec", "request"),
    ("spec", "groups"),
    ("spec", "usages"),
    ("spec", "expirationSeconds"),
    ("status",),
    ("status", "conditions"),
    ("status", "certificate"),
)


_REQUEST = base64.b64encode(csrPEM("system:node:w1")).decode()


class ReadCSRTotalTests(SynchronousTestCase):
    """[K2] L{readCSR} is total: facts, or L{Unreadable}, nothing else."""

    @settings(max_examples=200, deadline=None)
    @given(path=st.sampled_from(_PATHS), value=_JSON)
    def test_anyPartReplaced_factsOrUnreadable(
        self, path: tuple[str, ...], value: Any
    ) -> None:
        """
        [K2] A CSR object with any part replaced by any JSON value reads as
        facts or raises L{Unreadable}; no other error reaches the approver.
        """
        obj: dict[str, Any] = {
            "metadata": {"name": "csr-1", "uid": "u"},
            "spec": {
                "request": _REQUEST,
                "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                "usages": ["digital signature", "client auth"],
            },
            "status": {},
        }
        where = obj
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        try:
            readCSR(obj)
        except Unreadable:
            pass

    def test_malformedExtension_unreadable(self) -> None:
        """[K2] The malformed basicConstraints request is L{Unreadable}."""
        obj = {
            "metadata": {"name": "csr-1"},
            "spec": {
                "request": base64.b64encode(
                    malformedBasicConstraintsPEM("system:node:w1")
                ).decode()
            },
        }
        self.assertRaises(Unreadable, readCSR, obj)


class OncePerTokenRestartTests(SynchronousTestCase):
    """[K2] [J1] Once per token holds across a restart at any point."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"))
        (self.provisioned,) = self.fleet.provision(device("w1", "SER1"))
        self.bearer = self.fleet.bearer(self.provisioned.run)
        self.tokenId = self.bearer.split(".")[0]
        self.fleet.fetch(self.provisioned.code)

    def fileFirst(self) -> str:
        """The attacker's CSR on the same token, named to be listed first."""
        self.fleet.fake.fileCSR(
            self.bearer, csrPEM("system:node:w1"), name="a-sorts-first"
        )
        self.fleet.fake.flush()
        return "a-sorts-first"

    def assertOnce(self, honest: str, other: str, late: bool) -> None:
        fleet = self.fleet
        self.assertTrue(fleet.approved(honest))
        self.assertFalse(fleet.approved(other))
        self.assertIn((other, "second-csr-for-token"), _pending(fleet))
        (entry,) = fleet.entries("kube.csr-approved")
        self.assertEqual((entry.fields["csr"], entry.fields["late"]), (honest, late))
        record = fleet.token(self.tokenId)
        assert record is not None
        self.assertEqual((record.csr, record.approved_at is not None), (honest, True))
        self.assertEqual(fleet.status("w1"), DeviceStatus.ACTIVE)

    def test_restartAfterAPIApproved_recordedLateOtherLeftPending(self) -> None:
        """
        [K2] [J1] The API approved the first CSR but fleetd restarted
        before the record committed; a second CSR on the token, named to
        be listed first, is left pending after the restart, and the
        approved one is recorded late, once.
        """
        faults = self.fleet.faults()
        faults.journal.onlyEvents = frozenset({"kube.csr-approved"})
        faults.journal.failing = StoreError("journal head is not authentic")
        honest = self.fleet.fileCSR(self.bearer, "w1")["metadata"]["name"]
        self.assertTrue(self.fleet.approved(honest))
        self.assertEqual(self.fleet.entries("kube.csr-approved"), [])
        faults.clear()
        other = self.fileFirst()
        self.fleet.restart()
        self.assertOnce(honest, other, late=True)
        self.fleet.restart()  # and once only
        self.assertEqual(len(self.fleet.entries("kube.csr-approved")), 1)

    def test_restartDuringAPICall_intentBindsToken(self) -> None:
        """
        [K2] [J1] fleetd restarts while the approval is in the API call:
        the intent was journaled first (kube.csr-approving), so after the
        restart only that CSR may be approved; the other is left pending.
        """
        self.fleet.fake.hangNext("PUT", "/approval")
        honest = self.fleet.fileCSR(self.bearer, "w1")["metadata"]["name"]
        self.assertFalse(self.fleet.approved(honest))
        (intent,) = self.fleet.entries("kube.csr-approving")
        self.assertEqual(
            (intent.device, intent.fields["csr"], intent.fields["bootstrap_id"]),
            ("w1", honest, self.tokenId),
        )
        other = self.fileFirst()
        self.fleet.restart()
        self.assertOnce(honest, other, late=False)

    def test_oneList_approvedHandledBeforePending(self) -> None:
        """
        [K2] In one LIST an approved CSR is handled before a pending one,
        whatever their names: a token used by an approval fleetd never
        recorded (no intent, as before this rule) approves no other CSR.
        """
        fleet = self.fleet
        fleet.stopKube()
        honest = fleet.fake.fileCSR(self.bearer, csrPEM("system:node:w1"))
        name = honest["metadata"]["name"]
        body = dict(fleet.fake.csrs[name])
        body["status"] = {
            "conditions": [
                {
                    "type": "Approved",
                    "status": "True",
                    "reason": "FleetdApproved",
                    "message": "an older fleetd",
                }
            ]
        }
        fleet.fake.putApproval(name, body)
        other = self.fileFirst()
        fleet.restart()
        self.assertOnce(name, other, late=True)

    def test_lateRecordAwaited_tokenMarkedAtOnce(self) -> None:
        """
        [K2] While the late record of an approved CSR waits for the
        database, the token is already marked: a pending CSR on it seen
        meanwhile is left pending (second-csr-for-token) at once.
        """
        fleet = self.fleet
        fleet.kube.watcher.stop()
        fleet.fake.flush()
        honest = fleet.fake.fileCSR(self.bearer, csrPEM("system:node:w1"))
        name = honest["metadata"]["name"]
        body = dict(fleet.fake.csrs[name])
        body["status"] = {
            "conditions": [
                {"type": "Approved", "status": "True", "reason": "FleetdApproved"}
            ]
        }
        fleet.fake.putApproval(name, body)
        other = fleet.fake.fileCSR(self.bearer, csrPEM("system:node:w1"))
        inner = fleet.journal._runner
        held: list[Deferred[None]] = []

        class Held:
            def run(self, f: Any) -> Deferred[Any]:
                gate: Deferred[None] = Deferred()
                held.append(gate)
                return gate.addCallback(lambda _: inner.run(f))

        fleet.journal._runner = Held()
        approver = fleet.kube.approver
        approver.seen(fleet.fake.csrs[name])
        approver.seen(fleet.fake.csrs[other["metadata"]["name"]])
        fleet.journal._runner = inner
        self.assertEqual(fleet.entries("kube.csr-approved"), [])  # still waiting
        while held:
            held.pop(0).callback(None)
        fleet.fake.flush()
        self.assertOnce(name, other["metadata"]["name"], late=True)

    def test_intentNotRecorded_noAPICall(self) -> None:
        """
        [K2] [J1] The intent cannot be journaled (database down): the API
        is not asked; once the database answers, the CSR is looked at
        again (1 s later, no new event) and approved.
        """
        faults = self.fleet.faults()
        faults.inject("database")
        name = self.fleet.fileCSR(self.bearer, "w1")["metadata"]["name"]
        self.assertFalse(self.fleet.approved(name))
        self.assertEqual([c for c in self.fleet.fake.calls if c[0] == "PUT"], [])
        faults.clear()
        self.fleet.clock.advance(1)
        self.fleet.fake.flush()
        self.assertTrue(self.fleet.approved(name))
        self.assertEqual(len(self.fleet.entries("kube.csr-approving")), 1)
        self.flushLoggedErrors()

    def test_renewalRecordFails_recordedLateOnNextSight(self) -> None:
        """
        [R1] [J1] A renewal the API approved whose record failed is
        recorded late (late: true) on its next sighting (the certificate
        issued), once.
        """
        fleet = self.fleet
        fleet.fileCSR(self.bearer, "w1")
        faults = fleet.faults()
        faults.journal.onlyEvents = frozenset({"kube.csr-renewal-approved"})
        faults.journal.failing = StoreError("journal head is not authentic")
        renewal = fleet.fileCSR(fleet.fake.nodeCredential("w1"), "w1")
        name = renewal["metadata"]["name"]
        self.assertTrue(fleet.approved(name))
        self.assertEqual(fleet.entries("kube.csr-renewal-approved"), [])
        faults.clear()
        fleet.fake.sign()  # MODIFIED: the next sight
        fleet.fake.flush()
        (entry,) = fleet.entries("kube.csr-renewal-approved")
        self.assertEqual((entry.fields["csr"], entry.fields["late"]), (name, True))
        self.assertEqual(fleet.kubelet("w1").last_csr, name)
        fleet.kube.approver.seen(fleet.fake.csrs[name])
        fleet.fake.flush()
        self.assertEqual(len(fleet.entries("kube.csr-renewal-approved")), 1)


class RetireInFlightTests(SynchronousTestCase):
    """[R1] A retirement stops approvals already in flight."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"))
        (self.provisioned,) = self.fleet.provision(device("w1", "SER1"))
        self.bearer = self.fleet.bearer(self.provisioned.run)
        self.fleet.fetch(self.provisioned.code)
        self.gates: list[Deferred[None]] = []

    def holdApprovals(self) -> None:
        """Approval calls wait at a gate: the API round trip."""
        client = self.fleet.client
        real = client.approveCSR

        async def slow(*args: Any) -> Any:
            gate: Deferred[None] = Deferred()
            self.gates.append(gate)
            await gate
            return await real(*args)

        client.approveCSR = slow  # type: ignore[method-assign,assignment]

    def retire(self) -> Deferred[Any]:
        d = Deferred.fromCoroutine(self.fleet.retirer.retire("w1", "owner:o"))
        self.fleet.fake.flush()
        return d

    def stopWhileDeleting(self, d: Deferred[Any]) -> None:
        """fleetd stops: the Node deletion still in flight ends unavailable
        (the owner retires again) and the device is released."""
        self.fleet.stopKube()
        self.failureResultOf(d, KubeUnavailable)

    def open(self) -> None:
        while self.gates:
            self.gates.pop(0).callback(None)
            self.fleet.fake.flush()

    def assertRetiredAfter(self, event: str) -> None:
        events = self.fleet.events("w1")
        self.assertLess(events.index(event), events.index("device.retired"))
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        self.assertIsNotNone(self.fleet.kubelet("w1").retired_at)

    def test_firstCSRInAPICall_retirementWaitsRetiredAtKept(self) -> None:
        """
        [R1] A first CSR held in the API call while `fleetctl retire` runs:
        the retirement waits for it, so the approval is recorded before the
        retirement, and retired_at stays set.
        """
        self.holdApprovals()
        self.fleet.fileCSR(self.bearer, "w1")
        d = self.retire()
        self.assertNoResult(d)
        self.assertEqual(self.fleet.fake.calls.count(("DELETE", "/api/v1/nodes/w1")), 0)
        self.open()
        self.successResultOf(d)
        self.assertRetiredAfter("kube.csr-approved")

    def test_renewalInAPICall_retirementWaits(self) -> None:
        """[R1] The same for a renewal held in the API call."""
        self.fleet.fileCSR(self.bearer, "w1")
        self.holdApprovals()
        self.fleet.fileCSR(self.fleet.fake.nodeCredential("w1"), "w1")
        d = self.retire()
        self.assertNoResult(d)
        self.open()
        self.successResultOf(d)
        self.assertRetiredAfter("kube.csr-renewal-approved")

    def test_retiring_firstCSRRefusedDuringAPICalls(self) -> None:
        """
        [R1] The retirement revokes the device's tokens in memory before
        its API calls: a first CSR seen while the Node deletion is under
        way is left pending (token-revoked).
        """
        self.fleet.fake.hangNext("DELETE", "/nodes/")
        d = self.retire()
        self.assertNoResult(d)
        first = self.fleet.fileCSR(self.bearer, "w1")["metadata"]["name"]
        self.assertFalse(self.fleet.approved(first))
        self.assertIn((first, "token-revoked"), _pending(self.fleet))
        self.stopWhileDeleting(d)

    def test_retiring_renewalRefusedDuringAPICalls(self) -> None:
        """
        [R1] A renewal seen while the retirement's Node deletion is under
        way is left pending (renewal-device-retiring).
        """
        self.fleet.fileCSR(self.bearer, "w1")
        self.fleet.fake.hangNext("DELETE", "/nodes/")
        d = self.retire()
        self.assertNoResult(d)
        renewal = self.fleet.fileCSR(self.fleet.fake.nodeCredential("w1"), "w1")
        name = renewal["metadata"]["name"]
        self.assertFalse(self.fleet.approved(name))
        self.assertIn((name, "renewal-device-retiring"), _pending(self.fleet))
        self.stopWhileDeleting(d)

    def test_retirementFails_approvalsResume(self) -> None:
        """
        [R1] A retirement refused (the Node cannot be deleted) releases the
        device: its token approves its first CSR again.
        """
        self.fleet.fake.failNext("DELETE", "/nodes/", 503, "ServiceUnavailable")
        self.failureResultOf(self.retire(), KubeError)
        name = self.fleet.fileCSR(self.bearer, "w1")["metadata"]["name"]
        self.assertTrue(self.fleet.approved(name))
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.ACTIVE)

    def test_approvedBeforeRecordedAfterRetirement_warningRetiredAtKept(
        self,
    ) -> None:
        """
        [R1] [K2] The API approved the first CSR (and the certificate was
        issued) but its record failed; the device is retired and fleetd
        restarts; the late record re-checks the device in its transaction:
        kube.csr-approved-after-retirement with the notAfter, retired_at
        kept, the status left decommissioning, no kube.csr-approved.
        """
        fleet = self.fleet
        faults = fleet.faults()
        faults.journal.onlyEvents = frozenset({"kube.csr-approved"})
        faults.journal.failing = StoreError("journal head is not authentic")
        name = fleet.fileCSR(self.bearer, "w1")["metadata"]["name"]
        self.assertTrue(fleet.approved(name))
        fleet.kube.watcher.stop()  # its next sight comes after the restart
        fleet.fake.flush()
        fleet.fake.sign()
        faults.clear()
        self.successResultOf(self.retire())
        fleet.restart()
        (entry,) = fleet.entries("kube.csr-approved-after-retirement")
        self.assertEqual(
            (entry.device, entry.fields["csr"], entry.fields["kind"]),
            ("w1", name, "first"),
        )
        self.assertEqual(entry.fields["not_after"], 365 * 86400.0)
        self.assertEqual(fleet.entries("kube.csr-approved"), [])
        self.assertIsNotNone(fleet.kubelet("w1").retired_at)
        self.assertEqual(fleet.status("w1"), DeviceStatus.DECOMMISSIONING)

    def test_afterRetirement_mirroredAsWarning(self) -> None:
        """[R1] kube.csr-approved-after-retirement is a warning in NetBox."""
        from fleetd.netbox.mirror import kindOf

        self.assertEqual(kindOf("kube.csr-approved-after-retirement"), "warning")
