"""
The run registry: every current run of this fleetd, with the changes that
start and end runs (L{fleetd.runs.provision}) and their rebuilding after
a restart (L{fleetd.runs.recovery}). It holds the index of current runs
(L{fleetd.runs.index.BootIndex}, C{index}), which the boot path asks
directly, and offers its lookups to the rest of fleetd. Each run's
effects share one L{RunCore} (L{fleetd.runs.run}).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.inventory.model import Device, IInventory
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.index import BootIndex, RunView
from fleetd.runs.machine import Outcome
from fleetd.runs.notes import RunNotes
from fleetd.runs.provision import (
    ICredentials,
    IRunObjects,
    Provisioned,
    Provisioner,
)
from fleetd.runs.recovery import recover
from fleetd.runs.releaser import Releaser
from fleetd.runs.run import Run, RunCore
from fleetd.runs.store import RunRecord
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner
from fleetd.vault import IVault

_T = TypeVar("_T")


class RunRegistry:
    """All current runs of this fleetd: their index, provisions and recovery."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        vault: IVault,
        runner: IRunner,
        inventory: IInventory,
        journal: AsyncJournal,
        alerts: AlertTracker,
        codeKey: bytes,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        vaultFailures = Counter(
            "fleetd_vault_write_failures_total",
            "Vault writes that failed (a full or broken tmpfs), by purpose.",
            ["purpose"],
            registry=metrics,
        )
        for purpose in ("served-mark", "config"):
            vaultFailures.labels(purpose)  # exposed at 0 from the start
        self.index = BootIndex(
            vault=vault, runner=runner, codeKey=codeKey, vaultFailures=vaultFailures
        )
        self.vaultFailures = vaultFailures
        self.runner = runner
        self.clock = clock
        self.inventory = inventory
        self.journal = journal
        self.alerts = alerts
        self.releaser = Releaser(clock, inventory, journal)
        # Called with a run's record when its configuration was delivered
        # (boot completion [B1] listens here).
        self.deliveryObservers: list[Callable[[RunRecord], None]] = []
        self.core = RunCore(
            clock=clock,
            vault=vault,
            releaser=self.releaser,
            notes=RunNotes(clock, journal, alerts, self.index.currentRuns),
            observers=self.deliveryObservers,
            log=self.log,
        )
        self._provisioner = Provisioner(
            self.core, self.index, journal, inventory, alerts, self.log
        )

    async def load(self, checkVault: Callable[[], None] | None = None) -> None:
        """
        Rebuild every current run's state from the database, vault and
        inventory (L{recover}, which says what C{checkVault} is).
        """
        ready = await recover(
            self.core, self.index, self.runner, self.inventory, self.alerts, checkVault
        )
        self.index.loaded = True
        self.log.info(
            "runs.loaded {runs} runs, {ready} ready",
            runs=len(self.index.runs),
            ready=ready,
        )

    @property
    def loaded(self) -> bool:
        """Whether the runs are loaded (L{load}): boot answers from then on."""
        return self.index.loaded

    def stop(self) -> Deferred[None]:
        """Stop retrying records; fire when the ones in flight settled."""
        return self.releaser.stop()

    async def provision(
        self,
        devices: Iterable[Device],
        *,
        actor: str,
        render: Callable[..., bytes],
        desiredAction: str | None = None,
        credentials: ICredentials | None = None,
        via: str | None = None,
        supersedes: Mapping[str, str | None] | None = None,
        objects: IRunObjects | None = None,
    ) -> list[Provisioned]:
        """L{Provisioner.provision}."""
        return await self._provisioner.provision(
            devices,
            actor=actor,
            render=render,
            desiredAction=desiredAction,
            credentials=credentials,
            via=via,
            supersedes=supersedes,
            objects=objects,
        )

    async def retire(
        self, device: str, actor: str, work: Callable[[Database, Recorder], _T]
    ) -> _T:
        """L{Provisioner.retire}."""
        return await self._provisioner.retire(device, actor, work)

    # The index's lookups, for the rest of fleetd (L{BootIndex})

    def byCode(self, code: str) -> Run | None:
        return self.index.byCode(code)

    def current(self, device: str) -> RunRecord | None:
        return self.index.current(device)

    def readyRun(self, device: str) -> str | None:
        """The device's run that a request now would get (IRunLookup)."""
        return self.index.readyRun(device)

    def configDelivered(self, run: str) -> bool:
        return self.index.configDelivered(run)

    def identity(self, device: str) -> tuple[str, str] | None:
        return self.index.identity(device)

    def deviceByIdentity(self, uuid: str, serial: str) -> str | None:
        return self.index.deviceByIdentity(uuid, serial)

    async def view(self, device: str) -> RunView | None:
        return await self.index.view(device)

    async def views(self, devices: Sequence[str]) -> dict[str, RunView]:
        return await self.index.views(devices)

    # A run's delivery, as the boot path has it (L{fleetd.boot.config})

    def request(self, run: Run, peer: str) -> tuple[Outcome, bytes | None]:
        return self.index.request(run, peer)

    def finished(self, run: Run, complete: bool) -> None:
        self.index.finished(run, complete)

    def retired(self, code: str) -> Deferred[RunRecord | None]:
        return self.index.retired(code)
