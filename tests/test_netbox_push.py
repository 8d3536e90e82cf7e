"""
The NetBox push's decisions (design.md, NetBox):
a delivery's release writes C{staged} and never an older status, what the
push leaves alone is journaled, and a NetBox that sends no ETag gets
writes that never put a status over one fleetd did not set itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import DeviceStatus, ServedRecord
from fleetd.netbox import outbox
from fleetd.netbox.devices import RemoteDevice
from fleetd.netbox.outbox import OutboxEntry, decide
from fleetd.netbox.service import NetBoxService
from fleetd.runs.machine import Outcome
from tests.fleetsupport import device
from tests.inventorysupport import W1
from tests.netbox_support import NetBoxFleet, NetBoxRig, seedFake


def _events(rig: NetBoxRig, name: str) -> list[Any]:
    entries: list[Any] = []
    rig.journal.query(device=name).addCallback(entries.extend)
    return entries


class ReleaseStatusTests(SynchronousTestCase):
    """A delivery's release sets C{staged}, decided from NetBox's detail."""

    def test_listProvisionDeliver_staged(self) -> None:
        """
        design.md, NetBox: list, then provision, then the node's fetch ends with the
        device C{staged} in NetBox: the release does not take the status
        from the list cached before the provision (it sent C{inventory}).
        """
        fleet = NetBoxFleet(self)
        self.addCleanup(fleet.worker.stop)
        fleet.add(device("w1", "SER1"))
        stored = fleet.fake.byName("w1")
        listed = self.successResultOf(fleet.inventory.list())
        self.assertEqual([d.status for d in listed], [DeviceStatus.INVENTORY])
        (run,) = fleet.provision(device("w1", "SER1"))
        fleet.clock.advance(0)
        self.assertEqual(stored["status"], "planned")
        self.assertEqual(fleet.fetch(run.code)[0], Outcome.DELIVER)
        fleet.clock.advance(0)
        self.assertEqual(stored["status"], "staged")
        self.assertEqual(stored["custom_fields"]["fleetd_release"]["run"], run.run)
        self.assertEqual(fleet.status("w1"), DeviceStatus.STAGED)
        (delivered,) = [
            e
            for e in self.successResultOf(fleet.journal.query(device="w1"))
            if e.event == "run.delivered"
        ]
        self.assertEqual(delivered.fields.get("status"), "staged")

    def test_decide_releaseNeverWritesTheRowsStaleStatus(self) -> None:
        """
        design.md, NetBox: whatever status a release's row carries (what fleetd
        knew when the delivery committed), its push writes C{staged} over
        C{planned} and no other status, ever.
        """
        for stale in DeviceStatus:
            entry = OutboxEntry(1, "w1", stale, "r-1", 5.0, None)
            planned = RemoteDevice(1, "w1", "planned", {})
            self.assertEqual(decide(entry, planned).body.get("status"), "staged")
            for now in ("inventory", "failed", "offline", "active", "staged"):
                current = RemoteDevice(1, "w1", now, {})
                self.assertNotIn("status", decide(entry, current).body, (stale, now))


class SkippedTests(SynchronousTestCase):
    """What the push leaves alone is journaled, even when it writes something."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.w1 = seedFake(self.rig.fake, W1)

    def test_releaseLeavesOperatorsStatus_journaledSkipped(self) -> None:
        """
        [J1] A release over an operator's own status (C{failed}) writes
        fleetd_release, leaves the status, and journals
        C{netbox.push.skipped} with the reason, counted as skipped.
        """
        self.rig.fake.edit(self.w1, status="failed")
        record = ServedRecord("r-1", "w1", 5.0, "p")
        self.successResultOf(self.rig.inventory.release(record, journal=()))
        self.rig.settle()
        stored = self.rig.fake.devices[self.w1]
        self.assertEqual(stored["status"], "failed")
        self.assertEqual(stored["custom_fields"]["fleetd_release"]["run"], "r-1")
        (skipped,) = [
            e for e in _events(self.rig, "w1") if e.event == "netbox.push.skipped"
        ]
        self.assertEqual(skipped.run, "r-1")
        self.assertIn("failed, not planned", skipped.fields["reason"])
        self.assertIn("fleetd_release written", skipped.fields["reason"])
        self.assertEqual(
            self.rig.sample("fleetd_netbox_pushes_total", outcome="skipped"), 1.0
        )


class WithoutETagTests(SynchronousTestCase):
    """NetBox sends no ETag: said once, counted, and no status over another's."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.rig.fake.etags = False
        self.w1 = seedFake(self.rig.fake, W1)

    def setStatus(self, status: DeviceStatus) -> None:
        self.rig.runner.run(lambda db: self.rig.inventory.setStatusIn(db, "w1", status))
        self.rig.settle()

    def test_operatorsFailed_notOverwritten(self) -> None:
        """
        design.md, NetBox: without ETag fleetd writes a status only over the one it
        last wrote itself; an operator's C{failed} set since survives an
        approval's C{active}, journaled as skipped.
        """
        self.setStatus(DeviceStatus.PLANNED)
        self.assertEqual(self.rig.fake.devices[self.w1]["status"], "planned")
        self.rig.fake.edit(self.w1, status="failed")
        self.setStatus(DeviceStatus.ACTIVE)
        self.assertEqual(self.rig.fake.devices[self.w1]["status"], "failed")
        reasons = [
            e.fields["reason"]
            for e in _events(self.rig, "w1")
            if e.event == "netbox.push.skipped"
        ]
        self.assertEqual(len(reasons), 1)
        self.assertIn("no ETag", reasons[0])

    def test_ownStatus_stillWritten(self) -> None:
        """
        Without ETag the lifecycle goes on over fleetd's own statuses:
        planned (first write), then a release's staged, then active; the
        PATCHes carry no If-Match.
        """
        self.setStatus(DeviceStatus.PLANNED)
        record = ServedRecord("r-1", "w1", 5.0, "p")
        self.successResultOf(self.rig.inventory.release(record, journal=()))
        self.rig.settle()
        self.assertEqual(self.rig.fake.devices[self.w1]["status"], "staged")
        self.setStatus(DeviceStatus.ACTIVE)
        self.assertEqual(self.rig.fake.devices[self.w1]["status"], "active")
        self.assertEqual(self.rig.fake.ifMatches, [None, None, None])
        written = self.successResultOf(
            self.rig.runner.run(lambda db: outbox.lastWritten(db, "w1"))
        )
        self.assertEqual(written, DeviceStatus.ACTIVE)

    def test_retirement_alwaysWritten(self) -> None:
        """[R1] A retirement's decommissioning is written even over failed."""
        self.setStatus(DeviceStatus.PLANNED)
        self.rig.fake.edit(self.w1, status="failed")
        self.setStatus(DeviceStatus.DECOMMISSIONING)
        self.assertEqual(self.rig.fake.devices[self.w1]["status"], "decommissioning")

    def test_missingETag_saidOnceAndGauge(self) -> None:
        """
        No ETag is said once in the log (C{netbox.etag.missing}) and in the
        gauge C{fleetd_netbox_etag_missing}; with an ETag the gauge is 0.
        """
        with capturedLogs() as events:
            self.setStatus(DeviceStatus.PLANNED)
            self.setStatus(DeviceStatus.STAGED)
        said = [e for e in events if "netbox.etag.missing" in str(e.get("log_format"))]
        self.assertEqual(len(said), 1)
        self.assertEqual(self.rig.sample("fleetd_netbox_etag_missing"), 1.0)
        self.rig.fake.etags = True
        self.setStatus(DeviceStatus.ACTIVE)
        self.assertEqual(self.rig.sample("fleetd_netbox_etag_missing"), 0.0)

    def test_probeAtStart_saysSo(self) -> None:
        """The start-up probe reads one device's detail and says there is no ETag."""
        self.rig.worker.stop()
        self.successResultOf(Deferred.fromCoroutine(self.rig.worker.probeETag()))
        self.assertEqual(self.rig.sample("fleetd_netbox_etag_missing"), 1.0)

    def test_serviceStart_saysSo(self) -> None:
        """
        At start, once the custom fields are checked, fleetd reads one
        device's detail and says there is no ETag, before any push.
        """
        self.rig.worker.stop()
        metrics = CollectorRegistry()
        service = NetBoxService(
            self.rig.clock,
            self.rig.client,
            self.rig.runner,
            self.rig.journal,
            configDigest=lambda run: None,
            onRefused=self.fail,
            wake=lambda f: self.rig.clock.callLater(0, f),
            metrics=metrics,
        )
        with capturedLogs() as events:
            service.startService()
        said = [e for e in events if "netbox.etag" in str(e.get("log_format"))]
        self.assertEqual(len(said), 1)
        self.assertEqual(metrics.get_sample_value("fleetd_netbox_etag_missing"), 1.0)
        self.successResultOf(service.stopService())
