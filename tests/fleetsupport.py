"""
One fleetd's run state for synchronous tests: an InlineRunner over a real
SQLite file, the real inventory and run registry on a task.Clock, and a
DirectoryVault (or the one given); rebuildable to model a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
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
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.machine import Outcome
from fleetd.runs.placeholders import DevValues
from fleetd.runs.registry import RunRegistry
from fleetd.runs.render import NodeFacts, TemplateRenderer
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.store.runner import InlineRunner
from fleetd.vault import DirectoryVault, IVault
from tests.support import REPO

KEY = b"k" * 32
# The example template, its placeholders filled with dev values (issue 27).
DEV_VALUES = DevValues(KEY)
RENDERER = TemplateRenderer(REPO / "conf" / "templates", values=DEV_VALUES)


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

    def releaseIn(self, db: Database, record: ServedRecord) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise InventoryError("netbox down", "unavailable")
        return self._inner.releaseIn(db, record)

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
        self.hold = 900.0
        self.start()

    def start(self, vault: IVault | None = None, inventory: Any = None) -> None:
        self.db = Database.open(self.directory / "fleetd.sqlite3")
        self.test.addCleanup(self.db.close)
        runner = InlineRunner(self.db)
        self.runner = runner
        self.journal = AsyncJournal(runner, Journal(KEY), self.clock)
        self.inventory = (
            inventory
            if inventory is not None
            else SQLiteInventory(runner, self.journal)
        )
        self.vault = (
            vault
            if vault is not None
            else DirectoryVault.open(self.directory / "vault", allowAnyFilesystem=True)
        )
        self.loadRuns(runner)

    def loadRuns(self, runner: Any) -> None:
        """The alert tracker and the run registry over this fleet, loaded."""
        self.alerts = AlertTracker(self.clock, hold=self.hold)
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
            self.test.successResultOf(self.inventory.add(d, journal=()))

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

    def fetch(
        self, code: str, complete: bool = True, peer: str = "127.0.0.1"
    ) -> tuple[Outcome, bytes | None]:
        run = self.registry.byCode(code)
        assert run is not None
        outcome, body = self.registry.request(run, peer)
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
