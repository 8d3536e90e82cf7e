"""
A NetBox inventory over the fake NetBox and a temporary database, for
tests; and a run fleet (L{tests.fleetsupport.Fleet}) over it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.web.iweb import IResponse

from fleetd.inventory.model import Device
from fleetd.netbox.client import NetBoxClient
from fleetd.netbox.inventory import NetBoxInventory, digestOf
from fleetd.netbox.service import NetBoxService
from fleetd.runs.vaultnames import configName
from fleetd.store import Database, InlineRunner
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.testing.netbox import FakeNetBox
from fleetd.vault import DirectoryVault, IVault
from tests.fleetsupport import KEY, Fleet

TOKEN = "nbt_fleetd01.s3cret"
URL = "https://netbox.example/netbox/"
BMC_MAC = "02:00:00:00:00:99"


class Switch:
    """An HTTP client that reaches the fake, or fails as a down NetBox does."""

    def __init__(self, fake: FakeNetBox) -> None:
        self.stub = StubTreq(fake)
        self.down = False

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[IResponse]:
        if self.down:
            return fail(ConnectionRefusedError(111, "Connection refused"))
        d: Deferred[IResponse] = self.stub.request(  # type: ignore[attr-defined]
            method, url, **kwargs
        )
        return d


def seedFake(fake: FakeNetBox, device: Device) -> int:
    """Enter a fleetd device into the fake as an operator would."""
    macs = tuple((f"eth{i}", mac.upper(), False) for i, mac in enumerate(device.macs))
    return fake.addDevice(
        device.name,
        device.serial,
        status=device.status.value,
        uuid=device.uuid,
        deviceClass=device.device_class,
        cluster=device.cluster,
        macs=(*macs, ("bmc", BMC_MAC, True)),
        primary=primaryOf(device),
    )


def primaryOf(device: Device) -> tuple[str, ...]:
    """The device's address as NetBox holds an IP address: with its prefix."""
    if device.address is None:
        return ()
    return (device.address + ("/64" if ":" in device.address else "/24"),)


class NetBoxRig:
    """The fake, a database, the inventory, its outbox worker and mirror."""

    def __init__(self, path: Path, fake: FakeNetBox | None = None) -> None:
        self.path = path
        self.fake = FakeNetBox(basePath="/netbox/") if fake is None else fake
        self.http = Switch(self.fake)
        self.clock = Clock()
        self.db: Database | None = None
        self.open()

    def open(self) -> NetBoxInventory:
        """(Re)open everything over the same database and fake: a restart."""
        if self.db is not None:
            self.stop()
            self.db.close()
        self.db = Database.open(self.path)
        self.runner = InlineRunner(self.db)
        self.journal = AsyncJournal(self.runner, Journal(b"k" * 32), self.clock)
        self.client = NetBoxClient(self.http, self.clock, URL, TOKEN, timeout=10.0)
        self.metrics = CollectorRegistry()
        self.refusals: list[str] = []
        self.service = NetBoxService(
            self.clock,
            self.client,
            self.runner,
            self.journal,
            configDigest=lambda run: "sha256:" + "ab" * 32,
            onRefused=self.refusals.append,
            wake=self.handOver,
            metrics=self.metrics,
        )
        self.worker = self.service.worker
        self.mirror = self.service.mirror
        self.inventory = self.service.inventory
        self.worker.start()
        return self.inventory

    def handOver(self, kick: Callable[[], None]) -> None:
        """A row was queued: kick the worker on the next turn, after the commit."""
        self.clock.callLater(0, kick)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.get_sample_value(name, labels)

    def settle(self) -> None:
        """Let queued wake-ups run (the reactor turn after a commit)."""
        self.clock.advance(0)

    def stop(self) -> None:
        self.worker.stop()
        self.mirror.stop()

    def close(self) -> None:
        self.stop()
        if self.db is not None:
            self.db.close()
            self.db = None


class NetBoxFleet(Fleet):
    """The run registry over the NetBox inventory and the fake."""

    def start(self, vault: IVault | None = None, inventory: Any = None) -> None:
        if not hasattr(self, "fake"):
            self.fake = FakeNetBox(basePath="/netbox/")
            self.http = Switch(self.fake)
        self.db = Database.open(self.directory / "fleetd.sqlite3")
        self.test.addCleanup(self.db.close)
        runner = InlineRunner(self.db)
        self.runner = runner
        self.journal = AsyncJournal(runner, Journal(KEY), self.clock)
        self.vault = (
            vault
            if vault is not None
            else DirectoryVault.open(self.directory / "vault", allowAnyFilesystem=True)
        )
        client = NetBoxClient(self.http, self.clock, URL, TOKEN, timeout=10.0)
        self.refusals: list[str] = []
        service = NetBoxService(
            self.clock,
            client,
            runner,
            self.journal,
            configDigest=lambda run: digestOf(self.vault.get(configName(run))),
            onRefused=self.refusals.append,
            wake=self.handOver,
        )
        self.worker = service.worker
        self.inventory = service.inventory
        self.worker.start()
        self.loadRuns(runner)

    def handOver(self, kick: Callable[[], None]) -> None:
        """A row was queued: kick the worker on the next turn, after the commit."""
        self.clock.callLater(0, kick)

    def restart(self, wipeVault: bool = False) -> None:
        self.worker.stop()
        super().restart(wipeVault)

    def add(self, *devices: Device) -> None:
        for d in devices:
            seedFake(self.fake, d)
