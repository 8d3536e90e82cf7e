"""
[V6] Alert series that hold through Talos's retry gaps and survive a
fleetd restart; [C1] the crash clause; [J2] the chain monitor.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.runs.alerts import DEFAULT_HOLD, MISSING, REFETCHED
from fleetd.runs.machine import Outcome
from fleetd.runs.vaultnames import codeName, configName, servedName
from fleetd.store.chain import ChainMonitor
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.store.runner import InlineRunner
from tests.fleetsupport import KEY, Fleet, device

TALOS_GAP = 68 * 60.0  # Talos's longest retry gap


class AlertHoldTests(SynchronousTestCase):
    """[V6] Series stay 1 while requests continue, across restarts."""

    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.hold = DEFAULT_HOLD
        self.fleet.restart()
        self.fleet.add(device("w1", "SER1"))
        (self.served,) = self.fleet.provision(device("w1", "SER1"))
        self.assertEqual(self.fleet.fetch(self.served.code)[0], Outcome.DELIVER)

    def refetch(self) -> None:
        self.assertEqual(self.fleet.fetch(self.served.code)[0], Outcome.CONSUMED)

    def test_defaultHold_is7200(self) -> None:
        """[V6] The default hold outlasts Talos's ~68-minute retry gaps."""
        self.assertEqual(DEFAULT_HOLD, 7200.0)
        self.assertGreater(DEFAULT_HOLD, TALOS_GAP)

    def test_series_holdsBetweenTalosRetries(self) -> None:
        """[V6] A node retrying every 68 minutes keeps the series at 1."""
        for _ in range(4):
            self.refetch()
            self.fleet.clock.advance(TALOS_GAP)
            self.assertTrue(self.fleet.alerts.active(REFETCHED, "w1"))
        self.fleet.clock.advance(DEFAULT_HOLD - TALOS_GAP - 1)
        self.assertTrue(self.fleet.alerts.active(REFETCHED, "w1"))
        self.fleet.clock.advance(2)
        self.assertFalse(self.fleet.alerts.active(REFETCHED, "w1"))
        self.assertEqual(self.fleet.events("w1").count("config.refetched"), 1)

    def test_series_survivesRestart(self) -> None:
        """
        [V6] After a fleetd restart the series is still 1, counting the
        hold from the last stored request, and the first request is not
        journaled again.
        """
        self.refetch()
        self.fleet.clock.advance(TALOS_GAP)
        self.refetch()  # more than a minute later: stored
        self.fleet.restart()
        self.assertTrue(self.fleet.alerts.active(REFETCHED, "w1"))
        self.assertEqual(
            self.fleet.alerts.openFor("w1"), ["FleetInstallConfigRefetched"]
        )
        self.fleet.clock.advance(DEFAULT_HOLD - 1)
        self.assertTrue(self.fleet.alerts.active(REFETCHED, "w1"))
        self.fleet.clock.advance(2)
        self.assertFalse(self.fleet.alerts.active(REFETCHED, "w1"))
        self.refetch()
        self.assertEqual(self.fleet.events("w1").count("config.refetched"), 1)

    def test_recoveryProvision_clearsStoredSeries(self) -> None:
        """[V5] [V6] A new provision removes the series, also after a restart."""
        self.refetch()
        self.fleet.provision(device("w1", "SER1"))
        self.assertEqual(self.fleet.alerts.openFor("w1"), [])
        self.fleet.restart()
        self.assertEqual(self.fleet.alerts.openFor("w1"), [])

    def test_missing_survivesReboot(self) -> None:
        """[V4] [V6] A lost run's series survives a later fleetd restart."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.restart(wipeVault=True)
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.LOST)
        self.fleet.restart()
        self.assertTrue(self.fleet.alerts.active(MISSING, "w1"))


class CrashClauseTests(SynchronousTestCase):
    """[C1] A crash between the mark and the record: consumed, never twice."""

    def test_configAndMark_restoreConsumed(self) -> None:
        """
        [C1] A vault holding both the configuration and the served mark (a
        crash after the mark, before the delivery was recorded) restores the
        run as consumed: stranded is acceptable, twice never. The delivery
        is recorded at start and the configuration then leaves the vault.
        """
        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        (run,) = fleet.provision(device("w1", "SER1"))
        held = fleet.registry.byCode(run.code)
        assert held is not None
        self.assertEqual(fleet.registry.request(held, "10.0.0.7")[0], Outcome.DELIVER)
        # The process dies here: neither sent() nor aborted() ever comes.
        self.assertEqual(
            sorted(fleet.vault.names()),
            sorted([codeName(run.run), configName(run.run), servedName(run.run)]),
        )
        fleet.restart()
        self.assertEqual(fleet.fetch(run.code)[0], Outcome.CONSUMED)
        self.assertIsNone(fleet.registry.readyRun("w1"))
        self.assertEqual(fleet.vault.names(), [servedName(run.run)])
        self.assertIn("run.delivered", fleet.events("w1"))


class ChainMonitorTests(SynchronousTestCase):
    """[J2] The chain is verified at start and periodically."""

    def setUp(self) -> None:
        from pathlib import Path

        from fleetd.store.db import Database

        self.db = Database.open(Path(self.mktemp()) / "db.sqlite3")
        self.addCleanup(self.db.close)
        self.clock = Clock()
        self.journal = AsyncJournal(InlineRunner(self.db), Journal(KEY), self.clock)
        self.registry = CollectorRegistry()
        self.monitor = ChainMonitor(self.clock, self.journal, self.registry, 60.0)
        for n in range(3):
            self.successResultOf(self.journal.append("test.event", actor=f"a{n}"))

    def value(self, name: str) -> float | None:
        return self.registry.get_sample_value(name)

    def test_noVerdictBeforeFirstCheck(self) -> None:
        """[J2] Before anything was verified, no series claims intact or broken."""
        self.assertIsNone(self.value("fleetd_journal_chain_ok"))
        self.assertIsNone(self.value("fleetd_journal_verified_timestamp_seconds"))

    def test_verifiedAtStart(self) -> None:
        """[J2] Starting verifies at once and exposes the result."""
        self.monitor.startService()
        self.addCleanup(self.monitor.stopService)
        self.assertEqual(self.value("fleetd_journal_chain_ok"), 1.0)
        self.assertEqual(self.value("fleetd_journal_verified_entries"), 3.0)

    def test_midChainEdit_detectedPeriodically(self) -> None:
        """
        [J2] An entry edited while fleetd runs is found by the next periodic
        verification: the metric drops to 0 and the break is logged once.
        Appends go on (they chain onto the authentic head).
        """
        self.monitor.startService()
        self.addCleanup(self.monitor.stopService)
        self.db.execute("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        self.assertEqual(self.value("fleetd_journal_chain_ok"), 1.0)
        self.clock.advance(60.0)
        self.assertEqual(self.value("fleetd_journal_chain_ok"), 0.0)
        self.assertEqual(self.value("fleetd_journal_verified_entries"), 1.0)
        self.successResultOf(self.journal.append("test.after", actor="fleetd"))
        self.clock.advance(60.0)
        self.assertEqual(self.value("fleetd_journal_chain_ok"), 0.0)
        broken = [e for e in self.flushLoggedErrors()]  # log.error is not a failure
        self.assertEqual(broken, [])

    def test_firstVerification_waitsForTheLoad(self) -> None:
        """
        [J2] With an C{after} hook (fleetd's start-up load), the first
        verification runs once the hook says so, not before: reading the
        whole journal must not hold the run load up behind it.
        """
        begin: list[Callable[[], None]] = []
        monitor = ChainMonitor(
            self.clock, self.journal, self.registry, 60.0, after=begin.append
        )
        monitor.startService()
        self.addCleanup(monitor.stopService)
        self.assertIsNone(self.value("fleetd_journal_chain_ok"))
        self.assertEqual(len(begin), 1)
        begin[0]()
        self.assertEqual(self.value("fleetd_journal_chain_ok"), 1.0)

    def test_stoppedBeforeTheLoad_neverBegins(self) -> None:
        """A monitor stopped before the load settled arms no timer later."""
        begin: list[Callable[[], None]] = []
        monitor = ChainMonitor(
            self.clock, self.journal, self.registry, 60.0, after=begin.append
        )
        monitor.startService()
        monitor.stopService()
        begin[0]()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIsNone(self.value("fleetd_journal_chain_ok"))

    def test_stop_cancelsTimer(self) -> None:
        """Stopping leaves no delayed call behind."""
        self.monitor.startService()
        self.monitor.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])
