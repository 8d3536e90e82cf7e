"""
Issue 28 item 4 [R1]: retirement deletes the run's Workflow and turns the
Hardware's C{allowPXE} and C{allowWorkflow} off, journaled; what the API
could not do is retried from the record, after a restart too.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from fleetd.k8s.client import KubeUnavailable
from fleetd.statuswords import retirementLines
from tests.tinkerbellobjects import NS, ObjectsFleet, machine


class RetireTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = ObjectsFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.w1 = machine("w1")
        self.fleet.add(self.w1)
        (self.first,) = self.fleet.provisioned(self.w1)

    def netboot(self) -> list[tuple[bool, bool]]:
        hardware = self.fleet.hardware()
        assert hardware is not None
        return [
            (i["netboot"]["allowPXE"], i["netboot"]["allowWorkflow"])
            for i in hardware["spec"]["interfaces"]
        ]

    def test_retire_deletesWorkflow_netbootOff(self) -> None:
        """[R1] The Workflow goes, network boot and workflows are off, each
        intent journaled with the retirement and each outcome after it;
        the owner's answer says so."""
        retired = self.successResultOf(self.fleet.retire("w1"))
        self.assertIsNone(self.fleet.workflow(self.first.run))
        self.assertEqual(self.netboot(), [(False, False)])
        self.assertEqual(
            self.fleet.events("w1")[-4:],
            [
                "tinkerbell.workflow-delete-requested",
                "tinkerbell.hardware-netboot-off-requested",
                "tinkerbell.workflow-deleted",
                "tinkerbell.hardware-netboot-off",
            ],
        )
        (requested,) = self.fleet.entries("tinkerbell.workflow-delete-requested")
        self.assertEqual(requested.fields["reason"], "retired")
        objects = retired.toJSON()["tinkerbell"]
        self.assertEqual(objects["workflow"]["made"], "deleted")
        self.assertEqual(objects["hardware"]["made"], "netboot-off")
        lines = retirementLines(retired.toJSON())
        self.assertIn(f"workflow: {NS}/w1-{self.first.run}", "\n".join(lines))

    def test_apiFailsAfterTheCommit_retriedAfterRestart(self) -> None:
        """The Node went, the retirement committed, then the API failed the
        Workflow's deletion and the Hardware's update: the answer says
        they wait; after a restart fleetd does them from the record."""
        self.fleet.fake.failNext("DELETE", "/workflows/", 503, "ServiceUnavailable")
        retired = self.successResultOf(self.fleet.retire("w1"))
        objects = retired.toJSON()["tinkerbell"]
        self.assertEqual(objects["workflow"]["made"], "delete")
        self.assertIn("503", objects["waiting"])
        self.assertIsNotNone(self.fleet.workflow(self.first.run))
        self.fleet.fake.reachable = False
        self.fleet.advance(1)  # the retry fails too
        self.fleet.restart()
        self.fleet.advance(1)
        self.assertIsNotNone(self.fleet.workflow(self.first.run))  # still down
        self.fleet.fake.reachable = True
        self.fleet.advance(60)
        self.assertIsNone(self.fleet.workflow(self.first.run))
        self.assertEqual(self.netboot(), [(False, False)])
        (deleted,) = self.fleet.entries("tinkerbell.workflow-deleted")
        self.assertTrue(deleted.fields["found"])
        self.assertEqual(self.fleet.metric("fleetd_tinkerbell_calls_pending"), 0.0)

    def test_kubernetesDown_retirementRefused_nothingRecorded(self) -> None:
        """Kubernetes down: the Node cannot be deleted, so the retirement
        is refused and records no Tinkerbell intent either."""
        self.fleet.fake.reachable = False
        self.failureResultOf(self.fleet.retire("w1"), KubeUnavailable)
        self.assertNotIn(
            "tinkerbell.workflow-delete-requested", self.fleet.events("w1")
        )
        self.fleet.fake.reachable = True
        self.fleet.advance(120)
        self.assertIsNotNone(self.fleet.workflow(self.first.run))

    def test_hardwareNotFleetds_leftAlone(self) -> None:
        """A retired device whose Hardware is not fleetd's (made by hand
        for a class without [tinkerbell.classes]): left as it is, said."""
        other = machine("w2", "SER2")
        self.fleet.add(other)
        self.fleet.fake.addHardware(NS, "w2", list(other.macs))
        self.successResultOf(self.fleet.retire("w2"))
        hardware = self.fleet.hardware("w2")
        assert hardware is not None
        self.assertTrue(hardware["spec"]["interfaces"][0]["netboot"]["allowPXE"])
        (left,) = self.fleet.entries("tinkerbell.object-left-alone")
        self.assertEqual(left.fields["hardware"], f"{NS}/w2")
