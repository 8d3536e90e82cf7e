"""
Issue 28 items 3 and 5: fleetd never provisions again on its own [V3]. A
Workflow it made that someone else deletes or changes is reported (the
journal, a metric, C{fleetctl status}) and never made again; one whose
labels are taken off is never touched again. The Workflow's state, read
by the watch fleetd keeps (L{fleetd.tink.wfstate}), is shown beside the
run's.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.statuswords import statusRows
from tests.tinkerbellobjects import NS, ObjectsFleet, machine


class ReportTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = ObjectsFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.w1 = machine("w1")
        self.fleet.add(self.w1)
        self.fleet.startWatch()
        (self.first,) = self.fleet.provisioned(self.w1)
        self.name = f"w1-{self.first.run}"

    def lost(self) -> float:
        found = self.fleet.metric("fleetd_tinkerbell_workflows_missing", device="w1")
        return 0.0 if found is None else found

    def test_deletedBySomeoneElse_reportedNotMadeAgain(self) -> None:
        """[V3] Deleted by someone else before it ran: journaled, counted,
        shown by status with the owner's step; never made again, not on
        a retry, not after a restart."""
        self.fleet.fake.deleteWorkflow(NS, self.name)
        (entry,) = self.fleet.entries("tinkerbell.workflow-lost")
        self.assertEqual(
            (entry.device, entry.run, entry.fields["how"]),
            ("w1", self.first.run, "deleted"),
        )
        self.assertEqual(
            self.fleet.metric("fleetd_tinkerbell_workflows_lost_total", how="deleted"),
            1.0,
        )
        self.assertEqual(self.lost(), 1.0)
        report = self.fleet.report("w1")
        self.assertIn("deleted by someone else", report["state"])
        self.assertEqual(
            report["recovery"], "fleetctl provision w1: a new run, and a new Workflow"
        )
        self.fleet.advance(3600)
        self.fleet.restart()
        self.fleet.startWatch()
        self.fleet.advance(3600)
        self.assertEqual(self.fleet.posts("workflows"), 1)
        self.assertEqual(self.fleet.fake.workflows, {})
        self.assertEqual(len(self.fleet.entries("tinkerbell.workflow-lost")), 1)

    def test_newProvision_isTheRecovery(self) -> None:
        """The owner's new provision makes a new Workflow and clears the
        report's gauge; the lost one is not deleted (it is gone)."""
        self.fleet.fake.deleteWorkflow(NS, self.name)
        (run,) = self.fleet.provisioned(self.w1)
        self.assertIsNotNone(self.fleet.workflow(run.run))
        self.assertEqual(self.lost(), 0.0)
        self.assertEqual(self.fleet.entries("tinkerbell.workflow-delete-requested"), [])

    def test_deletedDuringWatchGap_confirmedThenReported(self) -> None:
        """Deleted while the watch was down: the list after the gap lacks
        it; fleetd reads it to be sure, then reports it."""
        assert self.fleet.watch is not None
        self.fleet.watch.stop()
        self.fleet.fake.closeWatches()
        self.fleet.fake.deleteWorkflow(NS, self.name)
        self.fleet.fake.compact()
        self.assertEqual(self.fleet.entries("tinkerbell.workflow-lost"), [])
        self.fleet.fake.calls.clear()
        self.fleet.startWatch()
        (entry,) = self.fleet.entries("tinkerbell.workflow-lost")
        self.assertEqual(entry.fields["how"], "deleted")
        self.assertIn(
            (
                "GET",
                f"/apis/tinkerbell.org/v1alpha1/namespaces/{NS}/workflows/{self.name}",
            ),
            self.fleet.fake.calls,
        )

    def test_changedBySomeoneElse_reported_deletedBySupersede(self) -> None:
        """Its spec changed by someone else: reported as changed; still
        fleetd's (its labels), so the next provision deletes it first."""

        def edit(obj: dict[str, Any]) -> None:
            obj["spec"]["hardwareMap"]["talos_image"] = "https://elsewhere/x.raw"

        self.fleet.fake.editWorkflow(NS, self.name, edit)
        (entry,) = self.fleet.entries("tinkerbell.workflow-lost")
        self.assertEqual(entry.fields["how"], "changed")
        self.assertEqual(self.lost(), 1.0)
        self.fleet.provisioned(self.w1)
        self.assertIsNone(self.fleet.workflow(self.first.run))

    def test_labelsTakenOff_neverTouchedAgain(self) -> None:
        """Its labels taken off: no longer fleetd's. Reported, and a new
        provision leaves it where it is."""

        def strip(obj: dict[str, Any]) -> None:
            obj["metadata"]["labels"] = {}

        self.fleet.fake.editWorkflow(NS, self.name, strip)
        (entry,) = self.fleet.entries("tinkerbell.workflow-lost")
        self.assertEqual(entry.fields["how"], "disowned")
        self.fleet.fake.setWorkflowState(NS, self.name, "SUCCESS")
        (run,) = self.fleet.provisioned(self.w1)
        self.assertIsNotNone(self.fleet.workflow(self.first.run))
        self.assertIsNotNone(self.fleet.workflow(run.run))
        deletes = [
            c for c in self.fleet.fake.calls if c[0] == "DELETE" and "workflows" in c[1]
        ]
        self.assertEqual(deletes, [])

    def test_deletedAfterItsEnd_removedNotLost(self) -> None:
        """Deleted after it reached SUCCESS: the install ran; journaled as
        removed, no alert gauge."""
        self.fleet.fake.setWorkflowState(NS, self.name, "SUCCESS")
        self.fleet.fake.deleteWorkflow(NS, self.name)
        self.assertEqual(self.fleet.entries("tinkerbell.workflow-lost"), [])
        (entry,) = self.fleet.entries("tinkerbell.workflow-removed")
        self.assertEqual(entry.fields["seen"], "SUCCESS")
        self.assertEqual(self.lost(), 0.0)

    def test_ownDeletion_notReported(self) -> None:
        """fleetd's own deletion (a supersede) is no loss."""
        self.fleet.provisioned(self.w1)
        self.assertEqual(self.fleet.entries("tinkerbell.workflow-lost"), [])

    def test_statusShowsTheWorkflowState(self) -> None:
        """Item 5: status (and the console's device page, the same rows)
        shows the Workflow's state from the watch beside the run's."""
        self.fleet.fake.setWorkflowState(NS, self.name, "RUNNING")
        doc = self.fleet.report("w1")
        self.assertEqual(doc["tinkerbell"]["workflow"]["state"], "RUNNING")
        rows = {row.label: row.text for row in statusRows(doc)}
        self.assertEqual(rows["run"], f"{self.first.run}  ready")
        self.assertEqual(rows["workflow"], f"{NS}/{self.name}  RUNNING  (fleetd: made)")
        self.assertEqual(
            rows["hardware"], f"{NS}/w1  (fleetd: applied, network boot allowed)"
        )
