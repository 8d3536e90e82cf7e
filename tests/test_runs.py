"""
Tests for provision runs: the delivery machine and the registry.

Synchronous: an InlineRunner over a real SQLite file, the real inventory,
a task.Clock, and a MemoryVault or DirectoryVault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    IInventory,
    InventoryError,
    ServedRecord,
    validateDevice,
)
from fleetd.inventory.sqlite import SQLiteInventory
from fleetd.runs.alerts import MISSING, REFETCHED, AlertTracker
from fleetd.runs.codes import codeDigest, mintCode, wellFormedCode
from fleetd.runs.machine import Outcome, RunEffects, RunMachine, delivering, ready
from fleetd.runs.registry import RunRegistry, configName, servedName
from fleetd.runs.render import NodeFacts, TemplateRenderer
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.store.runner import InlineRunner
from fleetd.vault import DirectoryVault, IVault, MemoryVault
from tests.support import REPO

KEY = b"k" * 32
RENDERER = TemplateRenderer(REPO / "conf" / "templates")


def device(name: str = "w1", serial: str = "SER1", cls: str = "worker") -> Device:
    n = int.from_bytes(name.encode(), "big") % 10**12
    return validateDevice(
        name=name,
        serial=serial,
        uuid=f"00000000-0000-4000-8000-{n:012d}",
        macs=[],
        device_class=cls,
    )


class FlakyInventory:
    """The real inventory whose release fails C{failures} times."""

    def __init__(self, inner: IInventory, failures: int) -> None:
        self._inner = inner
        self.failures = failures

    def release(self, record: ServedRecord) -> Deferred[None]:
        if self.failures > 0:
            self.failures -= 1
            return fail(InventoryError("netbox down", "unavailable"))
        return self._inner.release(record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Fleet:
    """One fleetd's run state over a directory; rebuildable (restart)."""

    def __init__(
        self, test: SynchronousTestCase, directory: Path | None = None
    ) -> None:
        self.test = test
        self.directory = directory or Path(test.mktemp())
        self.directory.mkdir(parents=True, exist_ok=True)
        self.clock = Clock()
        self.start()

    def start(self, vault: IVault | None = None, inventory: Any = None) -> None:
        self.db = Database.open(self.directory / "fleetd.sqlite3")
        self.test.addCleanup(self.db.close)
        runner = InlineRunner(self.db)
        self.inventory = inventory or SQLiteInventory(runner)
        self.journal = AsyncJournal(runner, Journal(KEY), self.clock)
        self.vault = vault or DirectoryVault.open(
            self.directory / "vault", allowAnyFilesystem=True
        )
        self.alerts = AlertTracker(self.clock, hold=900)
        self.registry = RunRegistry(
            clock=self.clock,
            vault=self.vault,
            runner=runner,
            inventory=self.inventory,
            journal=self.journal,
            alerts=self.alerts,
            codeKey=KEY,
        )
        self.test.successResultOf(Deferred.fromCoroutine(self.registry.load()))

    def restart(self, wipeVault: bool = False) -> None:
        """Stop and start over the same directories; a reboot also wipes the vault."""
        self.registry.stop()
        self.db.close()
        if wipeVault:
            for entry in (self.directory / "vault").iterdir():
                entry.unlink()
        self.start()

    def add(self, *devices: Device) -> None:
        for d in devices:
            self.test.successResultOf(self.inventory.add(d))

    def provision(self, *devices: Device, action: str | None = None) -> list[Any]:
        result: list[Any] = self.test.successResultOf(
            Deferred.fromCoroutine(
                self.registry.provision(
                    list(devices),
                    actor="owner:test",
                    desiredAction=action,
                    render=lambda d, run: RENDERER.render(
                        None, NodeFacts(d.name, d.device_class, run)
                    ),
                )
            )
        )
        return result

    def fetch(self, code: str, complete: bool = True) -> tuple[Outcome, bytes | None]:
        run = self.registry.byCode(code)
        assert run is not None
        outcome, body = self.registry.request(run, "127.0.0.1")
        if outcome is Outcome.DELIVER:
            self.registry.finished(run, complete=complete)
        return outcome, body

    def events(self, device: str | None = None) -> list[str]:
        entries = self.test.successResultOf(self.journal.query(device=device))
        return [e.event for e in entries]

    def status(self, name: str) -> DeviceStatus:
        found: Device | None = self.test.successResultOf(self.inventory.get(name))
        assert found is not None
        return found.status


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

        def markServed(self) -> None:
            self.calls.append("markServed")

        def withdrawServed(self) -> None:
            self.calls.append("withdrawServed")

        def release(self) -> None:
            self.calls.append("release")

        def noteRefetch(self) -> None:
            self.calls.append("noteRefetch")

        def noteMissing(self) -> None:
            self.calls.append("noteMissing")

        def dropConfig(self) -> None:
            self.calls.append("dropConfig")

    def test_readyRequest_marksBeforeDelivering(self) -> None:
        """[C1] request in ready writes the served mark, then says DELIVER."""
        effects = self.Effects()
        machine = RunMachine(effects, ready)
        self.assertEqual(machine.request(), Outcome.DELIVER)
        self.assertEqual(effects.calls, ["markServed"])
        self.assertEqual(machine.request(), Outcome.CONSUMED)
        machine.aborted()
        self.assertEqual(effects.calls, ["markServed", "noteRefetch", "withdrawServed"])
        self.assertTrue(machine.deliverable())

    def test_sent_consumes(self) -> None:
        """[C1] Once sent, a run is never delivered again."""
        effects = self.Effects()
        machine = RunMachine(effects, delivering)
        machine.sent()
        self.assertEqual(effects.calls, ["release"])
        for _ in range(3):
            self.assertEqual(machine.request(), Outcome.CONSUMED)
        self.assertFalse(machine.deliverable())


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
        outcome, body = self.fleet.fetch(run.code)
        self.assertEqual(outcome, Outcome.DELIVER)
        self.assertEqual(body, self.fleet.vault.get(configName(run.run)))
        self.assertIsNotNone(self.fleet.vault.get(servedName(run.run)))
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
            ["run.provisioned", "run.delivered", "run.released"],
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
        self.successResultOf(self.fleet.inventory.setStatus("w1", DeviceStatus.PLANNED))
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
