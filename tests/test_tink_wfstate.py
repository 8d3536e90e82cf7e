"""
Boot completion's second "done" signal: the Workflow's state read from
Kubernetes (issue 10, item 3) [B1] [B2], against the strict kube fake,
with the proxy's observation chain and the real run registry and journal
over one task.Clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, TinkSettings, loadSettings
from fleetd.inventory.model import validateDevice
from fleetd.runs.alerts import HOOKOS
from fleetd.testing.kube import FakeKube
from fleetd.tink import wfstate
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.service import TinkProxy
from fleetd.tink.wfstate import (
    RETRY_UNMAPPED,
    UNMAPPED_FOR,
    WorkflowStateWatch,
    agentIds,
    hasEnded,
)
from tests.support import writeConfig
from tests.tinksupport import MAC, RUNNING, SUCCESS, Site

NS = "ns"  # the proxy's agent workflow is "ns/wf" (tests.tinksupport)


class KubeSite(Site):
    """L{Site} plus a fake cluster whose Workflows are watched."""

    fake: FakeKube

    def build(self) -> None:
        super().build()
        if not hasattr(self, "fake"):
            self.fake = FakeKube(self.fleet.clock)
        self.client = self.fake.client()
        self.registry = CollectorRegistry()
        self.watch = WorkflowStateWatch(
            self.fleet.clock,
            self.client,
            NS,
            self.watcher._devices,
            self.watcher,
            registry=self.registry,
            timeoutSeconds=100,
        )
        self.test.addCleanup(self.stop)

    def start(self) -> None:
        self.watch.start()
        self.fake.flush()

    def stop(self) -> None:
        self.watch.stop()
        self.fake.flush()

    def restart(self) -> None:
        self.stop()
        super().restart()

    def agentActions(self, connection: int) -> None:
        """The agent runs the workflow's two actions, both SUCCESS, and
        stops short of its next GetAction."""
        for action in ("a0", "a1"):
            response = agent.ActionResponse(workflow_id="ns/wf", action_id=action)
            self.call(
                "GetAction", connection, agent.ActionRequest(agent_id=MAC), (response,)
            )
            for state in (RUNNING, SUCCESS):
                self.agentReport(connection, action, state)

    def agentReport(self, connection: int, action: str, state: int) -> None:
        report = agent.ActionStatusRequest(
            workflow_id="ns/wf",
            agent_id=MAC,
            action_id=action,
            action_state=state,  # type: ignore[arg-type]
        )
        self.call(
            "ReportActionStatus", connection, report, (agent.ActionStatusResponse(),)
        )

    def rebooting(self) -> list[Any]:
        entries = self.test.successResultOf(self.fleet.journal.query())
        return [e.fields for e in entries if e.event == "boot.rebooting"]

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


class KubernetesSignalTests(SynchronousTestCase):
    """The Workflow's state as a "done" signal, alone or with the proxy's."""

    def tearDown(self) -> None:
        self.flushLoggedErrors()

    def test_kubernetesAlone_rebooting(self) -> None:
        """[B1] A Workflow reaching POST (then SUCCESS) in Kubernetes, with
        nothing seen on the wire, ends the run's workflow: rebooting,
        journaled once with the signal named; the node's return after that
        is the same [B2] as after the proxy's signal."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        self.assertEqual(site.events(), ["run.provisioned"])
        site.fake.setWorkflowState(NS, "wf", "POST")
        site.fake.setWorkflowState(NS, "wf", "SUCCESS")
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])
        self.assertEqual(
            site.rebooting(), [{"workflow": "ns/wf", "signal": "kubernetes"}]
        )
        site.fleet.clock.advance(120)
        site.agentPoll(connection=2)
        self.assertEqual(site.events().count("boot.hookos-after-install"), 1)
        self.assertTrue(site.fleet.alerts.active(HOOKOS, "w1"))
        self.assertEqual(site.metric("fleetd_tink_workflow_state_ends_total"), 1.0)

    def test_v012Spelling_rebooting(self) -> None:
        """[B1] tink v0.12's Workflow (STATE_ prefix, the worker id in
        status.tasks[].worker) is read the same way."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC.upper(), state="STATE_RUNNING", v012=True)
        site.fake.setWorkflowState(NS, "wf", "STATE_SUCCESS")
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])

    def test_proxyThenKubernetes_oneEntry(self) -> None:
        """[B2] Both signals, the proxy's first: one transition, one
        boot.rebooting; Kubernetes' POST and SUCCESS arriving late, even
        after the node came back to HookOS, change nothing."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        site.agentWorkflow(connection=1)
        site.fleet.clock.advance(120)
        site.agentPoll(connection=2)  # back in HookOS
        site.fake.setWorkflowState(NS, "wf", "POST")
        site.fake.setWorkflowState(NS, "wf", "SUCCESS")
        self.assertEqual(
            site.events(),
            ["run.provisioned", "boot.rebooting", "boot.hookos-after-install"],
        )
        self.assertEqual(site.rebooting(), [{"workflow": "ns/wf", "signal": "proxy"}])

    def test_kubernetesThenProxy_oneEntry(self) -> None:
        """[B2] Both signals, Kubernetes' first: one transition, one
        boot.rebooting; the proxy's FAILED_PRECONDITION after it changes
        nothing, and the return to HookOS is judged as after the proxy's."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        site.agentActions(connection=1)
        site.fake.setWorkflowState(NS, "wf", "POST")
        site.agentPoll(connection=1, status=9)  # what the proxy infers "done" from
        self.assertEqual(
            site.rebooting(), [{"workflow": "ns/wf", "signal": "kubernetes"}]
        )
        site.fleet.clock.advance(120)
        site.agentPoll(connection=1)  # the connection it ended on: no restart
        self.assertNotIn("boot.hookos-after-install", site.events())
        site.agentPoll(connection=2)
        self.assertEqual(
            site.events(),
            ["run.provisioned", "boot.rebooting", "boot.hookos-after-install"],
        )

    def test_failedOrTimeout_notDone(self) -> None:
        """[B1] FAILED and TIMEOUT (and the states before the end) do not end
        the workflow: nothing is journaled."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="PREPARING")
        for state in ("PENDING", "RUNNING", "FAILED"):
            site.fake.setWorkflowState(NS, "wf", state)
        site.fake.addWorkflow(NS, "wf2", MAC, state="RUNNING")
        site.fake.setWorkflowState(NS, "wf2", "TIMEOUT")
        site.fake.addWorkflow(NS, "wf3", MAC, state="STATE_FAILED", v012=True)
        self.assertEqual(site.events(), ["run.provisioned"])

    def test_otherNamespaceOrUnknownAgent_ignored(self) -> None:
        """Workflows outside the namespace, and agents that map to no device,
        say nothing."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow("elsewhere", "wf", MAC, state="RUNNING")
        site.fake.setWorkflowState("elsewhere", "wf", "SUCCESS")
        site.fake.addWorkflow(NS, "stranger", "52:54:00:ff:ff:ff", state="RUNNING")
        site.fake.setWorkflowState(NS, "stranger", "SUCCESS")
        self.assertEqual(site.events(), ["run.provisioned"])

    def test_listAtStart_olderWorkflowIgnored(self) -> None:
        """[B1] At start the list shows Workflows that ended before: one
        created before the device's current run belongs to an older run and
        is ignored; one created after it counts."""
        site = KubeSite(self)
        site.fleet.clock.advance(5)
        site.fake.addWorkflow(NS, "old", MAC, state="SUCCESS")
        site.fleet.clock.advance(5)
        site.fleet.provision(site.device)  # the current run is newer
        site.start()
        self.assertNotIn("boot.rebooting", site.fleet.events("w1"))
        site.fleet.clock.advance(5)
        site.stop()
        site.fake.addWorkflow(NS, "new", MAC, state="SUCCESS")
        site.build()
        site.start()
        self.assertEqual(site.fleet.events("w1").count("boot.rebooting"), 1)
        self.assertEqual(site.rebooting()[-1]["workflow"], "ns/new")

    def test_restart_noSecondEntry(self) -> None:
        """[B2] After a restart the list shows the ended Workflow again; the
        run's journal already holds its end (and the node's return to
        HookOS since), so nothing more is written."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        site.fake.setWorkflowState(NS, "wf", "SUCCESS")
        site.fleet.clock.advance(120)
        site.agentPoll(connection=2)  # back in HookOS: returned
        site.restart()
        site.start()
        site.agentReport(1, "a1", SUCCESS)  # the proxy's late signal too
        site.agentPoll(connection=1, status=9)
        self.assertEqual(site.events().count("boot.rebooting"), 1)
        self.assertEqual(site.events().count("boot.hookos-after-install"), 1)

    def test_rerun_countsAgain(self) -> None:
        """[B1] The same Workflow run again (an action of it started on the
        wire) ends again: its next end counts."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        site.fake.setWorkflowState(NS, "wf", "SUCCESS")
        site.fake.setWorkflowState(NS, "wf", "RUNNING")
        site.agentWorkflow(connection=1)
        self.assertEqual(site.events().count("boot.rebooting"), 2)


class WatchFailureTests(SynchronousTestCase):
    """The watch's failures never reach the proxy [B1]."""

    def tearDown(self) -> None:
        self.flushLoggedErrors()

    def test_watch410_resumesMissingNothing(self) -> None:
        """A watch whose version was compacted away (410) lists again; a
        Workflow that ended in the gap is seen as ended, once."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        site.fake.reachable = False  # the API server restarts...
        site.fake.closeWatches()
        site.fake.setWorkflowState(NS, "wf", "SUCCESS")
        site.fake.compact()  # ...and its history is gone
        site.fake.reachable = True
        site.fleet.clock.advance(1)
        site.fake.flush()
        self.assertEqual(site.watch.loop.lists, 2)
        self.assertEqual(
            site.metric("fleetd_tink_workflow_watch_errors_total", reason="expired"),
            1.0,
        )
        self.assertEqual(site.metric("fleetd_tink_workflow_watch_up"), 1.0)
        self.assertEqual(site.events().count("boot.rebooting"), 1)

    def test_apiDown_metricNoCrash_proxyWorks(self) -> None:
        """API down: counted, the watch gauge at 0, retried with backoff, no
        crash; the proxy's own signal still ends the workflow; once the API
        is back the watch resumes."""
        site = KubeSite(self)
        site.fake.reachable = False
        site.start()
        site.fleet.clock.advance(1)
        self.assertEqual(
            site.metric(
                "fleetd_tink_workflow_watch_errors_total", reason="unavailable"
            ),
            2.0,
        )
        self.assertEqual(site.metric("fleetd_tink_workflow_watch_up"), 0.0)
        site.agentWorkflow(connection=1)
        self.assertEqual(site.rebooting(), [{"workflow": "ns/wf", "signal": "proxy"}])
        site.fake.reachable = True
        site.fleet.clock.advance(2)
        site.fake.flush()
        self.assertEqual(site.metric("fleetd_tink_workflow_watch_up"), 1.0)
        site.stop()
        self.assertEqual(site.fleet.clock.getDelayedCalls(), [])

    def test_forbiddenAndNoCRD_counted(self) -> None:
        """403 (RBAC missing) and 404 (no Workflow CRD) are counted by reason
        and retried, never raised."""
        site = KubeSite(self)
        site.fake.failNext("GET", "/workflows", 403, "Forbidden")
        site.fake.workflowsInstalled = False
        site.start()
        site.fleet.clock.advance(1)
        site.fake.flush()
        self.assertEqual(
            site.metric("fleetd_tink_workflow_watch_errors_total", reason="forbidden"),
            1.0,
        )
        self.assertEqual(
            site.metric("fleetd_tink_workflow_watch_errors_total", reason="not-found"),
            1.0,
        )
        site.fake.workflowsInstalled = True
        site.fleet.clock.advance(2)
        site.fake.flush()
        self.assertEqual(site.metric("fleetd_tink_workflow_watch_up"), 1.0)

    def test_journalRefuses_nothingTwice(self) -> None:
        """[J1] When the journal refuses the end's entry nothing changes (the
        run is not C{rebooting}) and the failure is logged; the workflow's
        end told again later (by the proxy) is recorded, once."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        from tests.faultsupport import Faults

        faults = Faults(site.fleet)
        faults.inject("journal")
        site.fake.setWorkflowState(NS, "wf", "POST")
        self.assertEqual(site.events(), ["run.provisioned"])
        boot = site.tracker._byDevice[site.device.name]
        self.assertEqual(boot.machine.describe(), "waiting")
        self.assertEqual(len(self.flushLoggedErrors()), 1)
        faults.clear()
        site.fake.setWorkflowState(NS, "wf", "SUCCESS")  # no new end: no entry
        self.assertEqual(site.events(), ["run.provisioned"])
        # The other signal (the proxy's) for that workflow still counts.
        site.tracker.done(site.device.name, f"{NS}/wf", 1)
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])
        self.assertEqual(boot.machine.describe(), "rebooting")
        site.tracker.done(site.device.name, f"{NS}/wf", 1)  # again: nothing
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])


class WiringTests(SynchronousTestCase):
    """C{tink.workflow_state}: off by default, then nothing is watched."""

    def proxy(self, settings: TinkSettings) -> tuple[TinkProxy, FakeKube, Site]:
        site = Site(self)
        fleet = site.fleet
        fake = FakeKube(fleet.clock)
        client = fake.client()
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
            kube=client,
        )
        self.successResultOf(Deferred.fromCoroutine(proxy.load()))
        fake.flush()
        return proxy, fake, site

    def test_off_nothingWatched(self) -> None:
        """With workflow_state off (the default) fleetd makes no Workflow
        call even with a cluster configured."""
        proxy, fake, _ = self.proxy(TinkSettings())
        self.assertIsNone(proxy.workflowState)
        self.assertEqual([p for _, p in fake.calls if "tinkerbell" in p], [])
        self.successResultOf(proxy.stop())

    def test_kubernetes_watchedAndStopped(self) -> None:
        """[B1] With workflow_state = kubernetes the namespace's Workflows are
        listed and watched from load on, and stop leaves no timer."""
        settings = TinkSettings(workflow_state="kubernetes", workflow_namespace=NS)
        proxy, fake, site = self.proxy(settings)
        self.assertEqual(
            [p for _, p in fake.calls if "tinkerbell" in p],
            ["/apis/tinkerbell.org/v1alpha1/namespaces/ns/workflows"] * 2,
        )
        fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        fake.setWorkflowState(NS, "wf", "SUCCESS")
        self.assertIn("boot.rebooting", site.events())
        d = proxy.stop()
        fake.flush()
        self.successResultOf(d)
        self.assertEqual(site.fleet.clock.getDelayedCalls(), [])

    def test_stopService_listenerAfterDrain(self) -> None:
        """[A4] The proxy stops its own listener (fleetd's service has no
        special case for it): only once the connections drained after
        GOAWAY, so calls in flight finish before the port closes."""
        proxy, _, _ = self.proxy(TinkSettings())
        draining: Deferred[None] = Deferred()
        proxy.factory.drain = lambda: draining  # type: ignore[method-assign]
        listener = Service()
        listener.setServiceParent(proxy)
        proxy.startService()
        stopped = proxy.stopService()
        self.assertFalse(proxy.running)
        self.assertTrue(listener.running)
        self.assertNoResult(stopped)
        draining.callback(None)
        self.successResultOf(stopped)
        self.assertFalse(listener.running)


class SettingsTests(SynchronousTestCase):
    KUBE = {"api": "https://kube.test:6443", "token_file": "kube-token"}

    def load(self, tink: dict[str, Any], kube: bool = True) -> Any:
        tables: dict[str, Any] = {"tink": {"upstream": "tcp:h:1", **tink}}
        if kube:
            tables["kubernetes"] = self.KUBE
        return loadSettings(writeConfig(Path(self.mktemp()), tables)).tink

    def error(self, tink: dict[str, Any], kube: bool = True) -> ConfigError:
        e: ConfigError = self.assertRaises(ConfigError, self.load, tink, kube)
        return e

    def test_defaultOff(self) -> None:
        """workflow_state is off unless asked for."""
        s = self.load({}, kube=False)
        self.assertEqual((s.workflow_state, s.workflow_namespace), ("off", None))

    def test_kubernetes_namespaceOrAll(self) -> None:
        """A namespace name, or "*" for all namespaces."""
        s = self.load({"workflow_state": "kubernetes", "workflow_namespace": "tink"})
        self.assertEqual(
            (s.workflow_state, s.workflow_namespace), ("kubernetes", "tink")
        )
        s = self.load({"workflow_state": "kubernetes", "workflow_namespace": "*"})
        self.assertIsNone(s.workflow_namespace)

    def test_badValues_nameKey(self) -> None:
        """Unknown values, a missing or malformed namespace, a namespace
        without the feature, the feature without [kubernetes], and typos
        stop start-up naming the key."""
        cases = [
            ({"workflow_state": "k8s"}, True, "tink.workflow_state"),
            ({"workflow_state": "kubernetes"}, True, "tink.workflow_namespace"),
            (
                {"workflow_state": "kubernetes", "workflow_namespace": "Tink_NS"},
                True,
                "tink.workflow_namespace",
            ),
            ({"workflow_namespace": "tink"}, True, "tink.workflow_namespace"),
            (
                {"workflow_state": "kubernetes", "workflow_namespace": "tink"},
                False,
                "tink.workflow_state",
            ),
            ({"workflow_sate": "kubernetes"}, True, "tink.workflow_sate"),
        ]
        for tink, kube, key in cases:
            self.assertEqual(self.error(tink, kube).key, key, json.dumps(tink))


class ReadingTests(SynchronousTestCase):
    def test_hasEnded(self) -> None:
        """POST and SUCCESS, either spelling, end a workflow; nothing else."""
        for state in ("POST", "SUCCESS", "STATE_POST", "STATE_SUCCESS", "post"):
            self.assertTrue(hasEnded(state), state)
        others: tuple[object, ...] = ("RUNNING", "FAILED", "STATE_TIMEOUT", "", None, 4)
        for other in others:
            self.assertFalse(hasEnded(other), repr(other))

    def test_agentIds_order(self) -> None:
        """status.agentID first, then currentState's, then the tasks'."""
        workflow = {
            "status": {
                "agentID": "a",
                "currentState": {"agentID": "b"},
                "tasks": [{"agentID": "c"}, {"worker": "d"}, "junk"],
            }
        }
        self.assertEqual(agentIds(workflow), ["a", "b", "c", "d"])
        self.assertEqual(agentIds({}), [])


class RobustnessTests(SynchronousTestCase):
    def test_bugInHandling_loggedWatchGoesOn(self) -> None:
        """A Workflow whose handling raises (a bug) is logged; the watch and
        the next Workflows go on."""
        site = KubeSite(self)
        site.start()
        real = site.watcher.workflowFinished
        calls: list[str] = []

        def once(device: str, workflow: str, createdAt: float | None) -> None:
            calls.append(workflow)
            if len(calls) == 1:
                raise RuntimeError("boom")
            real(device, workflow, createdAt)

        site.watch.ends = type("Ends", (), {"workflowFinished": staticmethod(once)})()
        site.fake.addWorkflow(NS, "a", MAC, state="RUNNING")
        site.fake.setWorkflowState(NS, "a", "SUCCESS")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        site.fake.addWorkflow(NS, "wf", MAC, state="RUNNING")
        site.fake.setWorkflowState(NS, "wf", "SUCCESS")
        self.assertEqual(calls, ["ns/a", "ns/wf"])
        self.assertEqual(site.watch.loop.lists, 1)
        self.assertEqual(site.events().count("boot.rebooting"), 1)


MAC2 = "52:54:00:12:34:57"


class UnmappedAgentTests(SynchronousTestCase):
    """
    An end whose agent id the proxy's device index does not know yet (the
    device was added since the index last loaded) is kept and tried again,
    not dropped.
    """

    def tearDown(self) -> None:
        self.flushLoggedErrors()

    def addSecondDevice(self, site: KubeSite) -> None:
        w2 = validateDevice(
            name="w2",
            serial="SER2",
            uuid="00000000-0000-4000-8000-000000000002",
            macs=[MAC2],
            device_class="worker",
        )
        site.fleet.add(w2)
        site.fleet.provision(w2)

    def test_deviceAddedSince_endCountsOnceIndexed(self) -> None:
        """[B1] The end is told once the index has the MAC: one entry."""
        site = KubeSite(self)
        site.start()
        self.addSecondDevice(site)
        site.fake.addWorkflow(NS, "wf2", MAC2, state="RUNNING")
        site.fake.setWorkflowState(NS, "wf2", "SUCCESS")
        self.assertNotIn("boot.rebooting", site.events())  # not indexed yet
        site.fleet.clock.advance(RETRY_UNMAPPED)  # the index loads again...
        site.fleet.clock.advance(RETRY_UNMAPPED)  # ...and the end is told
        self.assertEqual(
            site.rebooting(), [{"workflow": "ns/wf2", "signal": "kubernetes"}]
        )
        site.fleet.clock.advance(UNMAPPED_FOR)
        self.assertEqual(len(site.rebooting()), 1)
        self.assertEqual(site.metric("fleetd_tink_workflow_state_ends_total"), 1.0)

    def test_neverMapped_droppedAfterAWhile(self) -> None:
        """An agent that never maps is tried for UNMAPPED_FOR, then dropped
        with a warning; nothing is journaled and no timer is left."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "stranger", "52:54:00:ff:ff:ff", state="RUNNING")
        with capturedLogs() as events:
            site.fake.setWorkflowState(NS, "stranger", "SUCCESS")
            site.fleet.clock.advance(UNMAPPED_FOR + RETRY_UNMAPPED)
        formats = [e.get("log_format", "") for e in events]
        self.assertTrue(
            any(f.startswith("tink.workflow-state.unmapped-dropped") for f in formats)
        )
        self.assertEqual(site.events(), ["run.provisioned"])
        self.assertEqual(site.watch._unmapped, {})
        self.assertIsNone(site.watch._retry)

    def test_runningAgain_pendingEndForgotten(self) -> None:
        """A kept end whose Workflow runs again is not told later."""
        site = KubeSite(self)
        site.start()
        self.addSecondDevice(site)
        site.fake.addWorkflow(NS, "wf2", MAC2, state="RUNNING")
        site.fake.setWorkflowState(NS, "wf2", "SUCCESS")
        site.fake.setWorkflowState(NS, "wf2", "RUNNING")
        site.fleet.clock.advance(RETRY_UNMAPPED)
        site.fleet.clock.advance(RETRY_UNMAPPED)
        self.assertEqual(site.rebooting(), [])

    def test_endBeforeRunProvisioned_notCredited(self) -> None:
        """[B1] An end kept for an unknown agent is not credited to a run
        provisioned after its Workflow was made (it belongs to no run of
        that device): nothing is journaled."""
        site = KubeSite(self)
        site.start()
        site.fake.addWorkflow(NS, "wf2", MAC2, state="RUNNING")
        site.fake.setWorkflowState(NS, "wf2", "SUCCESS")
        site.fleet.clock.advance(5)
        self.addSecondDevice(site)
        site.fleet.clock.advance(RETRY_UNMAPPED)
        site.fleet.clock.advance(RETRY_UNMAPPED)
        self.assertEqual(site.rebooting(), [])
        self.assertEqual(site.watch._unmapped, {})  # told, and refused there

    def test_stop_noTimerLeft(self) -> None:
        """Stopping forgets kept ends and leaves no timer, also when a late
        event arrives after the stop."""
        site = KubeSite(self)
        site.start()
        workflow = site.fake.addWorkflow(NS, "stranger", "52:54:00:ff:ff:ff")
        site.fake.setWorkflowState(NS, "stranger", "SUCCESS")
        retry = site.watch._retryUnmapped
        self.assertIn(retry, _pending(site))
        site.stop()
        late = {**workflow, "metadata": {**workflow["metadata"], "uid": "late"}}
        late["status"] = {**workflow.get("status", {}), "state": "SUCCESS"}
        site.watch._seen(late)
        self.assertNotIn(retry, _pending(site))
        self.assertEqual(site.watch._unmapped, {})

    def test_deletedOrGoneFromList_forgotten(self) -> None:
        """A kept end whose Workflow is deleted (seen, or missing from a
        later list) is forgotten."""
        site = KubeSite(self)
        site.start()
        for name in ("a", "b"):
            site.fake.addWorkflow(NS, name, "52:54:00:ff:ff:0" + name)
            site.fake.setWorkflowState(NS, name, "SUCCESS")
        self.assertEqual(len(site.watch._unmapped), 2)
        site.fake.deleteWorkflow(NS, "a")
        self.assertEqual(len(site.watch._unmapped), 1)
        (kept,) = site.watch._unmapped
        site.watch._listed([])  # a list after a gap: "b" is gone too
        self.assertNotIn(kept, site.watch._unmapped)

    def test_atMostMaxKept_oldestDropped(self) -> None:
        """At most MAX_UNMAPPED ends are kept: the oldest goes, with a
        warning."""
        self.patch(wfstate, "MAX_UNMAPPED", 2)
        site = KubeSite(self)
        site.start()
        with capturedLogs() as events:
            for name in ("a", "b", "c"):
                site.fake.addWorkflow(NS, name, "52:54:00:ff:ff:0" + name)
                site.fake.setWorkflowState(NS, name, "SUCCESS")
        names = sorted(end.name for end in site.watch._unmapped.values())
        self.assertEqual(names, ["ns/b", "ns/c"])
        dropped = [
            e["workflow"]
            for e in events
            if e.get("log_format", "").startswith("tink.workflow-state.unmapped-drop")
        ]
        self.assertEqual(dropped, ["ns/a"])

    def test_keptEnd_agentIdsUpdated(self) -> None:
        """A kept end is tried with the Workflow as last seen: agent ids
        that show up in a later event count."""
        site = KubeSite(self)
        site.start()
        self.addSecondDevice(site)
        site.fake.addWorkflow(NS, "wf2", "52:54:00:ff:ff:ff")
        site.fake.setWorkflowState(NS, "wf2", "SUCCESS")
        self.assertEqual(len(site.watch._unmapped), 1)
        (kept,) = site.watch._unmapped.values()
        later = {**kept.workflow, "status": {**kept.workflow["status"]}}
        later["status"]["agentID"] = MAC2
        site.watch._seen(later)
        site.fleet.clock.advance(RETRY_UNMAPPED)
        site.fleet.clock.advance(RETRY_UNMAPPED)
        self.assertEqual(
            site.rebooting(), [{"workflow": "ns/wf2", "signal": "kubernetes"}]
        )


def _pending(site: KubeSite) -> list[Any]:
    """What the site's clock will call."""
    return [getattr(c, "func", None) for c in site.fleet.clock.getDelayedCalls()]
