"""
Tests for provision runs: the delivery machine and the registry.

Synchronous: an InlineRunner over a real SQLite file, the real inventory,
a task.Clock, and a MemoryVault or DirectoryVault.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import (
    DeviceStatus,
)
from fleetd.runs.alerts import MISSING, REFETCHED
from fleetd.runs.codes import codeDigest, mintCode, wellFormedCode
from fleetd.runs.issued import IssuedDigests
from fleetd.runs.machine import Outcome, RunEffects, RunMachine, delivering, ready
from fleetd.runs.render import NodeFacts
from fleetd.runs.vaultnames import codeName, configName, servedName
from fleetd.store.runner import InlineRunner
from fleetd.vault import MemoryVault
from tests.fleetsupport import KEY, RENDERER, FlakyInventory, Fleet, device


class CodeTests(SynchronousTestCase):
    def test_mintCode_entropyAndAlphabet(self) -> None:
        """[C1] Codes carry 192 random bits, URL-safe, and never repeat."""
        codes = {mintCode() for _ in range(1000)}
        self.assertEqual(len(codes), 1000)
        for code in codes:
            self.assertEqual(len(code), 32)
            self.assertTrue(wellFormedCode(code))

    def test_digest_keyed(self) -> None:
        """Digests depend on the key, so a database copy reveals no code."""
        code = mintCode()
        self.assertNotEqual(codeDigest(b"a" * 32, code), codeDigest(b"b" * 32, code))
        self.assertNotIn(code, codeDigest(KEY, code))


class MachineTests(SynchronousTestCase):
    class Effects(RunEffects):
        def __init__(self) -> None:
            self.calls: list[str] = []

        def markServed(self, peer: str) -> None:
            self.calls.append(f"markServed {peer}")

        def withdrawServed(self) -> None:
            self.calls.append("withdrawServed")

        def dropMark(self) -> None:
            self.calls.append("dropMark")

        def delivered(self) -> None:
            self.calls.append("delivered")

        def deliveredSuperseded(self) -> None:
            self.calls.append("deliveredSuperseded")

        def noteRefetch(self, peer: str) -> None:
            self.calls.append(f"noteRefetch {peer}")

        def noteMissing(self, peer: str) -> None:
            self.calls.append(f"noteMissing {peer}")

        def dropConfig(self) -> None:
            self.calls.append("dropConfig")

        def dropAll(self) -> None:
            self.calls.append("dropAll")

    def test_readyRequest_marksBeforeDelivering(self) -> None:
        """
        [C1] request in ready writes the served mark, then says DELIVER; a
        second connection meanwhile is BUSY, which is no refetch.
        """
        effects = self.Effects()
        machine = RunMachine(effects, ready)
        self.assertEqual(machine.request("10.0.0.1"), Outcome.DELIVER)
        self.assertEqual(effects.calls, ["markServed 10.0.0.1"])
        self.assertEqual(machine.request("10.0.0.2"), Outcome.BUSY)
        machine.aborted()
        self.assertEqual(effects.calls, ["markServed 10.0.0.1", "withdrawServed"])
        self.assertTrue(machine.deliverable())

    def test_sent_consumes(self) -> None:
        """[C1] Once sent, a run is never delivered again."""
        effects = self.Effects()
        machine = RunMachine(effects, delivering)
        machine.sent()
        self.assertEqual(effects.calls, ["delivered"])
        for _ in range(3):
            self.assertEqual(machine.request("10.0.0.1"), Outcome.CONSUMED)
        self.assertFalse(machine.deliverable())

    def test_supersedeInFlight_journaledNotReleased(self) -> None:
        """A delivery in flight when superseded is recorded, never released."""
        for ending, call in (("sent", "deliveredSuperseded"), ("aborted", "dropAll")):
            effects = self.Effects()
            machine = RunMachine(effects, delivering)
            machine.supersede()
            self.assertEqual(machine.request("x"), Outcome.SUPERSEDED)
            getattr(machine, ending)()
            self.assertEqual(effects.calls, ["dropConfig", call])
            self.assertEqual(machine.request("x"), Outcome.SUPERSEDED)


class RegistryTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"))

    def test_provision_storesDigestNotCode(self) -> None:
        """A run puts the config in the vault and only a keyed digest on disk."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.assertTrue(wellFormedCode(run.code))
        config = self.fleet.vault.get(configName(run.run))
        assert config is not None
        self.assertIn(b"hostname: w1", config)
        self.assertIn(b"fleetd.io/run: " + run.run.encode(), config)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        self.fleet.db.close()
        for f in self.fleet.directory.iterdir():
            if f.is_file():
                self.assertNotIn(run.code.encode(), f.read_bytes(), f)
        self.fleet.start()

    def test_deliver_once(self) -> None:
        """[C1] The first request is delivered; every later one is 410 consumed."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        config = self.fleet.vault.get(configName(run.run))
        outcome, body = self.fleet.fetch(run.code)
        self.assertEqual(outcome, Outcome.DELIVER)
        self.assertEqual(body, config)
        self.assertIsNotNone(self.fleet.vault.get(servedName(run.run)))
        # Never served again, so the secret leaves the vault; the mark stays.
        self.assertIsNone(self.fleet.vault.get(configName(run.run)))
        for _ in range(3):
            self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_release_afterDelivery(self) -> None:
        """After delivery the served record is released and the device is staged."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        released = self.successResultOf(self.fleet.inventory.releasedRuns())
        self.assertEqual(released, {run.run})
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.STAGED)
        self.assertEqual(
            self.fleet.events("w1"),
            ["run.provisioned", "run.delivered"],
        )

    def test_release_retriedWhileInventoryDown(self) -> None:
        """Release retries with backoff until the inventory answers; stop cancels."""
        flaky = FlakyInventory(self.fleet.inventory, failures=2)
        self.fleet.registry.stop()
        self.fleet.start(vault=self.fleet.vault, inventory=flaky)
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        self.assertEqual(self.fleet.registry.releaser.pending(), 1)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        self.fleet.clock.advance(1)
        self.assertEqual(self.fleet.registry.releaser.pending(), 1)
        self.fleet.clock.advance(2)
        self.assertEqual(self.fleet.registry.releaser.pending(), 0)
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.STAGED)
        flaky.failures = 5
        (second,) = self.fleet.provision(device("w2", "SER2"))
        self.fleet.fetch(second.code)
        self.assertEqual(len(self.fleet.clock.getDelayedCalls()), 1)
        self.fleet.registry.stop()
        self.assertEqual(self.fleet.clock.getDelayedCalls(), [])

    def test_aborted_withdrawsMark(self) -> None:
        """[C1] A connection failing before the response completes consumes nothing."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.assertEqual(self.fleet.fetch(run.code, complete=False)[0], Outcome.DELIVER)
        self.assertIsNone(self.fleet.vault.get(servedName(run.run)))
        self.assertEqual(self.fleet.registry.readyRun("w1"), run.run)
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.DELIVER)
        self.assertIn("run.delivery-aborted", self.fleet.events("w1"))

    def test_refetch_journalsFirstAndAlerts(self) -> None:
        """[C2] Repeats: journal the first only; the alert holds while they continue."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        for _ in range(3):
            self.fleet.fetch(run.code)
            self.fleet.clock.advance(600)
        self.assertEqual(self.fleet.events("w1").count("config.refetched"), 1)
        self.assertTrue(self.fleet.alerts.active(REFETCHED, "w1"))
        self.fleet.clock.advance(301)
        self.assertFalse(self.fleet.alerts.active(REFETCHED, "w1"))

    def test_refetch_regardlessOfStatus(self) -> None:
        """[C2] A consumed code is refused whatever the device status says."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        self.successResultOf(
            self.fleet.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_supersede(self) -> None:
        """[V5][C3] A new provision supersedes the old run and clears the alerts."""
        (old,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(old.code)
        self.fleet.fetch(old.code)
        self.assertTrue(self.fleet.alerts.active(REFETCHED, "w1"))
        (new,) = self.fleet.provision(device("w1", "SER1"))
        self.assertFalse(self.fleet.alerts.active(REFETCHED, "w1"))
        self.assertEqual(self.fleet.fetch(old.code)[0], Outcome.SUPERSEDED)
        self.assertEqual(self.fleet.fetch(new.code)[0], Outcome.DELIVER)
        self.assertIn("run.superseded", self.fleet.events("w1"))

    def test_supersedeReady_dropsOldConfig(self) -> None:
        """A superseded run's configuration leaves the vault."""
        (old,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.provision(device("w1", "SER1"))
        self.assertIsNone(self.fleet.vault.get(configName(old.run)))

    def test_rack_oneRunPerDevice(self) -> None:
        """Provisioning several devices gives each its own run and code."""
        runs = self.fleet.provision(device("w1", "SER1"), device("w2", "SER2"))
        self.assertEqual({r.device for r in runs}, {"w1", "w2"})
        self.assertEqual(len({r.code for r in runs}), 2)


class RestartTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"), device("w3", "SER3"))

    def test_restart_readyStillOnceConsumedStillRefused(self) -> None:
        """[V2][C1] After a restart: a ready run is delivered once, consumed refused."""
        a, b = self.fleet.provision(device("w1", "SER1"), device("w2", "SER2"))
        self.fleet.fetch(a.code)
        self.fleet.restart()
        self.assertEqual(self.fleet.fetch(a.code)[0], Outcome.CONSUMED)
        self.assertEqual(self.fleet.fetch(b.code)[0], Outcome.DELIVER)
        self.assertEqual(self.fleet.fetch(b.code)[0], Outcome.CONSUMED)

    def test_restart_finishesUnreleasedRelease(self) -> None:
        """A delivery whose release did not finish is released after a restart."""
        flaky = FlakyInventory(self.fleet.inventory, failures=100)
        self.fleet.registry.stop()
        self.fleet.start(vault=self.fleet.vault, inventory=flaky)
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        self.fleet.restart()
        self.assertEqual(
            self.successResultOf(self.fleet.inventory.releasedRuns()), {run.run}
        )
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_reboot_releasedConsumedUnreleasedLost(self) -> None:
        """
        [V4][C2] After a reboot (vault emptied), a released run is still
        consumed; an issued, undelivered run is lost, its device stays
        planned, the first request is journaled and the alert holds.
        """
        delivered, issued = self.fleet.provision(
            device("w1", "SER1"), device("w2", "SER2")
        )
        self.fleet.fetch(delivered.code)
        self.fleet.restart(wipeVault=True)
        self.assertEqual(self.fleet.fetch(delivered.code)[0], Outcome.CONSUMED)
        for _ in range(3):
            self.assertEqual(self.fleet.fetch(issued.code)[0], Outcome.LOST)
        self.assertEqual(self.fleet.status("w2"), DeviceStatus.PLANNED)
        self.assertEqual(self.fleet.events("w2").count("config.missing"), 1)
        self.assertTrue(self.fleet.alerts.active(MISSING, "w2"))
        self.fleet.restart()
        self.fleet.fetch(issued.code)
        self.assertEqual(self.fleet.events("w2").count("config.missing"), 1)

    def test_reboot_deliveredButUnreleasedIsLost(self) -> None:
        """
        [V4] A served-config record without a release is gone after a
        reboot: that run counts as lost, not consumed.
        """
        flaky = FlakyInventory(self.fleet.inventory, failures=100)
        self.fleet.registry.stop()
        self.fleet.start(vault=self.fleet.vault, inventory=flaky)
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.fetch(run.code)
        self.fleet.restart(wipeVault=True)
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.LOST)

    def test_lost_neverProvisionsAgain(self) -> None:
        """[V3] fleetd does not provision again on its own, however long it waits."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.restart(wipeVault=True)
        self.fleet.fetch(run.code)
        self.fleet.clock.advance(7 * 86400)
        self.assertEqual(self.fleet.events("w1").count("run.provisioned"), 1)
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.LOST)
        self.assertEqual(self.fleet.vault.names(), [])

    def test_lost_recoveredByNewProvision(self) -> None:
        """[V5] A new provision supersedes the lost run and clears its alert."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.restart(wipeVault=True)
        self.fleet.fetch(run.code)
        (new,) = self.fleet.provision(device("w1", "SER1"))
        self.assertFalse(self.fleet.alerts.active(MISSING, "w1"))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.SUPERSEDED)
        self.assertEqual(self.fleet.fetch(new.code)[0], Outcome.DELIVER)

    def test_memoryVault_sameContract(self) -> None:
        """The registry works the same over a MemoryVault."""
        self.fleet.registry.stop()
        self.fleet.start(vault=MemoryVault())
        (run,) = self.fleet.provision(device("w3", "SER3"))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.DELIVER)
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)


class DeferringRunner:
    """Runs database work only when the test says so (to interleave)."""

    def __init__(self, inner: InlineRunner) -> None:
        self.inner = inner
        self.queue: list[tuple[Any, Deferred[Any]]] = []
        self.holding = False

    def run(self, f: Any) -> Deferred[Any]:
        if not self.holding:
            return self.inner.run(f)
        d: Deferred[Any] = Deferred()
        self.queue.append((f, d))
        return d

    def flush(self) -> None:
        self.holding = False
        while self.queue:
            f, d = self.queue.pop(0)
            self.inner.run(f).chainDeferred(d)


class FailingVault(MemoryVault):
    """A vault whose writes of served marks fail (a full tmpfs)."""

    def put(self, name: str, data: bytes) -> None:
        if name.endswith(".served"):
            from fleetd.vault import VaultError

            raise VaultError("no space left on device")
        super().put(name, data)


class ReleaserBatchTests(SynchronousTestCase):
    """Deliveries handed over while a record waits are recorded together."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"), device("w3", "SER3"))

    def hold(self) -> DeferringRunner:
        runner = DeferringRunner(self.fleet.registry.runner)  # type: ignore[arg-type]
        self.fleet.journal._runner = runner
        runner.holding = True
        return runner

    def entries(self, device: str) -> list[tuple[str, float]]:
        found = self.successResultOf(self.fleet.journal.query(device=device))
        return [(e.event, e.at) for e in found]

    def test_deliveriesWhileWaiting_oneChange_ownTimes(self) -> None:
        """
        [J1] Deliveries handed over while a record waits for the database
        join its change: one change records them all, nothing is released
        before it commits, and each delivery's entries keep its own time.
        """
        runs = self.fleet.provision(
            device("w1", "SER1"), device("w2", "SER2"), device("w3", "SER3")
        )
        runner = self.hold()
        times = []
        for run in runs:
            self.fleet.clock.advance(1.5)
            times.append(self.fleet.clock.seconds())
            self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.DELIVER)
        self.assertEqual(len(runner.queue), 1)  # one change for three records
        self.assertEqual(self.fleet.status("w2"), DeviceStatus.PLANNED)
        runner.flush()
        self.assertEqual(self.fleet.registry.releaser.pending(), 0)
        for name, at in zip(("w1", "w2", "w3"), times, strict=True):
            self.assertEqual(self.fleet.status(name), DeviceStatus.STAGED)
            self.assertEqual(self.entries(name)[-1:], [("run.delivered", at)])
        verified = self.successResultOf(self.fleet.journal.verify())
        self.assertTrue(verified.ok, verified)

    def test_supersededAmong_asIsSuperseded(self) -> None:
        """
        The batch asks the database which runs were superseded, as a
        lone record does (L{isSuperseded}), over more runs than one query's
        list holds.
        """
        from fleetd.runs.store import endRuns, isSuperseded, supersededAmong

        runs = self.fleet.provision(device("w1", "SER1"), device("w2", "SER2"))
        with self.fleet.db.transaction():
            endRuns(self.fleet.db, "w2", "retired")
        ids = [f"r-{i:016x}" for i in range(1200)] + [r.run for r in runs]
        self.assertEqual(supersededAmong(self.fleet.db, ids), {runs[1].run})
        self.assertEqual(
            {i for i in ids if isSuperseded(self.fleet.db, i)}, {runs[1].run}
        )

    def test_failedBatch_nothingStays_eachRetriedAlone(self) -> None:
        """
        [J1] When the change recording several deliveries fails, none of
        its writes or entries stay; each delivery is then recorded on its
        own, once.
        """
        flaky = FlakyInventory(self.fleet.inventory, failures=1)
        self.fleet.registry.stop()
        self.fleet.start(vault=self.fleet.vault, inventory=flaky)
        runs = self.fleet.provision(device("w1", "SER1"), device("w2", "SER2"))
        runner = self.hold()
        for run in runs:
            self.fleet.fetch(run.code)
        self.assertEqual(len(runner.queue), 1)
        runner.flush()  # the first release fails: the whole change with it
        self.assertEqual(self.fleet.registry.releaser.pending(), 2)
        for name in ("w1", "w2"):
            self.assertEqual(self.fleet.status(name), DeviceStatus.PLANNED)
            self.assertNotIn("run.delivered", [e for e, _ in self.entries(name)])
        self.fleet.clock.advance(1)  # retried one by one
        self.assertEqual(self.fleet.registry.releaser.pending(), 0)
        for name in ("w1", "w2"):
            self.assertEqual(self.fleet.status(name), DeviceStatus.STAGED)
            events = [e for e, _ in self.entries(name)]
            self.assertEqual(events.count("run.delivered"), 1)
            (delivered,) = [
                e
                for e in self.successResultOf(self.fleet.journal.query(device=name))
                if e.event == "run.delivered"
            ]
            self.assertEqual(delivered.fields["status"], "staged")


class RaceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"))

    def provisionLater(self, runner: DeferringRunner) -> Deferred[Any]:
        registry = self.fleet.registry
        return Deferred.fromCoroutine(
            registry.provision(
                [device("w1", "SER1")],
                actor="owner:test",
                render=lambda d, run: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run)
                ),
            )
        )

    def test_overlappingProvisions_oneDeliverableRun(self) -> None:
        """
        [C1] [J1] Two overlapping provisions of a device leave one
        deliverable run; until the first commits, the earlier run is as it was.
        """
        (first,) = self.fleet.provision(device("w1", "SER1"))
        runner = DeferringRunner(self.fleet.registry.runner)  # type: ignore[arg-type]
        self.fleet.journal._runner = runner
        runner.holding = True
        a = self.provisionLater(runner)
        b = self.provisionLater(runner)
        self.assertNoResult(a)
        # Nothing changes before the commit: the earlier run is still ready.
        self.assertEqual(self.fleet.registry.readyRun("w1"), first.run)
        runner.flush()
        self.assertEqual(self.fleet.fetch(first.code)[0], Outcome.SUPERSEDED)
        (runA,) = self.successResultOf(a)
        (runB,) = self.successResultOf(b)
        self.assertEqual(self.fleet.registry.readyRun("w1"), runB.run)
        self.assertEqual(self.fleet.fetch(runA.code)[0], Outcome.SUPERSEDED)
        self.assertEqual(self.fleet.fetch(runB.code)[0], Outcome.DELIVER)
        self.fleet.restart()
        # Superseded history stays in the database, not in memory.
        self.assertIsNone(self.fleet.registry.byCode(runA.code))
        retired = self.successResultOf(self.fleet.registry.retired(runA.code))
        assert retired is not None
        self.assertEqual((retired.id, retired.superseded_by), (runA.run, runB.run))
        self.assertEqual(self.fleet.fetch(runB.code)[0], Outcome.CONSUMED)

    def test_provisionWhileLoading_refused(self) -> None:
        """A provision before the runs are loaded is refused, not raced."""
        from fleetd.runs.provision import NotReady

        self.fleet.registry.index.loaded = False
        d = self.provisionLater(DeferringRunner(self.fleet.registry.runner))  # type: ignore[arg-type]
        self.failureResultOf(d, NotReady)

    def test_supersededDuringDelivery_recordedNotReleased(self) -> None:
        """
        A delivery in flight when the owner provisions again is journaled as
        delivered, but not released: the device stays planned for the new run.
        """
        (old,) = self.fleet.provision(device("w1", "SER1"))
        run = self.fleet.registry.byCode(old.code)
        assert run is not None
        self.assertEqual(
            self.fleet.registry.request(run, "10.0.0.9")[0], Outcome.DELIVER
        )
        (new,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.registry.finished(run, complete=True)
        self.assertEqual(
            self.successResultOf(self.fleet.inventory.releasedRuns()), set()
        )
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.PLANNED)
        entries = self.successResultOf(self.fleet.journal.query(run=old.run))
        delivered = [e for e in entries if e.event == "run.delivered"]
        self.assertIs(delivered[0].fields["superseded"], True)
        self.assertEqual(
            self.fleet.vault.names(), [codeName(new.run), configName(new.run)]
        )

    def test_journalNamesMarkHolder(self) -> None:
        """The journal names the peer that received the body, not a later caller."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        held = self.fleet.registry.byCode(run.code)
        assert held is not None
        self.assertEqual(
            self.fleet.registry.request(held, "198.51.100.66")[0], Outcome.DELIVER
        )
        self.assertEqual(
            self.fleet.registry.request(held, "10.20.0.42")[0], Outcome.BUSY
        )
        self.fleet.registry.finished(held, complete=True)
        entries = self.successResultOf(self.fleet.journal.query(run=run.run))
        delivered = [e for e in entries if e.event == "run.delivered"]
        self.assertEqual(delivered[0].fields["peer"], "198.51.100.66")
        self.assertNotIn("config.refetched", [e.event for e in entries])

    def test_markFailure_runStaysDeliverable(self) -> None:
        """
        A served mark that cannot be written (full tmpfs) sends nothing,
        consumes nothing, says so (UNAVAILABLE, not BUSY), counts it, and
        journals nothing.
        """
        self.fleet.registry.stop()
        self.fleet.start(vault=FailingVault())
        (run,) = self.fleet.provision(device("w2", "SER2"))
        held = self.fleet.registry.byCode(run.code)
        assert held is not None
        before = self.successResultOf(self.fleet.journal.query())
        for _ in range(3):
            self.assertEqual(
                self.fleet.registry.request(held, "10.0.0.1"),
                (Outcome.UNAVAILABLE, None),
            )
        self.assertEqual(self.fleet.registry.readyRun("w2"), run.run)
        self.assertEqual(self.successResultOf(self.fleet.journal.query()), before)
        failures = self.fleet.registry.vaultFailures.labels("served-mark")
        self.assertEqual(failures._value.get(), 3)

    def test_load_removesOrphans(self) -> None:
        """Run files no record accounts for (a crash mid-provision) are removed."""
        self.fleet.vault.put("r-0123456789abcdef.yaml", b"cluster: {secret: x}\n")
        self.fleet.vault.put("keep-me", b"other")
        self.fleet.restart()
        self.assertEqual(self.fleet.vault.names(), ["keep-me"])


class DuplicateNameTests(SynchronousTestCase):
    def test_parseProvision_caseVariantsAreOneDevice(self) -> None:
        """A device named twice, in any case, is refused before anything starts."""
        from fleetd.admin.provision import parseProvision
        from fleetd.refused import Refused

        self.assertRaises(Refused, parseProvision, b'{"devices": ["w1", "W1"]}')
        self.assertEqual(parseProvision(b'{"devices": ["W1"]}')[0], ["w1"])

    def test_registry_refusesTwinDevices(self) -> None:
        """The registry itself refuses one device twice in one provision."""
        fleet = Fleet(self)
        d = device("w1")
        fleet.add(d)
        failure = self.failureResultOf(
            Deferred.fromCoroutine(
                fleet.registry.provision(
                    [d, d], actor="owner:t", render=lambda dv, run: b"x: 1\n"
                )
            ),
            ValueError,
        )
        self.assertIn("twice", failure.getErrorMessage())
        self.assertIsNone(fleet.registry.readyRun("w1"))


class _NoDatabase:
    """A runner that fails the test if anything asks the database."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.test = test

    def run(self, f: Any) -> Deferred[Any]:
        self.test.fail("the database was asked")


class IssuedDigestsTests(SynchronousTestCase):
    """A code fleetd never issued is refused without asking the database."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))

    def test_neverIssued_noDatabase(self) -> None:
        """A well-formed code no run ever had: no run, and no database read."""
        self.fleet.provision(device("w1", "SER1"))
        self.fleet.registry.index.runner = _NoDatabase(self)
        code = mintCode()
        self.assertIsNone(self.fleet.registry.byCode(code))
        self.assertIsNone(self.successResultOf(self.fleet.registry.retired(code)))

    def test_supersededCode_stillFromDatabase(self) -> None:
        """[V5] A superseded code is still answered from the database,
        whether it was superseded before or after a restart."""
        (first,) = self.fleet.provision(device("w1", "SER1"))
        (second,) = self.fleet.provision(device("w1", "SER1"))
        retired = self.successResultOf(self.fleet.registry.retired(first.code))
        assert retired is not None
        self.assertEqual(retired.superseded_by, second.run)
        self.fleet.restart()  # the digests come from the database now
        (third,) = self.fleet.provision(device("w1", "SER1"))
        for old, by in ((first, second), (second, third)):
            retired = self.successResultOf(self.fleet.registry.retired(old.code))
            assert retired is not None, old
            self.assertEqual((retired.id, retired.superseded_by), (old.run, by.run))

    def test_prefixes(self) -> None:
        """Loaded and added digests are held; others are not, unless
        they share the first 8 bytes (then the database decides)."""
        loaded = [codeDigest(KEY, mintCode()) for _ in range(50)]
        issued = IssuedDigests(loaded)
        added = codeDigest(KEY, mintCode())
        other = codeDigest(KEY, mintCode())
        self.assertFalse(issued.mayHold(added))
        issued.add(added)
        self.assertTrue(all(issued.mayHold(d) for d in [*loaded, added]))
        self.assertFalse(issued.mayHold(other))
        self.assertTrue(issued.mayHold(loaded[7][:16] + other[16:]))
        self.assertFalse(IssuedDigests().mayHold(other))
