"""
Retirement ends the device's run and journals the Node deletion (review
H2, M3; formerly the probe test_review_retire).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from fleetd.fleet.retire import RetireService, retireService
from fleetd.inventory.model import DeviceStatus
from fleetd.k8s.errors import KubeUnavailable
from fleetd.runs.machine import Outcome
from fleetd.runs.provision import RETIRED
from fleetd.runs.vaultnames import codeName, configName, servedName
from fleetd.store.db import StoreError
from tests.faultsupport import Faults
from tests.fleetsupport import Fleet, device
from tests.kubesupport import KubeFleet


def _retirer(fleet: Fleet) -> RetireService:
    return retireService(
        None,
        clock=fleet.clock,
        inventory=fleet.inventory,
        journal=fleet.journal,
        runs=fleet.registry,
    )


def _retire(fleet: Fleet) -> Deferred[Any]:
    return Deferred.fromCoroutine(_retirer(fleet).retire("w1", "owner:t"))


class RetireRunTests(SynchronousTestCase):
    """[R1] [C1] [J1] A retirement supersedes the device's current run."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))
        (self.first,) = self.fleet.provision(device("w1", "SER1"))

    def test_retire_readyRun_codeStopsFilesGo(self) -> None:
        """
        [R1] [C1] [J1] After a retirement the ready run's code is refused
        (superseded), its files leave the vault, the device stays
        decommissioning, and run.superseded by retired is journaled with
        device.retired in one transaction.
        """
        self.successResultOf(_retire(self.fleet))
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertIsNone(self.fleet.registry.current("w1"))
        outcome, body = self.fleet.fetch(self.first.code)
        self.assertEqual((outcome, body), (Outcome.SUPERSEDED, None))
        self.assertEqual(self.fleet.vault.names(), [])
        self.fleet.clock.advance(5)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        entries = self.successResultOf(self.fleet.journal.query(device="w1"))
        (superseded,) = [e for e in entries if e.event == "run.superseded"]
        (retired,) = [e for e in entries if e.event == "device.retired"]
        self.assertEqual(superseded.fields["by"], RETIRED)
        self.assertEqual(superseded.run, self.first.run)
        self.assertEqual(superseded.at, retired.at)

    def test_retire_planCarriesNoCode(self) -> None:
        """
        [R1] [C1] A retired device gets no install plan (so no META 0x0b
        code): the plan is refused C{device-retired}, and the run it would
        have named has ended.
        """
        from fleetd.attest.identity import LDevIDBook, Peer
        from fleetd.attest.lookup import LookupService
        from fleetd.nodes import NodeIdentity, Refused

        class Attestation:
            async def refuse(self, refusal: Any, **kw: Any) -> Any:
                return refusal

        self.successResultOf(_retire(self.fleet))
        lookups = LookupService(
            runner=self.fleet.runner,
            attestation=Attestation(),  # type: ignore[arg-type]
            book=LDevIDBook(),
            getDevice=self.fleet.inventory.get,
            runs=self.fleet.registry,
            vault=self.fleet.vault,
            targetDiskFor=lambda db, d: None,
        )
        peer = Peer(NodeIdentity("w1", "SER1"), None, "CN=x", False)  # type: ignore[arg-type]
        failure = self.failureResultOf(
            Deferred.fromCoroutine(lookups.plan(peer)), Refused
        )
        self.assertEqual(failure.value.reason, "device-retired")
        self.assertIsNone(self.fleet.registry.readyRun("w1"))

    def test_retire_survivesRestart(self) -> None:
        """[R1] [C1] After a restart the retired run's code is still refused."""
        self.successResultOf(_retire(self.fleet))
        self.fleet.restart()
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertIsNone(self.fleet.registry.byCode(self.first.code))

    def test_retire_duringDelivery_recordedNotReleased(self) -> None:
        """
        [R1] [J1] A delivery in flight when the retirement commits finishes,
        is journaled as superseded and releases nothing: the device stays
        decommissioning; the served mark goes only after that record.
        """
        registry = self.fleet.registry
        run = registry.byCode(self.first.code)
        assert run is not None
        outcome, _ = registry.request(run, "127.0.0.1")
        self.assertEqual(outcome, Outcome.DELIVER)
        self.successResultOf(_retire(self.fleet))
        self.assertEqual(self.fleet.vault.names(), [servedName(self.first.run)])
        registry.finished(run, complete=True)
        self.fleet.clock.advance(5)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.DECOMMISSIONING)
        entries = self.successResultOf(self.fleet.journal.query(run=self.first.run))
        (delivered,) = [e for e in entries if e.event == "run.delivered"]
        self.assertTrue(delivered.fields["superseded"])
        self.assertNotIn("status", delivered.fields)  # released to nobody
        self.assertEqual(self.fleet.vault.names(), [])

    def test_retire_journalFails_runStillReady(self) -> None:
        """
        [J1] The retirement cannot be recorded: the run stays ready, its
        files stay, the device keeps its status.
        """
        faults = Faults(self.fleet)
        faults.inject("journal")
        self.failureResultOf(_retire(self.fleet), StoreError)
        faults.clear()
        self.assertEqual(self.fleet.registry.readyRun("w1"), self.first.run)
        self.assertEqual(
            self.fleet.vault.names(),
            [codeName(self.first.run), configName(self.first.run)],
        )
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        self.assertNotIn("run.superseded", self.fleet.events("w1"))


class NodeDeletionJournalTests(SynchronousTestCase):
    """[R1] [J1] The Node deletion is never left out of the journal (M3)."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"))
        self.fleet.provision(device("w1", "SER1"))
        self.fleet.fake.addNode("w1")
        self.fleet.fake.flush()

    def retire(self) -> Deferred[Any]:
        d = Deferred.fromCoroutine(self.fleet.retirer.retire("w1", "owner:o"))
        self.fleet.fake.flush()
        return d

    def test_retire_journalsIntentBeforeDeletion(self) -> None:
        """[R1] [J1] kube.node-delete-requested comes before device.retired."""
        self.successResultOf(self.retire())
        events = self.fleet.events("w1")
        self.assertLess(
            events.index("kube.node-delete-requested"),
            events.index("device.retired"),
        )
        self.assertNotIn("w1", self.fleet.fake.nodes)

    def test_retire_commitFails_deletionJournaled(self) -> None:
        """
        [R1] [J1] The Node went but the retirement's commit failed: the
        journal holds the request and its outcome; the device and run are
        unchanged, so the owner retires again.
        """
        faults = self.fleet.faults()
        faults.journal.onlyEvents = frozenset({"device.retired"})
        faults.journal.failing = StoreError("journal head is not authentic")
        self.failureResultOf(self.retire(), StoreError)
        faults.clear()
        self.assertNotIn("w1", self.fleet.fake.nodes)
        (outcome,) = self.fleet.entries("kube.node-deleted")
        self.assertEqual(
            (outcome.device, outcome.fields["node_deleted"], outcome.fields["retired"]),
            ("w1", True, False),
        )
        self.assertEqual(len(self.fleet.entries("kube.node-delete-requested")), 1)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        self.assertIsNotNone(self.fleet.registry.readyRun("w1"))

    def test_retire_intentNotJournaled_nodeKept(self) -> None:
        """[J1] The intent cannot be journaled: the Node is not touched."""
        faults = self.fleet.faults()
        faults.inject("journal")
        self.failureResultOf(self.retire(), StoreError)
        faults.clear()
        self.assertIn("w1", self.fleet.fake.nodes)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)

    def test_retire_apiDown_intentOnly(self) -> None:
        """[R1] The API is down: the intent is journaled, nothing else changes."""
        self.fleet.fake.reachable = False
        self.failureResultOf(self.retire(), KubeUnavailable)
        self.assertEqual(len(self.fleet.entries("kube.node-delete-requested")), 1)
        self.assertEqual(self.fleet.entries("device.retired"), [])
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)


class RetireHTTPTests(SynchronousTestCase):
    """[R1] Over the admin API."""

    def test_retire_runsStillLoading_503OneLine(self) -> None:
        """[R1] Right after a start (runs loading) a retirement is a one-line 503."""
        import io

        from twisted.web.test.requesthelper import DummyRequest

        from fleetd.admin.kube import retireResource

        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        fleet.registry.index.loaded = False
        resource = retireResource(_retirer(fleet), owner=lambda request: "jane")
        request: Any = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(b'{"device": "w1"}')
        resource.render(request)
        self.assertEqual(request.responseCode, 503)
        body = b"".join(request.written).decode()
        self.assertEqual(body.count("\n"), 1, body)
        self.assertIn("nothing changed", body)
        self.assertEqual(fleet.status("w1"), DeviceStatus.INVENTORY)


class Part:
    """An L{IRetirementPart} that journals its intent and remembers each call."""

    def __init__(self, key: str, view: dict[str, Any] | None) -> None:
        self.answerKey = key
        self._view = view
        self.refusal: Exception | None = None
        self.calls: list[tuple[str, Any]] = []

    def recordRetirement(
        self, db: Any, journal: Any, device: str, actor: str, at: float
    ) -> Any:
        if self.refusal is not None:
            raise self.refusal
        journal(
            "part.recorded", actor=actor, device=device, fields={"part": self.answerKey}
        )
        self.calls.append(("recorded", device))
        return (self.answerKey, device, at)

    def committed(self, recorded: Any) -> None:
        self.calls.append(("committed", recorded))

    def settled(self, devices: Any) -> Deferred[Any]:
        self.calls.append(("settled", list(devices)))
        return succeed(None)

    def view(self, device: str) -> dict[str, Any] | None:
        self.calls.append(("view", device))
        return self._view


class RetirementPartTests(SynchronousTestCase):
    """
    [R1] [J1] Each L{IRetirementPart} joins the retirement's one
    transaction, follows after its commit, and is told in the answer.
    """

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))
        (self.first,) = self.fleet.provision(device("w1", "SER1"))
        self.keys = Part("keys", {"destroyed": True})
        self.quiet = Part("quiet", None)

    def retire(self) -> Deferred[Any]:
        retirer = retireService(
            None,
            clock=self.fleet.clock,
            inventory=self.fleet.inventory,
            journal=self.fleet.journal,
            runs=self.fleet.registry,
            parts=[self.keys, self.quiet],
        )
        return Deferred.fromCoroutine(retirer.retire("w1", "owner:t"))

    def test_parts_inTheTransaction_thenCommitted_thenAnswered(self) -> None:
        """
        Each part records in the retirement's transaction (its entries
        with device.retired, after what cannot be revoked, in the parts'
        order), hears committed with what it recorded, is settled, and its
        view is the answer's under its key (none when it has nothing).
        """
        retired = self.successResultOf(self.retire())
        entries = self.successResultOf(self.fleet.journal.query(device="w1"))
        start = [e.event for e in entries].index("run.superseded")
        inTransaction = entries[start:]
        self.assertEqual({e.at for e in inTransaction}, {entries[-1].at})
        self.assertEqual(
            [(e.event, e.fields.get("part")) for e in inTransaction],
            [
                ("run.superseded", None),
                ("device.retired", None),
                ("kube.unrevocable", None),
                ("kube.unrevocable", None),
                ("part.recorded", "keys"),
                ("part.recorded", "quiet"),
            ],
        )
        at = entries[-1].at
        self.assertEqual(
            self.keys.calls,
            [
                ("recorded", "w1"),
                ("committed", ("keys", "w1", at)),
                ("settled", ["w1"]),
                ("view", "w1"),
            ],
        )
        answer = retired.toJSON()
        self.assertEqual(answer["keys"], {"destroyed": True})
        self.assertNotIn("quiet", answer)
        self.assertEqual(list(answer)[:2], ["keys", "device"])

    def test_partRefuses_nothingChanged(self) -> None:
        """
        [J1] A part that cannot record its intent refuses the retirement:
        the run stays ready, the device keeps its status, nothing is
        journaled, and no part hears committed.
        """
        self.quiet.refusal = StoreError("the key store is down")
        self.failureResultOf(self.retire(), StoreError)
        self.assertEqual(self.fleet.registry.readyRun("w1"), self.first.run)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        self.assertNotIn("device.retired", self.fleet.events("w1"))
        self.assertNotIn("part.recorded", self.fleet.events("w1"))
        self.assertEqual(self.keys.calls, [("recorded", "w1")])
        self.assertEqual(self.quiet.calls, [])

    def test_journalFails_partsNotCommitted(self) -> None:
        """[J1] The transaction fails: the parts recorded nothing that stands."""
        faults = Faults(self.fleet)
        faults.inject("journal")
        self.failureResultOf(self.retire(), StoreError)
        faults.clear()
        self.assertNotIn(("committed",), [c[:1] for c in self.keys.calls])
        self.assertEqual(self.fleet.registry.readyRun("w1"), self.first.run)
