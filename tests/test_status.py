"""
C{fleetctl status NAME}: a device's record, its latest run and state, the
alerts that concern it, its last journal entries and the recovery step.
"""

from __future__ import annotations

import json

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.fleet.status import DeviceReport, StatusService
from fleetd.inventory.model import DeviceStatus
from fleetd.runs.alerts import DEFAULT_HOLD
from tests.daemonsupport import DaemonTestMixin, DeliveryMixin, configPath
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.fleetsupport import Fleet, device

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"


class StatusServiceTests(SynchronousTestCase):
    """The report in every state a device's run can be in."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.hold = DEFAULT_HOLD
        self.fleet.restart()
        self.fleet.add(device("w1", "SER1"), device("g2", "SER2", cls="worker-g2"))

    def report(self, name: str = "w1", kubernetes: bool = True) -> DeviceReport:
        service = StatusService(
            self.fleet.inventory,
            self.fleet.registry,
            self.fleet.alerts,
            self.fleet.journal,
            kubernetes=kubernetes,
        )
        result = self.successResultOf(Deferred.fromCoroutine(service.report(name)))
        assert result is not None
        return result

    def test_unknown_none(self) -> None:
        """An unknown device has no report (the API answers 404)."""
        service = StatusService(
            self.fleet.inventory, self.fleet.registry, self.fleet.alerts,
            self.fleet.journal,
        )  # fmt: skip
        self.assertIsNone(
            self.successResultOf(Deferred.fromCoroutine(service.report("nope")))
        )

    def test_neverProvisioned(self) -> None:
        """A new device: no run, and the step is to provision it."""
        report = self.report()
        self.assertIsNone(report.run)
        self.assertEqual(
            report.recovery, "fleetctl provision w1, then write the code to META 0x0b"
        )

    def test_ready_thenConsumed(self) -> None:
        """A ready run needs nothing; once delivered the device is staged."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        report = self.report()
        assert report.run is not None
        self.assertEqual((report.run.state, report.recovery), ("ready", None))
        self.fleet.fetch(run.code)
        report = self.report()
        assert report.run is not None
        self.assertEqual(report.run.state, "consumed")
        self.assertEqual(report.device.status, DeviceStatus.STAGED)
        self.assertIsNone(report.recovery)
        self.assertEqual(
            [e.event for e in report.journal],
            ["run.provisioned", "run.delivered"],
        )

    def test_staged_withoutKubernetes_pathEnds(self) -> None:
        """
        A staged device on a fleetd without C{[kubernetes]}: the state says
        that staged is where the path ends there, and nothing is to do;
        with a cluster it waits for the kubelet certificate (issue 27,
        item 11).
        """
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        report = self.report(kubernetes=False)
        self.assertEqual(report.device.status, DeviceStatus.STAGED)
        self.assertEqual(
            (report.state, report.recovery),
            (
                "configuration delivered; staged is where the path ends on this"
                " fleetd: without [kubernetes] it approves no kubelet"
                " certificate, so the device never becomes active here",
                None,
            ),
        )
        self.assertEqual(
            self.report().state,
            "configuration delivered; waiting for the node's kubelet certificate",
        )

    def test_refetched_saysProvisionAgain(self) -> None:
        """[C2] [C3] A refetch raises the alert and names the recovery."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        self.fleet.fetch(run.code)
        report = self.report()
        self.assertEqual(report.alerts, ["FleetInstallConfigRefetched"])
        self.assertEqual(
            report.recovery,
            "fleetctl provision w1; the disk holds no STATE to preserve",
        )

    def test_lost_saysProvisionAgain(self) -> None:
        """[V4] [V5] A lost run after a reboot: the alert and the recovery."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.restart(wipeVault=True)
        self.fleet.fetch(run.code)
        report = self.report()
        assert report.run is not None
        self.assertEqual(report.run.state, "lost")
        self.assertEqual(report.device.status, DeviceStatus.PLANNED)
        self.assertEqual(report.alerts, ["FleetInstallConfigMissing"])
        self.assertIn("fleetctl provision w1", report.recovery or "")

    def test_workerG2_cannotInstall(self) -> None:
        """[T2] A worker-g2 is told it cannot install through fleetd."""
        report = self.report("g2")
        self.assertIn("cannot attest or install through fleetd", report.state)
        self.assertNotIn("fleetctl provision", report.recovery or "")

    def test_report_neverShowsTheCode(self) -> None:
        """No code appears in the report."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.assertNotIn(run.code, json.dumps(self.report().toJSON()))


class StatusCommandTests(DaemonTestMixin, TestCase):
    """fleetctl status against a running daemon."""

    async def test_status_byHand(self) -> None:
        """fleetctl status prints the record, run, state, alerts and step."""
        _, fleetctl = await self.daemonWithDevice()
        code, out, err = await fleetctl("status", "w1")
        self.assertEqual(code, 0, err)
        self.assertIn("run:      none", out)
        self.assertIn("recovery: fleetctl provision w1", out)
        code, out, err = await fleetctl("provision", "w1")
        self.assertEqual(code, 0, err)
        code, out, err = await fleetctl("--json", "status", "w1")
        doc = json.loads(out)
        self.assertEqual(
            (doc["run"]["state"], doc["device"]["status"]), ("ready", "planned")
        )
        self.assertEqual([e["event"] for e in doc["journal"]][-1], "run.provisioned")
        code, out, err = await fleetctl("status", "w9")
        self.assertEqual(code, 1)
        self.assertIn("404", err)


class StagedCommandTests(DeliveryMixin, TestCase):
    """C{fleetctl status} of a staged device, on a fleetd without a cluster."""

    async def test_staged_withoutKubernetes(self) -> None:
        """
        Delivered on a fleetd without C{[kubernetes]} (the tests' config):
        C{fleetctl status} says staged is where the path ends there.
        """
        await self.startLoaded()
        self.assertIsNone(self.settings.kubernetes)
        await self.addDevice("w1", "SN-1", UUID)
        runCode = (await self.provision("w1"))["w1"]
        status, _, _ = await self.fetch(configPath(runCode, UUID, "SN-1"))
        self.assertEqual(status, 200)
        await self.events("run.delivered")
        config = ownerConfig(self.directory, self.port(self.service, "admin"))
        code, out, err = await fleetctlAgainst(config, "status", "w1")
        self.assertEqual(code, 0, err)
        self.assertIn("w1  staged  class worker", out)
        self.assertIn(
            "state:    configuration delivered; staged is where the path ends"
            " on this fleetd",
            out,
        )
        self.assertIn("recovery: nothing to do", out)
