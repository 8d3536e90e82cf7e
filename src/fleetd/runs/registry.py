"""
The run registry: every current run of this fleetd, indexed for the boot
path (L{fleetd.runs.index}), with the changes that start and end runs
(L{fleetd.runs.provision}) and their rebuilding after a restart
(L{fleetd.runs.recovery}). Each run's effects share one L{RunCore}
(L{fleetd.runs.run}).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.inventory.model import Device, IInventory
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.index import BootIndex
from fleetd.runs.notes import RunNotes
from fleetd.runs.provision import (
    ICredentials,
    IRunObjects,
    Provisioned,
    Provisioner,
)
from fleetd.runs.recovery import recover
from fleetd.runs.releaser import Releaser
from fleetd.runs.run import RunCore
from fleetd.runs.store import RunRecord
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner
from fleetd.vault import IVault

_T = TypeVar("_T")


class RunRegistry(BootIndex):
    """All current runs of this fleetd, and the decisions of the boot path."""

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
        super().__init__(
            vault=vault, runner=runner, codeKey=codeKey, vaultFailures=vaultFailures
        )
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
            notes=RunNotes(clock, journal, alerts, self.currentRuns),
            observers=self.deliveryObservers,
            log=self.log,
        )
        self._provisioner = Provisioner(
            self.core, self, journal, inventory, alerts, self.log
        )

    async def load(self, checkVault: Callable[[], None] | None = None) -> None:
        """
        Rebuild every current run's state from the database, vault and
        inventory (L{recover}, which says what C{checkVault} is).
        """
        ready = await recover(
            self.core, self, self.runner, self.inventory, self.alerts, checkVault
        )
        self.loaded = True
        self.log.info(
            "runs.loaded {runs} runs, {ready} ready", runs=len(self.runs), ready=ready
        )

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
