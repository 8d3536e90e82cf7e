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
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import DeviceStatus
from fleetd.kube.csr import Unreadable, readCSR
from fleetd.kube.watcher import CSRWatcher
from fleetd.testing.kube import csrPEM, malformedBasicConstraintsPEM
from tests.kubesupport import KubeFleet, device


def _pending(fleet: KubeFleet) -> list[tuple[str, str]]:
    return [
        (e.fields["csr"], e.fields["reason"])
        for e in fleet.entries("kube.csr-left-pending")
    ]


class MalformedCSRTests(SynchronousTestCase):
    """[K2] A CSR fleetd cannot read never stops approvals for other nodes."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"))
        self.run1, self.run2 = self.fleet.provision(
            device("w1", "SER1"), device("w2", "SER2")
        )
        self.bearer1 = self.fleet.bearer(self.run1.run)
        self.bearer2 = self.fleet.bearer(self.run2.run)
        self.fleet.fetch(self.run1.code)

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
