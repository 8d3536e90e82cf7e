"""
Issue 28 item 2: C{fleetctl provision} makes the device's Hardware and its
run's Workflow, the intent journaled before each API call [J1], so that a
restart resumes and never makes one twice; a second provision deletes the
earlier run's Workflow first; what fleetd did not make is never changed,
and a clash with it is a refusal naming it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from typing import Any
from unittest import mock

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.admin.refusals import statusOf
from fleetd.refused import Refused
from fleetd.store.db import StoreError
from fleetd.tinkerbell.service import Refusal, TinkerbellService
from fleetd.tinkerbell.store import CREATE
from tests.faultsupport import FAULTS, Faults, FaultyRunner
from tests.tinkerbellobjects import IMAGE, NS, SETTINGS, ObjectsFleet, machine


class ProvisionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = ObjectsFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.w1 = machine("w1")
        self.fleet.add(self.w1)

    def test_provision_makesHardwareAndWorkflow(self) -> None:
        """The Hardware names the inventory MAC, allows network boot and
        workflows and carries fleetd's labels; the Workflow is named after
        the device and run, with the class's Template, image and boot
        options; the owner's answer says they are made."""
        (run,) = self.fleet.provisioned(self.w1)
        mac = self.w1.macs[0]
        hardware = self.fleet.hardware()
        assert hardware is not None
        self.assertEqual(
            hardware["metadata"]["labels"],
            {"app.kubernetes.io/managed-by": "fleetd", "fleetd.io/device": "w1"},
        )
        self.assertEqual(
            hardware["spec"]["interfaces"],
            [
                {
                    "dhcp": {"mac": mac, "hostname": "w1"},
                    "netboot": {"allowPXE": True, "allowWorkflow": True},
                }
            ],
        )
        workflow = self.fleet.workflow(run.run)
        assert workflow is not None
        self.assertEqual(workflow["metadata"]["labels"]["fleetd.io/run"], run.run)
        self.assertEqual(
            workflow["spec"],
            {
                "templateRef": "fleetd-talos-install",
                "hardwareRef": "w1",
                "hardwareMap": {"device_1": mac, "talos_image": IMAGE},
                "bootOptions": {"toggleAllowNetboot": True},
            },
        )
        answer = run.toJSON()["tinkerbell"]
        self.assertEqual(answer["workflow"]["name"], f"{NS}/w1-{run.run}")
        self.assertEqual(answer["workflow"]["made"], "created")
        self.assertEqual(answer["hardware"]["made"], "applied")
        self.assertEqual(
            self.fleet.events("w1"),
            [
                "tinkerbell.hardware-apply-requested",
                "tinkerbell.workflow-create-requested",
                "tinkerbell.hardware-applied",
                "tinkerbell.workflow-created",
            ],
        )

    def test_intentCommitted_beforeTheCall(self) -> None:
        """[J1] When the API is asked to create the Workflow, its intent is
        in the database already, committed with the run it belongs to."""
        seen: list[Any] = []

        def validator(kind: str, obj: dict[str, Any]) -> None:
            if kind == "Workflow":
                name = obj["metadata"]["name"]
                record = self.fleet.db.execute(
                    "SELECT state, run FROM tinkerbell_workflows WHERE name = ?",
                    (name,),
                ).fetchone()
                run = self.fleet.db.execute(
                    "SELECT id FROM runs WHERE id = ?", (record[1],)
                ).fetchone()
                seen.append((record[0], run is not None))
            return None

        self.fleet.fake.validator = validator
        self.fleet.provisioned(self.w1)
        self.assertEqual(seen, [(CREATE, True)])

    def test_secondProvision_deletesEarlierWorkflowFirst(self) -> None:
        """A second provision deletes the first run's Workflow before the
        new one is made, journaled; the Hardware is updated, not made again."""
        (first,) = self.fleet.provisioned(self.w1)
        self.fleet.fake.calls.clear()
        (second,) = self.fleet.provisioned(self.w1)
        self.assertIsNone(self.fleet.workflow(first.run))
        self.assertIsNotNone(self.fleet.workflow(second.run))
        writes = [
            (m, p.rsplit("/", 1)[-1])
            for m, p in self.fleet.fake.calls
            if m in ("POST", "DELETE", "PUT") and "/tinkerbell.org/" in p
        ]
        self.assertEqual(
            writes,
            [
                ("DELETE", f"w1-{first.run}"),
                ("POST", "workflows"),
            ],
        )
        self.assertEqual(self.fleet.posts("hardware"), 0)  # nor updated: unchanged
        entries = self.fleet.entries("tinkerbell.workflow-delete-requested")
        self.assertEqual(
            [(e.run, e.fields["reason"]) for e in entries], [(first.run, "superseded")]
        )
        (deleted,) = self.fleet.entries("tinkerbell.workflow-deleted")
        self.assertEqual(deleted.fields["found"], True)

    def test_restartBetweenIntentAndCall_madeOnce(self) -> None:
        """The intent committed, the API hung before the Workflow was made;
        after a restart fleetd resumes from the row and makes it, once."""
        self.fleet.fake.hangNext("GET", "/workflows/")
        d = self.fleet.provisionAsOwner(self.w1)
        self.assertNoResult(d)  # the answer waits for the first try
        self.assertEqual(self.fleet.posts("workflows"), 0)
        (row,) = self.fleet.rows("w1")
        self.assertEqual(row.state, CREATE)
        self.fleet.restart()
        self.successResultOf(d)  # answered when the first fleetd stopped
        self.assertEqual(self.fleet.posts("workflows"), 1)
        (row,) = self.fleet.rows("w1")
        self.assertEqual(row.state, "created")
        self.assertEqual(len(self.fleet.fake.workflows), 1)

    def test_answerLost_restart_takesItAsMade(self) -> None:
        """The create reached the API but its answer was lost; after a
        restart fleetd finds its Workflow (its labels, its run) and takes
        it as made: one Workflow, one create."""
        self.fleet.fake.loseAnswerNext("POST", "/workflows")
        d = self.fleet.provisionAsOwner(self.w1)
        self.fleet.advance(self.fleet.client.timeout)
        (run,) = self.successResultOf(d)
        self.assertEqual(run.toJSON()["tinkerbell"]["workflow"]["made"], CREATE)
        self.fleet.restart()
        self.assertEqual(self.fleet.posts("workflows"), 1)
        self.assertEqual(list(self.fleet.fake.workflows), [f"{NS}/w1-{run.run}"])
        (made,) = self.fleet.entries("tinkerbell.workflow-created")
        self.assertEqual(made.fields["adopted"], True)

    def test_foreignHardware_refusedNamingIt(self) -> None:
        """A Hardware of the device's name that fleetd did not make refuses
        the provision, naming it, journaled; nothing is provisioned and
        the Hardware is not touched."""
        hand = self.fleet.fake.addHardware(NS, "w1", [self.w1.macs[0]])
        error = self.failureResultOf(self.fleet.provisionAsOwner(self.w1), Refused)
        self.assertEqual(statusOf(error.value), 409)
        self.assertIn(f"Hardware {NS}/w1", str(error.value))
        self.assertIn("nothing was provisioned", str(error.value))
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertEqual(self.fleet.hardware(), hand)
        self.assertEqual(self.fleet.fake.workflows, {})
        (refused,) = self.fleet.entries("provision.refused")
        self.assertEqual(refused.fields["reason"], "tinkerbell-not-fleetds")

    def test_handMadeLiveWorkflow_refused_endedOneIsNot(self) -> None:
        """A Workflow fleetd did not make that would still run on the
        device refuses the provision, naming it; one that has ended does
        not stand in the way (and is left as it is)."""
        mac = self.w1.macs[0]
        self.fleet.fake.addWorkflow(NS, "w1-install", mac, state="PENDING")
        error = self.failureResultOf(self.fleet.provisionAsOwner(self.w1), Refused)
        self.assertIn(f"Workflow {NS}/w1-install", str(error.value))
        self.fleet.fake.setWorkflowState(NS, "w1-install", "SUCCESS")
        self.fleet.provisioned(self.w1)
        self.assertIn(f"{NS}/w1-install", self.fleet.fake.workflows)

    def test_nameClash_refusedNamingIt(self) -> None:
        """The run's Workflow name taken by an object fleetd did not make:
        refused, naming it, and that object is left alone."""
        run = "r-00000000000000aa"
        other = self.fleet.fake.addWorkflow(
            NS, f"w1-{run}", "52:54:00:99:99:99", hardwareRef="other"
        )
        with mock.patch("fleetd.runs.provision.mintRunId", return_value=run):
            (made,) = self.fleet.provisioned(self.w1)
        workflow = made.toJSON()["tinkerbell"]["workflow"]
        self.assertEqual(workflow["made"], "refused")
        self.assertIn(f"{NS}/w1-{run}", workflow["problem"])
        self.assertEqual(self.fleet.fake.workflows[f"{NS}/w1-{run}"], other)
        (refused,) = self.fleet.entries("tinkerbell.object-refused")
        self.assertEqual(refused.fields["workflow"], f"{NS}/w1-{run}")
        report = self.fleet.report("w1")
        self.assertIn("could not make its Workflow", report["state"])

    def test_noMAC_refused(self) -> None:
        """A device of a [tinkerbell] class without a MAC cannot have a
        Hardware: refused before anything is made."""
        bare = machine("w2", "SER2", macs=())
        self.fleet.add(bare)
        error = self.failureResultOf(self.fleet.provisionAsOwner(bare), Refused)
        self.assertIn("tinkerbell-no-mac", str(error.value))
        self.assertIsNone(self.fleet.registry.readyRun("w2"))

    def test_classWithoutTable_noObjects(self) -> None:
        """A device whose class has no [tinkerbell.classes] table gets no
        object from fleetd (its Workflow is written by hand)."""
        other = replace(machine("w3", "SER3"), device_class="worker")
        self.fleet.add(other)
        (run,) = self.fleet.provisioned(other)
        self.assertNotIn("tinkerbell", run.toJSON())
        self.assertEqual(self.fleet.fake.hardware, {})
        self.assertEqual(self.fleet.events("w3"), [])


class KubernetesDownTests(SynchronousTestCase):
    """The API down during a provision (injected faults)."""

    def setUp(self) -> None:
        self.fleet = ObjectsFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.w1 = machine("w1")
        self.fleet.add(self.w1)

    def test_downBeforeTheRun_refusedNothingMade(self) -> None:
        """Kubernetes unreachable when the provision starts: 503, no run,
        no intent, nothing to retry."""
        self.fleet.fake.reachable = False
        error = self.failureResultOf(self.fleet.provisionAsOwner(self.w1), Refused)
        self.assertEqual(statusOf(error.value), 503)
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertEqual(self.fleet.rows("w1"), [])
        self.fleet.fake.reachable = True
        self.fleet.advance(120)
        self.assertEqual(self.fleet.fake.workflows, {})

    def test_downAfterTheRun_runStands_retried(self) -> None:
        """The API fails once the run committed: the run stands, the answer
        says the Workflow waits and why, and fleetd makes it on a retry."""
        self.fleet.fake.failNext("POST", "/workflows", 503, "ServiceUnavailable")
        (run,) = self.fleet.provisioned(self.w1)
        view = run.toJSON()["tinkerbell"]
        self.assertEqual(view["workflow"]["made"], CREATE)
        self.assertIn("503", view["waiting"])
        self.assertEqual(self.fleet.registry.readyRun("w1"), run.run)
        self.assertIn("not made yet", self.fleet.report("w1")["state"])
        self.assertEqual(
            self.fleet.metric(
                "fleetd_tinkerbell_call_failures_total", reason="kubernetes"
            ),
            1.0,
        )
        self.fleet.advance(1)
        self.assertIsNotNone(self.fleet.workflow(run.run))
        self.assertEqual(self.fleet.metric("fleetd_tinkerbell_calls_pending"), 0.0)

    def test_stop_leavesNoDelayedCall(self) -> None:
        """A retry waiting, a watch open: stopping fleetd leaves nothing
        armed on the clock."""
        self.fleet.startWatch()
        self.fleet.fake.failNext("POST", "/workflows", 503)
        self.fleet.provisioned(self.w1)
        self.assertTrue(self.fleet.clock.getDelayedCalls())
        self.fleet.stopKube()
        self.fleet.registry.stop()
        self.assertEqual(self.fleet.clock.getDelayedCalls(), [])
        self.addCleanup(self.fleet.start)  # setUp's cleanup stops it again

    def test_hungAPI_answeredWithinThirtySeconds(self) -> None:
        """An API that hangs holds the owner's answer 30 s at most: the run
        stands and the answer says its Workflow is still to be made."""
        self.fleet.client.timeout = 600.0
        self.fleet.fake.hangNext("POST", "/workflows")
        d = self.fleet.provisionAsOwner(self.w1)
        self.fleet.advance(29)
        self.assertNoResult(d)
        self.fleet.advance(1)
        (run,) = self.successResultOf(d)
        self.assertEqual(run.toJSON()["tinkerbell"]["workflow"]["made"], CREATE)
        self.assertEqual(self.fleet.registry.readyRun("w1"), run.run)


class StoreFaultTests(SynchronousTestCase):
    """[J1] The journal or database failing (injected faults)."""

    def setUp(self) -> None:
        self.fleet = ObjectsFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.w1 = machine("w1")
        self.fleet.add(self.w1)

    def test_intentNotJournaled_nothingProvisionedNothingMade(self) -> None:
        """The journal refuses the intents: the provision's transaction
        fails as a whole; no run, no row, no object in the cluster."""
        faults = Faults(self.fleet)
        faults.journal.onlyEvents = frozenset({"tinkerbell.workflow-create-requested"})
        faults.inject("journal")
        self.failureResultOf(self.fleet.provisionAsOwner(self.w1))
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertEqual(self.fleet.rows("w1"), [])
        self.assertEqual(self.fleet.fake.workflows, {})
        self.assertEqual(self.fleet.fake.hardware, {})

    def test_outcomeNotRecorded_retriedNotMadeTwice(self) -> None:
        """The Workflow was made but its record failed (the journal): the
        row stays an intent, the retry finds the Workflow and records it,
        and nothing is made twice."""
        faults = Faults(self.fleet)
        faults.journal.onlyEvents = frozenset({"tinkerbell.workflow-created"})
        faults.inject("journal")
        (run,) = self.fleet.provisioned(self.w1)
        self.assertIsNotNone(self.fleet.workflow(run.run))
        self.assertEqual(self.fleet.rows("w1")[0].state, CREATE)
        self.assertEqual(
            self.fleet.metric("fleetd_tinkerbell_call_failures_total", reason="store"),
            1.0,
        )
        self.assertEqual(len(self.flushLoggedErrors(StoreError)), 1)
        faults.clear()
        self.fleet.advance(1)
        self.assertEqual(self.fleet.rows("w1")[0].state, "created")
        self.assertEqual(self.fleet.posts("workflows"), 1)

    def test_loadFails_retriedThenResumes(self) -> None:
        """A start while the database fails loads the rows once it answers,
        then makes the calls they owe."""
        self.fleet.fake.failNext("POST", "/workflows", 503)
        (run,) = self.fleet.provisioned(self.w1)
        self.fleet.objects.stopService()
        runner = FaultyRunner(self.fleet.runner)
        runner.failing = FAULTS["database"]()
        service = TinkerbellService(
            clock=self.fleet.clock,
            client=self.fleet.client,
            settings=SETTINGS,
            journal=self.fleet.journal,
            runner=runner,
            readyRun=self.fleet.registry.readyRun,
        )
        service.startService()
        self.addCleanup(service.stopService)
        self.assertFalse(service.book.loaded)
        error = self.failureResultOf(
            Deferred.fromCoroutine(service.preflight([self.w1])), Refusal
        )
        self.assertTrue(error.value.busy)
        self.flushLoggedErrors(sqlite3.OperationalError)
        runner.failing = None
        self.fleet.advance(1)
        self.assertTrue(service.book.loaded)
        self.assertIsNotNone(self.fleet.workflow(run.run))
