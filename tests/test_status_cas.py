"""
Status changes compare and set inside their transactions (review M2, H2):
the release moves only planned -> staged, the first kubelet approval only
planned/staged -> active, a provision never a decommissioning device, on
the SQLite and the NetBox inventory alike.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd.admin.provision import ProvisionResource
from fleetd.inventory.model import DeviceStatus, InventoryError, ServedRecord
from fleetd.netbox.outbox import pendingStatuses
from fleetd.runs.machine import Outcome
from fleetd.runs.provision import Decommissioning
from fleetd.runs.render import NodeFacts
from tests.fleetsupport import RENDERER, FlakyInventory, Fleet, device
from tests.inventorysupport import W1
from tests.netbox_support import NetBoxRig, seedFake


def _setStatus(fleet: Fleet, name: str, status: DeviceStatus) -> None:
    fleet.test.successResultOf(fleet.inventory.setStatus(name, status, journal=()))


def _released(fleet: Fleet, run: str) -> dict[str, Any]:
    entries = fleet.test.successResultOf(fleet.journal.query(run=run))
    (entry,) = [e for e in entries if e.event == "run.delivered"]
    return {k: v for k, v in entry.fields.items() if k != "peer"}


class SQLiteTransitionTests(SynchronousTestCase):
    """[J1] transitionIn is a compare-and-set in the caller's transaction."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))

    def transition(self, *from_: DeviceStatus, to: DeviceStatus) -> bool:
        inventory = self.fleet.inventory
        moved: bool = self.successResultOf(
            self.fleet.runner.run(
                lambda db: inventory.transitionIn(db, "w1", from_, to)
            )
        )
        return moved

    def test_transition_onlyFromListedStatuses(self) -> None:
        """[J1] A status outside from_ is kept; one inside moves."""
        _setStatus(self.fleet, "w1", DeviceStatus.DECOMMISSIONING)
        self.assertFalse(
            self.transition(
                DeviceStatus.PLANNED, DeviceStatus.STAGED, to=DeviceStatus.ACTIVE
            )
        )
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        self.assertTrue(
            self.transition(DeviceStatus.DECOMMISSIONING, to=DeviceStatus.OFFLINE)
        )
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.OFFLINE)

    def test_transition_unknownDevice_notFound(self) -> None:
        """An unknown device is C{not-found}, not a silent no-op."""
        inventory = self.fleet.inventory
        failure = self.failureResultOf(
            self.fleet.runner.run(
                lambda db: inventory.transitionIn(
                    db, "nope", (DeviceStatus.PLANNED,), DeviceStatus.STAGED
                )
            ),
            InventoryError,
        )
        self.assertEqual(failure.value.kind, "not-found")


class ReleaseTests(SynchronousTestCase):
    """[J1] [C1] The delivery's release moves only planned -> staged."""

    def test_release_afterRetirement_staysDecommissioning(self) -> None:
        """
        [R1] [J1] A retirement that committed between the delivery and
        its record is not undone: the device stays decommissioning, the
        delivery is recorded and released with status_kept.
        """
        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        flaky = FlakyInventory(fleet.inventory, failures=1)
        fleet.registry.releaser._inventory = flaky  # the first record fails
        (run,) = fleet.provision(device("w1", "SER1"))
        outcome, _ = fleet.fetch(run.code)
        self.assertEqual(outcome, Outcome.DELIVER)
        _setStatus(fleet, "w1", DeviceStatus.DECOMMISSIONING)
        fleet.clock.advance(1)  # the retry commits now
        self.assertEqual(fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        self.assertEqual(_released(fleet, run.run), {"status_kept": True})
        released = self.successResultOf(fleet.inventory.releasedRuns())
        self.assertIn(run.run, released)  # the served record is durable anyway

    def test_releaseRetry_afterApproval_staysActive(self) -> None:
        """
        [K2] [J1] A release retried after the kubelet's first certificate
        moved the device to active leaves it active (renewals would be
        refused as staged otherwise).
        """
        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        fleet.registry.releaser._inventory = FlakyInventory(fleet.inventory, 1)
        (run,) = fleet.provision(device("w1", "SER1"))
        fleet.fetch(run.code)
        _setStatus(fleet, "w1", DeviceStatus.ACTIVE)
        fleet.clock.advance(1)
        self.assertEqual(fleet.status("w1"), DeviceStatus.ACTIVE)

    def test_release_planned_staged(self) -> None:
        """[J1] The ordinary case still stages a planned device."""
        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        (run,) = fleet.provision(device("w1", "SER1"))
        fleet.fetch(run.code)
        self.assertEqual(fleet.status("w1"), DeviceStatus.STAGED)
        self.assertEqual(_released(fleet, run.run), {"status": "staged"})


class ProvisionRaceTests(SynchronousTestCase):
    """[R1] [J1] The provision checks decommissioning inside its transaction."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))

    def test_provision_retiredSinceRead_refusedNothingChanges(self) -> None:
        """
        [R1] [J1] A retirement that committed after the caller read the
        device refuses the provision: no run, no files, still
        decommissioning.
        """
        stale = self.successResultOf(self.fleet.inventory.get("w1"))
        _setStatus(self.fleet, "w1", DeviceStatus.DECOMMISSIONING)
        d = Deferred.fromCoroutine(
            self.fleet.registry.provision(
                [stale],
                actor="owner:test",
                render=lambda d, run: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run)
                ),
            )
        )
        self.failureResultOf(d, Decommissioning)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        self.assertIsNone(self.fleet.registry.current("w1"))
        self.assertEqual(self.fleet.vault.names(), [])
        self.assertNotIn("run.provisioned", self.fleet.events("w1"))

    def test_provisionHTTP_retiredDuringRequest_409OneLine(self) -> None:
        """
        [R1] Over the admin API the race is a one-line 409, journaled as
        provision.refused.
        """
        fleet = self.fleet

        class Stale:
            """The inventory answering the read from before the retirement."""

            def __init__(self) -> None:
                self.before = fleet.test.successResultOf(fleet.inventory.get("w1"))

            def get(self, name: str) -> Deferred[Any]:
                _setStatus(fleet, "w1", DeviceStatus.DECOMMISSIONING)
                return Deferred.fromCoroutine(_value(self.before))

            def bySerial(self, serial: str) -> Deferred[Any]:
                return fleet.inventory.bySerial(serial)  # the serial check

        resource = ProvisionResource(
            fleet.registry,
            Stale(),  # type: ignore[arg-type]
            RENDERER,
            fleet.journal,
            ownerName=lambda request: "jane",
        )
        request: Any = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(b'{"devices": ["w1"]}')
        resource.render(request)
        self.assertEqual(request.responseCode, 409)
        body = b"".join(request.written).decode()
        self.assertEqual(body.count("\n"), 1, body)
        self.assertIn("decommissioning", body)
        self.assertIn("provision.refused", fleet.events("w1"))
        self.assertEqual(fleet.status("w1"), DeviceStatus.DECOMMISSIONING)


async def _value(value: Any) -> Any:
    return value


class NetBoxTransitionTests(SynchronousTestCase):
    """The NetBox backend: compare with what fleetd knows, decide at push."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.w1 = seedFake(self.rig.fake, W1)
        self.inventory = self.rig.inventory

    def queue(self, status: DeviceStatus) -> None:
        self.rig.runner.run(lambda db: self.inventory.setStatusIn(db, "w1", status))

    def test_transition_pendingDecommissioning_refused(self) -> None:
        """[R1] A pending retirement is not overwritten by active."""
        self.rig.http.down = True  # keep the retirement pending
        self.queue(DeviceStatus.DECOMMISSIONING)
        moved = self.successResultOf(
            self.rig.runner.run(
                lambda db: self.inventory.transitionIn(
                    db, "w1", (DeviceStatus.STAGED,), DeviceStatus.ACTIVE
                )
            )
        )
        self.assertFalse(moved)
        statuses = self.successResultOf(self.rig.runner.run(pendingStatuses))
        self.assertEqual(statuses, {"w1": DeviceStatus.DECOMMISSIONING})

    def test_release_pendingDecommissioning_readsDecommissioning(self) -> None:
        """
        [R1] [J1] A release of a retired device queues its record but not
        staged: reads keep showing decommissioning, NetBox ends so.
        """
        self.queue(DeviceStatus.DECOMMISSIONING)
        record = ServedRecord("r-1", "w1", 5.0, "p")
        moved = self.successResultOf(
            self.rig.runner.run(lambda db: self.inventory.releaseIn(db, record))
        )
        self.assertFalse(moved)
        got = self.successResultOf(self.inventory.get("w1"))
        assert got is not None
        self.assertEqual(got.status, DeviceStatus.DECOMMISSIONING)
        self.rig.settle()
        stored = self.rig.fake.devices[self.w1]
        self.assertEqual(stored["status"], "decommissioning")
        self.assertEqual(stored["custom_fields"]["fleetd_release"]["run"], "r-1")


class ApprovalRaceTests(SynchronousTestCase):
    """[K2] [R1] The first kubelet approval never overwrites a retirement."""

    def test_firstCSR_retiredSinceRead_staysDecommissioning(self) -> None:
        """
        [K2] [R1] [J1] A retirement that commits after the approver looked
        at the device (or at any point before its transaction) is kept:
        the approval is recorded, the device stays decommissioning.
        """
        from tests.kubesupport import KubeFleet

        class RetiredInBetween:
            """Reads answer from before the retirement; it lands right after."""

            def __init__(self, inner: Any) -> None:
                self.inner = inner
                self.retired = False

            def retire(self, db: Any) -> None:
                if not self.retired:
                    self.retired = True
                    db.execute(
                        "UPDATE devices SET status = 'decommissioning'"
                        " WHERE name = 'w1'"
                    )

            def get(self, name: str) -> Deferred[Any]:
                d: Deferred[Any] = self.inner.get(name)
                fleet.runner.run(self.retire)
                return d

            def transitionIn(self, db: Any, *args: Any) -> bool:
                self.retire(db)
                moved: bool = self.inner.transitionIn(db, *args)
                return moved

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

        # The approver is built with it; it is first asked about the CSR.
        fleet = KubeFleet(self, approverInventory=RetiredInBetween)
        self.addCleanup(fleet.stopKube)
        fleet.add(device("w1", "SER1"))
        (run,) = fleet.provision(device("w1", "SER1"))
        bearer = fleet.bearer(run.run)
        fleet.fetch(run.code)
        csr = fleet.fileCSR(bearer, "w1")
        self.assertTrue(fleet.approved(csr["metadata"]["name"]))
        self.assertEqual(len(fleet.entries("kube.csr-approved")), 1)
        self.assertEqual(fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
