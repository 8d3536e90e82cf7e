"""
The fleet by status and the longest-staged node, for Prometheus (issue
27, item 8): L{fleetd.inventory.census}, counted in the background so that
no scrape lists the inventory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.ssl import PrivateCertificate
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Site

from fleetd.inventory import Device, DeviceStatus, IInventory, ServedRecord
from fleetd.inventory.census import LOCAL_INTERVAL, Census
from fleetd.store import Database, InlineRunner, StoreError
from fleetd.testing.kube import FakeKube
from tests.daemonsupport import DeliveryMixin, configPath
from tests.inventorysupport import UUID1, UUID2, UUID3, FailingRunner, device
from tests.netbox_support import NetBoxRig, seedFake
from tests.support import (
    OPTIONAL_METRICS,
    exposedMetrics,
    inventoryOver,
    ruleMetrics,
)
from tests.test_kube_tls import selfSigned

HOUR = 3600.0
W1 = device("w1", "SN-0001", UUID1, ("52:54:00:00:00:01",))
W2 = device("w2", "SN-0002", UUID2, ("52:54:00:00:00:02",))
W3 = device("w3", "SN-0003", UUID3, ("52:54:00:00:00:03",))


class Listings:
    """An inventory's C{list} calls counted; everything else passed on."""

    def __init__(self, inventory: IInventory) -> None:
        self.inventory = inventory
        self.lists = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inventory, name)

    def list(self) -> Deferred[list[Device]]:
        self.lists += 1
        return self.inventory.list()


class CensusTests(SynchronousTestCase):
    """L{Census} over the embedded inventory, on a fake clock."""

    def setUp(self) -> None:
        self.db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.db.close)
        self.inventory = inventoryOver(InlineRunner(self.db))
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.registry = CollectorRegistry()
        self.successResultOf(self.inventory.importDevices([W1, W2, W3], journal=()))

    def census(self, staged: bool = True, **kwargs: Any) -> Census:
        census = Census(
            self.clock, self.inventory, self.registry, staged=staged, **kwargs
        )
        census.startService()
        self.addCleanup(census.stopService)
        return census

    def devices(self, status: str) -> float | None:
        return self.registry.get_sample_value("fleetd_devices", {"status": status})

    def longest(self) -> float | None:
        return self.registry.get_sample_value("fleetd_staged_longest_seconds")

    def deliver(self, name: str, run: str, ago: float) -> None:
        """C{name} provisioned, and its configuration served C{ago} seconds ago."""
        inventory = self.inventory
        self.successResultOf(
            inventory.setStatus(name, DeviceStatus.PLANNED, journal=())
        )
        served = ServedRecord(run, name, self.clock.seconds() - ago, "10.0.0.7")
        self.successResultOf(inventory.release(served, journal=()))

    def test_devices_byStatus_everyStatusExported(self) -> None:
        """fleetd_devices counts devices per status, every status shown, 0 too."""
        self.deliver("w1", "run-1", 10)
        self.successResultOf(
            self.inventory.setStatus("w2", DeviceStatus.ACTIVE, journal=())
        )
        self.census()
        counts = {s.value: self.devices(s.value) for s in DeviceStatus}
        self.assertEqual(
            counts,
            {
                "offline": 0.0,
                "active": 1.0,
                "planned": 0.0,
                "staged": 1.0,
                "failed": 0.0,
                "inventory": 1.0,
                "decommissioning": 0.0,
            },
        )

    def test_scrape_neverListsTheInventory(self) -> None:
        """
        Scrapes read the last count; the inventory is listed once at start
        and then once per interval, however often Prometheus scrapes.
        """
        listings = Listings(self.inventory)
        census = Census(self.clock, listings, self.registry, staged=True)
        census.startService()
        self.addCleanup(census.stopService)
        for _ in range(5):
            generate_latest(self.registry)
        self.assertEqual(listings.lists, 1)
        self.clock.advance(LOCAL_INTERVAL - 1)
        generate_latest(self.registry)
        self.assertEqual(listings.lists, 1)
        self.clock.advance(1)
        self.assertEqual(listings.lists, 2)

    def test_counts_followTheInventory_atTheNextCount(self) -> None:
        """A status change shows at the next count, not before."""
        self.census()
        self.assertEqual(self.devices("inventory"), 3.0)
        self.successResultOf(
            self.inventory.setStatus("w3", DeviceStatus.FAILED, journal=())
        )
        self.assertEqual(self.devices("failed"), 0.0)
        self.clock.advance(LOCAL_INTERVAL)
        self.assertEqual((self.devices("inventory"), self.devices("failed")), (2, 1))

    def test_longestStaged_sinceTheDelivery_growsBetweenCounts(self) -> None:
        """
        fleetd_staged_longest_seconds is the time since the delivery of the
        device staged longest (its newest release), measured at the scrape.
        """
        self.deliver("w1", "run-1", 2 * HOUR)
        self.deliver("w2", "run-2", 5 * HOUR)
        self.census()
        self.assertEqual(self.longest(), 5 * HOUR)
        self.clock.advance(30)
        self.assertEqual(self.longest(), 5 * HOUR + 30)

    def test_longestStaged_approvedDeviceDropsOut(self) -> None:
        """
        A device whose kubelet certificate was approved (active) drops out
        at the next count; with none staged the gauge is 0.
        """
        self.deliver("w1", "run-1", 2 * HOUR)
        self.deliver("w2", "run-2", 5 * HOUR)
        self.census()
        self.successResultOf(
            self.inventory.setStatus("w2", DeviceStatus.ACTIVE, journal=())
        )
        self.clock.advance(LOCAL_INTERVAL)
        self.assertEqual(self.longest(), 2 * HOUR + LOCAL_INTERVAL)
        self.successResultOf(
            self.inventory.setStatus("w1", DeviceStatus.ACTIVE, journal=())
        )
        self.clock.advance(LOCAL_INTERVAL)
        self.assertEqual(self.longest(), 0.0)

    def test_longestStaged_newestDeliveryCounts(self) -> None:
        """A device provisioned and delivered again waits from its new delivery."""
        self.deliver("w1", "run-1", 9 * HOUR)
        self.deliver("w1", "run-2", HOUR)
        self.census()
        self.assertEqual(self.longest(), HOUR)

    def test_longestStaged_stagedByHand_notTimed(self) -> None:
        """A device set staged without a delivery is counted, but not timed."""
        self.successResultOf(
            self.inventory.setStatus("w3", DeviceStatus.STAGED, journal=())
        )
        self.census()
        self.assertEqual((self.devices("staged"), self.longest()), (1.0, 0.0))

    def test_beforeTheFirstCount_noCountNoTime(self) -> None:
        """
        Until the first count (it waits for the run load) fleetd_devices
        has no series and the staged time is NaN, never a false 0.
        """
        begin: list[Callable[[], None]] = []
        self.census(after=begin.append)
        self.assertIsNone(self.devices("inventory"))
        longest = self.longest()
        assert longest is not None
        self.assertTrue(math.isnan(longest))
        begin[0]()
        self.assertEqual((self.devices("inventory"), self.longest()), (3.0, 0.0))

    def test_withoutKubernetes_noStagedSeries(self) -> None:
        """
        Without [kubernetes] staged is where a node's path ends: the staged
        time is not exported at all, so FleetNodeStagedTooLong cannot fire.
        """
        self.deliver("w1", "run-1", 9 * HOUR)
        self.census(staged=False)
        self.assertEqual(self.devices("staged"), 1.0)
        text = generate_latest(self.registry).decode()
        self.assertNotIn("fleetd_staged_longest_seconds", text)

    def test_failedCount_keepsTheLast_andSaysSo(self) -> None:
        """A count that fails keeps the last count and logs census.failed."""
        self.deliver("w1", "run-1", HOUR)
        census = self.census()
        census._inventory = inventoryOver(FailingRunner(StoreError("stopped")))
        with capturedLogs() as logged:
            self.clock.advance(LOCAL_INTERVAL)
        self.assertEqual(self.devices("staged"), 1.0)
        self.assertEqual(self.longest(), HOUR + LOCAL_INTERVAL)
        failed = [e for e in logged if e.get("log_format", "").startswith("census.f")]
        self.assertEqual(len(failed), 1)
        self.assertIn("stopped", failed[0]["reason"])
        self.assertIsNotNone(census._loop)  # and the counts go on

    def test_stop_cancelsTheTimer(self) -> None:
        """Stopping the census leaves no delayed call behind."""
        census = self.census()
        self.assertTrue(self.clock.getDelayedCalls())
        census.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stoppedBeforeTheLoadSettled_neverCounts(self) -> None:
        """A census stopped before its start arrives never arms a timer."""
        begin: list[Callable[[], None]] = []
        census = self.census(after=begin.append)
        census.stopService()
        begin[0]()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIsNone(self.devices("inventory"))


class NetBoxCensusTests(SynchronousTestCase):
    """The census over the NetBox inventory: NetBox's statuses, local releases."""

    def test_netbox_statusesAndStagedTime(self) -> None:
        """
        Over NetBox the statuses come from NetBox's listing and the staged
        time from the release rows fleetd keeps (its outbox).
        """
        rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(rig.close)
        rig.clock.advance(1_000_000)
        for d in (W1, W2, W3):
            seedFake(rig.fake, d)
        inventory = rig.inventory
        rig.settle()
        planned = inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        rig.settle()
        self.successResultOf(planned)
        served = ServedRecord("run-1", "w1", rig.clock.seconds() - HOUR, "10.0.0.7")
        released = inventory.release(served, journal=())
        rig.settle()
        self.successResultOf(released)
        registry = CollectorRegistry()
        census = Census(rig.clock, inventory, registry, staged=True)
        census.startService()
        self.addCleanup(census.stopService)
        rig.settle()
        staged = registry.get_sample_value("fleetd_devices", {"status": "staged"})
        waited = registry.get_sample_value("fleetd_staged_longest_seconds")
        self.assertEqual((staged, waited), (1.0, HOUR))


class DaemonCensusTests(DeliveryMixin, TestCase):
    """The census as fleetd runs it: counted after the load, read by scrapes."""

    timeout = 60

    async def test_daemon_devicesByStatus_afterADelivery(self) -> None:
        """
        A running fleetd exports fleetd_devices; after a delivery the next
        count shows the device staged. Without [kubernetes] it exports no
        staged time (staged is where the path ends there).
        """
        await self.startLoaded()
        await self.addDevice("w1", "SN-0001", UUID1)
        await self.addDevice("w2", "SN-0002", UUID2)
        code = (await self.provision("w1"))["w1"]
        status, _, _ = await self.fetch(configPath(code, UUID1, "SN-0001"))
        self.assertEqual(status, 200)
        await self.events("run.delivered")
        await self.service.census.count()
        _, _, body = await self.get(self.service, "admin", "/metrics")
        samples = {
            sample.labels.get("status"): sample.value
            for family in text_string_to_metric_families(body.decode())
            if family.name == "fleetd_devices"
            for sample in family.samples
        }
        self.assertEqual(samples["staged"], 1.0)
        self.assertEqual(samples["inventory"], 1.0)
        self.assertEqual(sum(samples.values()), 2.0)
        self.assertNotIn(b"fleetd_staged_longest_seconds", body)

    async def test_daemon_withKubernetes_stagedTime_andEveryRuleMetric(self) -> None:
        """
        [K2] With [kubernetes] fleetd exports the staged time: a delivered
        node waits from its delivery. Every fleetd metric an alert rule
        names is then exported (NetBox's aside: tests/test_netbox_daemon).
        """
        files = Path(self.mktemp()).resolve()
        files.mkdir()
        cert, key = selfSigned(files, "server")
        kube = FakeKube(reactor)
        options = PrivateCertificate.loadPEM(cert.read_bytes() + key.read_bytes())
        kubePort = reactor.listenSSL(  # type: ignore[attr-defined]
            0, Site(kube.resource()), options.options(), interface="127.0.0.1"
        )
        self.addCleanup(kubePort.stopListening)
        self.addCleanup(kube.closeWatches)
        (files / "kube-token").write_text(kube.adminToken + "\n")
        api = f"https://127.0.0.1:{kubePort.getHost().port}"
        await self.startLoaded(
            {
                "kubernetes": {
                    "api": api,
                    "ca": str(cert),
                    "token_file": str(files / "kube-token"),
                }
            }
        )
        await self.addDevice("w1", "SN-0001", UUID1)
        code = (await self.provision("w1"))["w1"]
        status, _, _ = await self.fetch(configPath(code, UUID1, "SN-0001"))
        self.assertEqual(status, 200)
        await self.events("run.delivered")
        await self.service.census.count()
        _, _, body = await self.get(self.service, "admin", "/metrics")
        text = body.decode()
        (waited,) = [
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "fleetd_staged_longest_seconds"
            for sample in family.samples
        ]
        self.assertGreaterEqual(waited, 0.0)
        self.assertLess(waited, 60.0)
        exposed = exposedMetrics(text)
        used = {n for n in ruleMetrics() if not n.startswith(OPTIONAL_METRICS)}
        self.assertIn("fleetd_staged_longest_seconds", used)
        self.assertEqual(used - exposed, set())
