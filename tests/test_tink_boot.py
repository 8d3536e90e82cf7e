"""
Boot completion [B1] [B2] [B3]: decoded Tinkerbell calls (both wire
generations) through the observer, the watcher's rules, and the per-run
machine, over the real run registry, journal and alerts with a task.Clock.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.fleet.status import StatusService
from fleetd.runs.alerts import HOOKOS
from fleetd.tink.boot import BootEffects, BootMachine
from fleetd.tink.completion import BootTracker
from fleetd.tink.observe import (
    OLD,
    MessageReader,
    guessReportGeneration,
)
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.proto import tink_v012_pb2 as v012
from tests.faultsupport import Faults
from tests.tinksupport import MAC, SUCCESS, P, Site, frame


class AgentBootTests(SynchronousTestCase):
    """tink-agent's workflow, then what the node boots [B1] [B2] [B3]."""

    def test_success_rebootingNotDone(self) -> None:
        """[B1] SUCCESS then FAILED_PRECONDITION on the next GetAction is the
        workflow's end: journaled as rebooting, nothing more, no alert."""
        site = Site(self)
        site.agentWorkflow(connection=1)
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])
        self.assertEqual(site.fleet.alerts.openFor("w1"), [])

    def test_notFoundBetweenTasks_notDone(self) -> None:
        """[B1] NOT_FOUND after a SUCCESS (the last action of a task) is not
        the end of the workflow."""
        site = Site(self)
        report = agent.ActionStatusRequest(
            workflow_id="ns/wf", agent_id=MAC, action_id="a0", action_state=SUCCESS
        )
        site.call("ReportActionStatus", 1, report, (agent.ActionStatusResponse(),))
        site.agentPoll(1, status=5)
        self.assertEqual(site.events(), ["run.provisioned"])

    def test_reportOnFreshConnection_generationFromWire(self) -> None:
        """[B1] A SUCCESS report on a connection that has carried no other
        method (the agent reconnected) is still read as tink-agent's, from
        its fields' wire types."""
        site = Site(self)
        report = agent.ActionStatusRequest(
            workflow_id="ns/wf", agent_id=MAC, action_id="a9", action_state=SUCCESS
        )
        site.call("ReportActionStatus", 7, report, (agent.ActionStatusResponse(),))
        site.agentPoll(8, status=9)
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])

    def test_refusedReport_notCounted(self) -> None:
        """[B1] A SUCCESS report tink-server refused says nothing: the next
        FAILED_PRECONDITION is not the workflow's end."""
        site = Site(self)
        report = agent.ActionStatusRequest(
            workflow_id="ns/wf", agent_id=MAC, action_id="a0", action_state=SUCCESS
        )
        site.call("ReportActionStatus", 1, report, (), status=5)
        site.agentPoll(1, status=9)
        self.assertEqual(site.events(), ["run.provisioned"])

    def test_pxeFirstReturn_journaledOncePerRun(self) -> None:
        """[B2] [V6] The agent polling from a fresh connection after the
        workflow's end, configuration unread: journaled once per run (also
        across a restart), alert up while polls continue, then held."""
        site = Site(self)
        site.agentWorkflow(connection=1)
        site.fleet.clock.advance(30)
        site.agentPoll(connection=2)  # too soon for a reboot: a reconnect
        self.assertNotIn("boot.hookos-after-install", site.events())
        site.fleet.clock.advance(90)
        site.agentPoll(connection=1)  # the old connection: not a restart
        self.assertNotIn("boot.hookos-after-install", site.events())
        site.agentPoll(connection=3)
        self.assertEqual(site.events().count("boot.hookos-after-install"), 1)
        self.assertEqual(
            site.fleet.alerts.openFor("w1"), ["FleetNodeBootedHookOSAfterInstall"]
        )
        for connection in range(4, 10):
            site.fleet.clock.advance(600)
            site.agentPoll(connection)
        site.restart()
        site.agentPoll(connection=1)
        self.assertEqual(site.events().count("boot.hookos-after-install"), 1)
        self.assertTrue(site.fleet.alerts.active(HOOKOS, "w1"))
        site.fleet.clock.advance(site.fleet.hold + 1)
        self.assertFalse(site.fleet.alerts.active(HOOKOS, "w1"))

    def test_netbootDesired_silent(self) -> None:
        """[B3] A run whose desired_action is netboot expects the return to
        HookOS: no journal entry as a failure, no alert."""
        site = Site(self, action="netboot")
        site.agentWorkflow(connection=1)
        site.fleet.clock.advance(120)
        for connection in range(2, 6):
            site.agentPoll(connection)
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])
        self.assertEqual(site.fleet.alerts.openFor("w1"), [])

    def test_configFetched_done(self) -> None:
        """[B1] Talos fetching the configuration completes the boot; polls
        after that raise nothing."""
        site = Site(self)
        site.agentWorkflow(connection=1)
        site.fleet.fetch(site.run.code)
        site.fleet.clock.advance(120)
        site.agentPoll(connection=2)
        self.assertNotIn("boot.hookos-after-install", site.events())
        self.assertEqual(site.fleet.alerts.openFor("w1"), [])

    def test_restartThenFetch_doneWithoutEarlierEvents(self) -> None:
        """[B1] After a restart, a run with no boot event yet gets its
        machine on the first one, a fetch included: a later workflow's end
        is then not taken for this run's install (issue 17 item 17: idle
        runs get no machine at start)."""
        site = Site(self)
        site.restart()
        site.fleet.fetch(site.run.code)
        site.agentWorkflow(connection=1)
        self.assertNotIn("boot.rebooting", site.events())

    def test_eventsBeforeTheTinkLoad_loadStillSucceeds(self) -> None:
        """
        A worker's call and a node's fetch after the runs loaded but before
        the Tink load restored the boot states do not fail that load (it
        did: NoTransition for a restore in a state past waiting, and
        fleetd never said ready): the events are newer than the history.
        """
        site = Site(self)
        site.agentWorkflow(connection=1)  # the history: rebooting
        fleet = site.fleet
        fleet.restart()
        tracker = BootTracker(
            clock=fleet.clock,
            runs=fleet.registry,
            runner=fleet.runner,
            journal=fleet.journal,
            alerts=fleet.alerts,
        )
        tracker.running("w1", "ns/wf2")  # before its load
        fleet.fetch(site.run.code)  # tracker.delivered, before its load
        self.successResultOf(Deferred.fromCoroutine(tracker.load(["w1"])))
        self.assertEqual(tracker._byDevice["w1"].machine.describe(), "done")

    def test_restartFetchThenEvent_machineStartsDone(self) -> None:
        """[B1] No machine is made on the delivery path: a run delivered
        before any event gets one on its first event, already done."""
        site = Site(self)
        site.restart()
        site.fleet.fetch(site.run.code)
        self.assertNotIn("w1", site.tracker._byDevice)
        site.agentPoll(connection=1)
        self.assertEqual(site.tracker._byDevice["w1"].machine.describe(), "done")

    def test_fetchAfterReturn_alertCleared(self) -> None:
        """[B2] Once the node boots its disk and fetches its configuration,
        the alert clears and the completion is journaled."""
        site = Site(self)
        site.agentWorkflow(connection=1)
        site.fleet.clock.advance(120)
        site.agentPoll(connection=2)
        self.assertTrue(site.fleet.alerts.active(HOOKOS, "w1"))
        site.fleet.fetch(site.run.code)
        self.assertFalse(site.fleet.alerts.active(HOOKOS, "w1"))
        self.assertIn("boot.completed", site.events())

    def test_newProvision_newRun(self) -> None:
        """[B2] The once-per-run rule is per run: a new provision's return is
        journaled again; the recovery provision clears the alert [V5]."""
        site = Site(self)
        site.agentWorkflow(connection=1)
        site.fleet.clock.advance(120)
        site.agentPoll(connection=2)
        site.fleet.provision(site.device)
        self.assertEqual(site.fleet.alerts.openFor("w1"), [])
        site.agentWorkflow(connection=3)
        site.fleet.clock.advance(120)
        site.agentPoll(connection=4)
        self.assertEqual(site.events().count("boot.hookos-after-install"), 2)

    def test_journalRefuses_noAlertThenOnce(self) -> None:
        """[J1] [B2] When the journal refuses the return's entry, no alert and
        no flag; the next poll journals it, once."""
        site = Site(self)
        faults = Faults(site.fleet)
        site.agentWorkflow(connection=1)
        site.fleet.clock.advance(120)
        faults.inject("journal")
        site.agentPoll(connection=2)
        self.assertFalse(site.fleet.alerts.active(HOOKOS, "w1"))
        faults.clear()
        site.agentPoll(connection=3)
        site.agentPoll(connection=4)
        self.assertTrue(site.fleet.alerts.active(HOOKOS, "w1"))
        self.assertEqual(site.events().count("boot.hookos-after-install"), 1)
        self.flushLoggedErrors()


class StatusTests(SynchronousTestCase):
    def test_status_namesPXEFirstReturn(self) -> None:
        """[B2] fleetctl status names the alert, says the node booted back
        into HookOS with its configuration unread, and how to fix it."""
        site = Site(self)
        site.agentWorkflow(connection=1)
        site.fleet.clock.advance(120)
        site.agentPoll(connection=2)
        service = StatusService(
            site.fleet.inventory,
            site.fleet.registry,
            site.fleet.alerts,
            site.fleet.journal,
        )
        report = self.successResultOf(Deferred.fromCoroutine(service.report("w1")))
        assert report is not None
        self.assertEqual(report.alerts, ["FleetNodeBootedHookOSAfterInstall"])
        self.assertIn("booted back into HookOS", report.state)
        self.assertIn("boot first", report.recovery or "")
        self.assertIn("boot.hookos-after-install", [e.event for e in report.journal])


class OldApiBootTests(SynchronousTestCase):
    """tink v0.9-v0.12 worker: the last action is known from the context [B1]."""

    def workflow(self, site: Site, upTo: int, connection: int = 1) -> None:
        request = v012.WorkflowContextRequest(worker_id=MAC)
        context = v012.WorkflowContext(
            workflow_id="ns/wf",
            current_worker=MAC,
            current_action="a0",
            current_action_index=0,
            total_number_of_actions=3,
        )
        site.call("GetWorkflowContexts", connection, request, (context,))
        actions = v012.WorkflowActionList(
            action_list=[
                v012.WorkflowAction(task_name="t", name=f"a{i}") for i in range(3)
            ]
        )
        site.call(
            "GetWorkflowActions",
            connection,
            v012.WorkflowActionsRequest(workflow_id="ns/wf"),
            (actions,),
        )
        for i in range(upTo):
            for state in (v012.STATE_RUNNING, v012.STATE_SUCCESS):
                report = v012.WorkflowActionStatus(
                    workflow_id="ns/wf",
                    task_name="t",
                    action_name=f"a{i}",
                    action_status=state,
                    worker_id=MAC,
                )
                site.call("ReportActionStatus", connection, report, (v012.Empty(),))

    def test_lastActionSuccess_rebooting(self) -> None:
        """[B1] SUCCESS of the action at index total-1 ends the workflow."""
        site = Site(self)
        self.workflow(site, upTo=3)
        self.assertEqual(site.events(), ["run.provisioned", "boot.rebooting"])

    def test_earlierSuccess_notDone(self) -> None:
        """[B1] SUCCESS of an earlier action does not."""
        site = Site(self)
        self.workflow(site, upTo=2)
        self.assertEqual(site.events(), ["run.provisioned"])

    def test_workerReturns_journaledOnce(self) -> None:
        """[B2] The worker's GetWorkflowContexts from a new connection after
        the end, configuration unread: journaled once, alert up."""
        site = Site(self)
        self.workflow(site, upTo=3)
        site.fleet.clock.advance(120)
        for connection in (2, 3):
            site.call(
                "GetWorkflowContexts",
                connection,
                v012.WorkflowContextRequest(worker_id=MAC),
            )
        self.assertEqual(site.events().count("boot.hookos-after-install"), 1)
        self.assertTrue(site.fleet.alerts.active(HOOKOS, "w1"))


class ObserverTests(SynchronousTestCase):
    """Reassembly and decoding never depend on frame boundaries."""

    def test_reader_anySplit(self) -> None:
        """Messages split anywhere, or several in one chunk, come out whole."""
        data = b"".join(
            frame(agent.ActionRequest(agent_id=f"id{i}" * i)) for i in range(5)
        )
        for size in (1, 3, 7, len(data)):
            reader = MessageReader()
            out: list[Any] = []
            for i in range(0, len(data), size):
                out += reader.feed(data[i : i + size])
            self.assertEqual(len(out), 5)

    @given(
        st.lists(st.binary(max_size=300), min_size=1, max_size=6),
        st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=20),
    )
    @settings(max_examples=200, deadline=None)
    def test_reader_property_anyCuts(
        self, payloads: list[bytes], cuts: list[int]
    ) -> None:
        """Any messages cut into any chunk sizes come out whole, in order."""
        data = b"".join(b"\x00" + len(p).to_bytes(4, "big") + p for p in payloads)
        reader = MessageReader()
        out: list[Any] = []
        offset = i = 0
        while offset < len(data):
            size = cuts[i % len(cuts)]
            out += reader.feed(data[offset : offset + size])
            offset += size
            i += 1
        self.assertEqual(out, [(False, p) for p in payloads])

    def test_reader_overLimit_skipped(self) -> None:
        """A message over the observation limit is reported without its
        payload and the next one is still read."""
        reader = MessageReader(limit=4)
        data = b"\x00\x00\x00\x00\x08" + b"x" * 8 + b"\x00\x00\x00\x00\x02ok"
        self.assertEqual(reader.feed(data), [(False, None), (False, b"ok")])

    def test_compressed_notDecoded(self) -> None:
        """Compressed messages pass undecoded and are counted."""
        site = Site(self)
        tap = site.observer(P + "GetAction", 1)
        assert tap is not None
        payload = agent.ActionRequest(agent_id=MAC).SerializeToString()
        tap.request(b"\x01" + len(payload).to_bytes(4, "big") + payload)
        self.assertEqual(site.metrics.undecoded.labels("compressed")._value.get(), 1.0)

    def test_garbage_countedAsDecodeFailure(self) -> None:
        """A message that is not protobuf is counted, and nothing happens."""
        site = Site(self)
        tap = site.observer(P + "GetAction", 1)
        assert tap is not None
        tap.request(b"\x00\x00\x00\x00\x03\xff\xff\xff")
        failures = site.metrics.decodeFailures.labels(P + "GetAction")
        self.assertEqual(failures._value.get(), 1.0)

    def test_reportGeneration_fromWireTypes(self) -> None:
        """With no other method seen, the two ReportActionStatus requests are
        told apart by their fields' wire types."""
        old = v012.WorkflowActionStatus(action_status=v012.STATE_SUCCESS)
        self.assertEqual(guessReportGeneration(old.SerializeToString()), OLD)
        new = agent.ActionStatusRequest(action_id="x", action_state=SUCCESS)
        self.assertEqual(guessReportGeneration(new.SerializeToString()), "agent")


class MachineTests(SynchronousTestCase):
    def test_restoredRebooting_returnsOnPoll(self) -> None:
        """A run restored as rebooting turns to returned on the next return."""
        calls: list[str] = []

        class Effects(BootEffects):
            def inHookOS(self) -> None:
                calls.append("hookos")

            def rebooting(self, workflow: str, signal: str) -> None:
                calls.append("rebooting")

            def netbootExpected(self) -> None:
                calls.append("netboot")

            def completed(self, afterHookOS: bool) -> None:
                calls.append("completed")

        machine = BootMachine(Effects())
        machine.restoreRebooting()
        machine.returned()
        self.assertEqual(calls, ["hookos"])
        self.assertEqual(machine.describe(), "returned-to-hookos")
