"""
[J1] No change without its record: every kind of change, with a failing
journal, database or vault injected. Each time nothing changes, the caller
gets one clear error, and no alert fires.
"""

from __future__ import annotations

import io
import sqlite3
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd.inventory.model import DeviceStatus, InventoryError
from fleetd.runs.alerts import MISSING, REFETCHED
from fleetd.runs.machine import Outcome
from fleetd.runs.vaultnames import codeName, configName, servedName
from fleetd.store.db import StoreError
from fleetd.store.entries import Entry
from fleetd.vault import VaultError
from tests.faultsupport import FAULTS, Faults, FullVault
from tests.fleetsupport import DEV_VALUES, Fleet, device


class ProvisionFaultTests(SynchronousTestCase):
    """[J1] A provision that cannot be recorded changes nothing."""

    def setUp(self) -> None:
        self.vault = FullVault()
        self.fleet = Fleet(self)
        self.fleet.registry.stop()
        self.fleet.start(vault=self.vault)
        self.fleet.add(device("w1", "SER1"))
        (self.old,) = self.fleet.provision(device("w1", "SER1"))
        self.faults = Faults(self.fleet)

    def provision(self) -> Deferred[Any]:
        from fleetd.runs.render import NodeFacts
        from tests.fleetsupport import RENDERER

        return Deferred.fromCoroutine(
            self.fleet.registry.provision(
                [device("w1", "SER1")],
                actor="owner:test",
                render=lambda d, run: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run)
                ),
            )
        )

    def assertUnchanged(self) -> None:
        registry = self.fleet.registry
        self.assertEqual(registry.readyRun("w1"), self.old.run)
        self.assertEqual(
            self.vault.names(), [codeName(self.old.run), configName(self.old.run)]
        )
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        self.assertEqual(self.fleet.events("w1"), ["run.provisioned"])
        self.assertEqual(self.fleet.alerts.openFor("w1"), [])

    def check(self, kind: str) -> None:
        self.faults.inject(kind)
        failure = self.failureResultOf(self.provision())
        self.assertIn(type(failure.value), (StoreError, sqlite3.OperationalError))
        self.faults.clear()
        self.assertUnchanged()
        # A restart after the failure finds the old run ready, not lost: a
        # failed write never looks like a reboot [V4].
        self.fleet.registry.stop()
        self.fleet.db.close()
        self.fleet.start(vault=self.vault)  # fleetd restarts; the tmpfs stays
        self.assertEqual(self.fleet.registry.readyRun("w1"), self.old.run)
        self.assertEqual(self.fleet.fetch(self.old.code)[0], Outcome.DELIVER)

    def test_provision_journalRefuses_nothingChanges(self) -> None:
        """[J1] The journal refuses: the old run stays, no new run, no file."""
        self.check("journal")

    def test_provision_databaseFails_nothingChanges(self) -> None:
        """[J1] The database fails: the old run stays, no new run, no file."""
        self.check("database")

    def test_provision_vaultFull_nothingChanges(self) -> None:
        """[J1] The vault refuses the configuration: nothing is stored."""
        self.vault.full = True
        failure = self.failureResultOf(self.provision(), VaultError)
        self.assertIn("no space", str(failure.value))
        self.vault.full = False
        self.assertUnchanged()
        counted = self.fleet.registry.vaultFailures.labels("config")._value.get()
        self.assertEqual(counted, 1)


class InventoryFaultTests(SynchronousTestCase):
    """[J1] Inventory changes carry their journal entries."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.faults = Faults(self.fleet)

    def test_add_journalRefuses_deviceNotAdded(self) -> None:
        """[J1] A device whose journal entry is refused is not added."""
        for kind in FAULTS:
            self.faults.inject(kind)
            entry = Entry("device.added", actor="owner:jane", device="w1")
            d = self.fleet.inventory.add(device("w1"), journal=[entry])
            failure = self.failureResultOf(d, InventoryError)
            self.assertEqual(failure.value.kind, "unavailable")
            self.faults.clear()
            self.assertEqual(self.successResultOf(self.fleet.inventory.list()), [])
            self.assertEqual(self.fleet.events(), [])

    def test_add_badEntry_deviceNotAdded(self) -> None:
        """[J1] An entry the journal refuses as malformed also stops the change."""
        entry = Entry("device.added", actor="owner:Jane Doe", device="w1")
        d = self.fleet.inventory.add(device("w1"), journal=[entry])
        failure = self.failureResultOf(d, InventoryError)
        self.assertEqual(failure.value.kind, "invalid")
        self.assertIn("journal refused", str(failure.value))
        self.assertEqual(self.successResultOf(self.fleet.inventory.list()), [])

    def test_add_recordedTogether(self) -> None:
        """[J1] A successful add and its entry are in the database together."""
        entry = Entry("device.added", actor="owner:jane", device="w1")
        self.successResultOf(self.fleet.inventory.add(device("w1"), journal=[entry]))
        self.assertEqual(self.fleet.events("w1"), ["device.added"])


class DeliveryFaultTests(SynchronousTestCase):
    """[J1] [C1] A delivery is recorded with its release, retried until it is."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))
        (self.served,) = self.fleet.provision(device("w1", "SER1"))
        self.faults = Faults(self.fleet)

    def test_deliveryRecord_retriedUntilJournalWorks(self) -> None:
        """
        [J1] When the delivery cannot be recorded, the run is still consumed
        (the mark is in the vault), nothing is released, the configuration
        stays in the vault until the record commits, and the record is
        retried until it does: then delivered and released are journaled
        once, together.
        """
        for kind in FAULTS:
            fleet = self.fleet
            self.faults.inject(kind)
            outcome, _ = fleet.fetch(self.served.code)
            self.assertEqual(outcome, Outcome.DELIVER)
            self.assertEqual(fleet.fetch(self.served.code)[0], Outcome.CONSUMED)
            self.assertIn(configName(self.served.run), fleet.vault.names())
            self.faults.clear()
            self.assertEqual(fleet.events("w1"), ["run.provisioned"])
            self.assertEqual(fleet.status("w1"), DeviceStatus.PLANNED)
            fleet.clock.advance(1.0)
            self.assertEqual(
                fleet.events("w1"),
                ["run.provisioned", "run.delivered"],
            )
            self.assertEqual(fleet.status("w1"), DeviceStatus.STAGED)
            self.assertEqual(fleet.vault.names(), [servedName(self.served.run)])
            self.flushLoggedErrors()
            return  # one run can be delivered once; the loop names the kinds

    def test_deliveryRecord_databaseDown_retried(self) -> None:
        """[J1] The same with the database down instead of the journal."""
        self.faults.inject("database")
        self.assertEqual(self.fleet.fetch(self.served.code)[0], Outcome.DELIVER)
        self.fleet.clock.advance(1.0)  # still down: retried later
        self.faults.clear()
        self.assertEqual(self.fleet.events("w1"), ["run.provisioned"])
        self.fleet.clock.advance(2.0)
        self.assertEqual(
            self.fleet.events("w1"),
            ["run.provisioned", "run.delivered"],
        )

    def test_refetchNote_journalRefuses_noAlert(self) -> None:
        """
        [J1] [C2] The first repeat request whose journal entry is refused
        raises no alert and sets no flag; the next request journals it once.
        """
        self.fleet.fetch(self.served.code)
        self.faults.inject("journal")
        self.assertEqual(self.fleet.fetch(self.served.code)[0], Outcome.CONSUMED)
        self.assertFalse(self.fleet.alerts.active(REFETCHED, "w1"))
        self.faults.clear()
        self.assertEqual(self.fleet.fetch(self.served.code)[0], Outcome.CONSUMED)
        self.assertTrue(self.fleet.alerts.active(REFETCHED, "w1"))
        self.fleet.fetch(self.served.code)
        self.assertEqual(self.fleet.events("w1").count("config.refetched"), 1)
        self.flushLoggedErrors()

    def test_missingNote_databaseFails_noAlert(self) -> None:
        """[J1] [V4] A lost run's first request that cannot be stored: no alert."""
        self.fleet.restart(wipeVault=True)
        self.faults = Faults(self.fleet)
        self.faults.inject("database")
        self.assertEqual(self.fleet.fetch(self.served.code)[0], Outcome.LOST)
        self.assertFalse(self.fleet.alerts.active(MISSING, "w1"))
        self.faults.clear()
        self.fleet.fetch(self.served.code)
        self.assertTrue(self.fleet.alerts.active(MISSING, "w1"))
        self.flushLoggedErrors()


class ProvisionHTTPFaultTests(SynchronousTestCase):
    """[J1] Over the admin API, a refused record is one clear line."""

    def test_provision_journalRefuses_503OneLine(self) -> None:
        """[J1] The owner gets a one-line 503 saying nothing changed."""
        from fleetd.admin.provision import ProvisionResource
        from fleetd.runs.render import TemplateRenderer
        from tests.support import REPO

        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        faults = Faults(fleet)
        faults.inject("journal")
        resource = ProvisionResource(
            fleet.registry,
            fleet.inventory,
            TemplateRenderer(REPO / "conf" / "templates", values=DEV_VALUES),
            fleet.journal,
            ownerName=lambda request: "jane",
        )
        request: Any = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(b'{"devices": ["w1"]}')
        resource.render(request)
        self.assertEqual(request.responseCode, 503)
        body = b"".join(request.written).decode()
        self.assertEqual(body.count("\n"), 1, body)
        self.assertIn("nothing changed", body)
        self.assertIsNone(fleet.registry.readyRun("w1"))
        self.assertEqual(fleet.vault.names(), [])


class ReviewFaultTests(SynchronousTestCase):
    """Races and leftovers a review found in the [J1] rework."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))
        (self.old,) = self.fleet.provision(device("w1", "SER1"))
        self.faults = Faults(self.fleet)

    def failDeliveries(self) -> None:
        self.faults.journal.onlyEvents = frozenset({"run.delivered"})
        self.faults.journal.failing = StoreError("disk I/O error")

    def supersedeInDatabaseOnly(self) -> None:
        """A provision that committed ahead of a record, in the same batch."""
        from fleetd.runs.store import RunRecord, insertRuns

        newer = RunRecord("r-00000000000000ff", "w1", "d" * 64, 5.0)
        self.successResultOf(self.fleet.runner.run(lambda db: insertRuns(db, [newer])))

    def delivered(self, run: str) -> list[Any]:
        entries = self.successResultOf(self.fleet.journal.query(run=run))
        return [e for e in entries if e.event == "run.delivered"]

    def test_record_afterSupersedeInSameBatch_notReleased(self) -> None:
        """
        [J1] A delivery recorded after a provision that superseded its run
        committed (same group commit) is journaled as superseded and
        releases nothing: the device stays planned for the newer run.
        """
        self.failDeliveries()
        self.assertEqual(self.fleet.fetch(self.old.code)[0], Outcome.DELIVER)
        self.supersedeInDatabaseOnly()
        self.faults.clear()
        self.fleet.clock.advance(1.0)
        (entry,) = self.delivered(self.old.run)
        self.assertIs(entry.fields["superseded"], True)
        self.assertNotIn("status", entry.fields)  # released to nobody
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        self.flushLoggedErrors()

    def test_requestNote_afterSupersede_noStoredAlert(self) -> None:
        """[V6] [J1] A note racing a recovery provision stores no alert row."""
        from fleetd.runs.alerts import loadAlerts

        self.fleet.fetch(self.old.code)
        self.supersedeInDatabaseOnly()
        self.assertEqual(self.fleet.fetch(self.old.code)[0], Outcome.CONSUMED)
        rows = self.successResultOf(self.fleet.runner.run(loadAlerts))
        self.assertEqual(rows, [])
        self.assertNotIn("config.refetched", self.fleet.events("w1"))

    def test_supersede_keepsMarkUntilDeliveryRecorded(self) -> None:
        """
        [J1] Superseding a consumed run whose delivery is not yet recorded
        keeps its served mark until the record commits, then removes it.
        """
        self.failDeliveries()
        self.fleet.fetch(self.old.code)
        (new,) = self.fleet.provision(device("w1", "SER1"))
        self.assertIn(servedName(self.old.run), self.fleet.vault.names())
        self.assertNotIn(configName(self.old.run), self.fleet.vault.names())
        self.faults.clear()
        self.fleet.clock.advance(1.0)
        self.assertEqual(
            self.fleet.vault.names(), [codeName(new.run), configName(new.run)]
        )
        (entry,) = self.delivered(self.old.run)
        self.assertIs(entry.fields["superseded"], True)
        self.flushLoggedErrors()

    def test_strayMarkAtStart_recordedThenRemoved(self) -> None:
        """
        [J1] [C1] fleetd stopped after a provision superseded a delivered run
        whose record had not committed: the next start records the delivery
        (as superseded) before the mark's file goes.
        """
        self.failDeliveries()
        self.fleet.fetch(self.old.code)
        (new,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.restart()  # the faulty journal goes with the old process
        (entry,) = self.delivered(self.old.run)
        self.assertIs(entry.fields["superseded"], True)
        self.assertEqual(
            self.fleet.vault.names(), [codeName(new.run), configName(new.run)]
        )
        self.fleet.restart()
        self.assertEqual(len(self.delivered(self.old.run)), 1)
        self.flushLoggedErrors()

    def test_configVanished_lostNotAbortedLoop(self) -> None:
        """
        [V4] A configuration that leaves the vault while fleetd runs makes
        the run lost (with its alert), not "aborted" on every request.
        """
        self.fleet.vault.delete(configName(self.old.run))
        for _ in range(3):
            self.assertEqual(self.fleet.fetch(self.old.code)[0], Outcome.LOST)
        self.assertTrue(self.fleet.alerts.active(MISSING, "w1"))
        events = self.fleet.events("w1")
        self.assertEqual(events.count("config.missing"), 1)
        self.assertNotIn("run.delivery-aborted", events)
        self.assertNotIn(servedName(self.old.run), self.fleet.vault.names())

    def test_abortedDeliveries_journalThrottled(self) -> None:
        """
        Whoever holds a code can abort deliveries at will: one
        run.delivery-aborted entry per run per 10 minutes, with a count.
        """
        for _ in range(3):
            self.fleet.fetch(self.old.code, complete=False)
        self.fleet.clock.advance(600)
        self.fleet.fetch(self.old.code, complete=False)
        entries = self.successResultOf(self.fleet.journal.query(run=self.old.run))
        aborted = [e for e in entries if e.event == "run.delivery-aborted"]
        self.assertEqual([e.fields["aborts"] for e in aborted], ["1", "3"])

    def test_provision_journalRefusesEntry_400OneLine(self) -> None:
        """[J1] An entry the journal refuses is one clear 400 line, not a 500."""
        from fleetd.admin.provision import ProvisionResource
        from fleetd.runs.render import TemplateRenderer
        from fleetd.store.entries import JournalRefused
        from tests.support import REPO

        self.faults.journal.failing = JournalRefused("field looks like a secret")
        resource = ProvisionResource(
            self.fleet.registry,
            self.fleet.inventory,
            TemplateRenderer(REPO / "conf" / "templates", values=DEV_VALUES),
            self.fleet.journal,
            ownerName=lambda request: "jane",
        )
        request: Any = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(b'{"devices": ["w1"]}')
        resource.render(request)
        body = b"".join(request.written).decode()
        self.assertEqual((request.responseCode, body.count("\n")), (400, 1), body)
        self.assertIn("the journal refused", body)
        self.assertEqual(self.fleet.registry.readyRun("w1"), self.old.run)
