"""
How C{[tinkerbell]} is wired into the daemon (issue 28): the service only
when configured, and the one Workflow watch telling it what happens to
the Workflows, in its namespace, without feeding boot completion unless
C{tink.workflow_state = "kubernetes"} asks for that too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.assembly import tinkerbellObjects
from fleetd.config import TinkSettings, loadSettings
from fleetd.testing.kube import FakeKube
from fleetd.tink.service import TinkProxy
from fleetd.tinkerbell.service import TinkerbellService
from tests.kubesupport import KubeFleet
from tests.support import exposedMetrics, ruleMetrics, writeConfig
from tests.test_tinkerbell_config import CLASS, tables
from tests.tinksupport import MAC, Site


class Observer:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def workflowSeen(self, workflow: dict[str, Any]) -> None:
        self.seen.append(("seen", workflow["metadata"]["name"]))

    def workflowDeleted(self, workflow: dict[str, Any]) -> None:
        self.seen.append(("deleted", workflow["metadata"]["name"]))

    def workflowsListed(self, workflows: list[dict[str, Any]]) -> None:
        self.seen.append(("listed", len(workflows)))


class WatchWiringTests(SynchronousTestCase):
    def proxy(
        self, settings: TinkSettings, observer: Observer
    ) -> tuple[TinkProxy, FakeKube, Site]:
        site = Site(self)
        fleet = site.fleet
        fake = FakeKube(fleet.clock)
        proxy = TinkProxy(
            fleet.clock,
            settings,
            idleTimeout=30.0,
            registry=CollectorRegistry(),
            inventory=fleet.inventory,
            runs=fleet.registry,
            runner=fleet.runner,
            journal=fleet.journal,
            alerts=fleet.alerts,
            kube=fake.client(),
            objects=("tink-system", observer),
        )
        self.successResultOf(Deferred.fromCoroutine(proxy.load()))
        fake.flush()
        return proxy, fake, site

    def test_objectsOnly_theirNamespaceWatched_noBootSignal(self) -> None:
        """With [tinkerbell] and workflow_state off, its namespace's
        Workflows are watched for the objects' observer alone: a Workflow's
        end reaches no boot completion."""
        observer = Observer()
        proxy, fake, site = self.proxy(TinkSettings(), observer)
        self.assertIn(
            "/apis/tinkerbell.org/v1alpha1/namespaces/tink-system/workflows",
            [p for _, p in fake.calls],
        )
        fake.addWorkflow("tink-system", "wf", MAC, state="RUNNING")
        fake.setWorkflowState("tink-system", "wf", "SUCCESS")
        fake.deleteWorkflow("tink-system", "wf")
        self.assertEqual(
            observer.seen,
            [("listed", 0), ("seen", "wf"), ("seen", "wf"), ("deleted", "wf")],
        )
        self.assertNotIn("boot.rebooting", site.events())
        d = proxy.stop()
        fake.flush()
        self.successResultOf(d)

    def test_both_bootSignalAndObserver(self) -> None:
        """With workflow_state = kubernetes too, both hear the one watch."""
        observer = Observer()
        settings = TinkSettings(workflow_state="kubernetes", workflow_namespace=None)
        proxy, fake, site = self.proxy(settings, observer)
        fake.addWorkflow("ns", "wf", MAC, state="RUNNING")
        fake.setWorkflowState("ns", "wf", "SUCCESS")
        self.assertIn("boot.rebooting", site.events())
        self.assertIn(("seen", "wf"), observer.seen)
        d = proxy.stop()
        fake.flush()
        self.successResultOf(d)


class AssemblyTests(SynchronousTestCase):
    def test_onlyWithTheTable(self) -> None:
        """The service exists with [tinkerbell] only, under the parent given."""
        fleet = KubeFleet(self)
        self.addCleanup(fleet.stopKube)
        parent = MultiService()
        kinds: list[object] = []
        for overrides in ({}, tables({"worker-g3": CLASS})):
            settings = loadSettings(writeConfig(Path(self.mktemp()), overrides))
            found = tinkerbellObjects(
                settings,
                clock=fleet.clock,
                kube=fleet.kube,
                journal=fleet.journal,
                runner=fleet.runner,
                runs=fleet.registry,
                registry=CollectorRegistry(),
                parent=parent,
            )
            kinds.append(None if found is None else type(found.service))
        self.assertEqual(kinds, [None, TinkerbellService])
        self.assertEqual(len(list(parent)), 1)

    def test_everyRuleMetric_exposed(self) -> None:
        """Every C{fleetd_tinkerbell_} metric an alert rule names is on the
        registry once [tinkerbell] is set (the daemons of test_daemon and
        test_census run without it, and leave these out)."""

        from prometheus_client import generate_latest

        fleet = KubeFleet(self)
        self.addCleanup(fleet.stopKube)
        registry = CollectorRegistry()
        settings = loadSettings(
            writeConfig(Path(self.mktemp()), tables({"worker-g3": CLASS}))
        )
        tinkerbellObjects(
            settings,
            clock=fleet.clock,
            kube=fleet.kube,
            journal=fleet.journal,
            runner=fleet.runner,
            runs=fleet.registry,
            registry=registry,
            parent=MultiService(),
        )
        text = generate_latest(registry).decode()
        exposed = exposedMetrics(text)
        used = ruleMetrics("fleetd_tinkerbell_")
        self.assertTrue(used)
        self.assertEqual(used - exposed, set())
