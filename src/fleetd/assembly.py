"""
Parts of the daemon's assembly that L{fleetd.service} hands out, so that
it stays a list of children: the optional subsystems built from their
settings (C{[tinkerbell]}), each returning what the others are given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.application.service import IServiceCollection
from twisted.internet.interfaces import IReactorTime

from fleetd.config import NetBoxSettings, Settings
from fleetd.inventory.model import IInventory
from fleetd.kube.service import KubeService
from fleetd.runs.registry import RunRegistry
from fleetd.runs.vaultnames import configName
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner
from fleetd.tink.wfstate import IWorkflowObserver
from fleetd.tinkerbell.service import TinkerbellService
from fleetd.vault import IVault

# Seconds one listing of a NetBox inventory serves the console's fleet view,
# and the least between two listings the Tink proxy asks for unknown ids
# (each listing walks NetBox's device pages: an owner refreshing, or
# strangers naming MACs on the tink listener, must not walk them each time).
NETBOX_LISTING_AGE = 10.0


def netboxInventory(
    netbox: NetBoxSettings,
    *,
    reactor: Any,
    runner: IRunner,
    journal: AsyncJournal,
    vault: IVault,
    onRefused: Callable[[str], None],
    registry: CollectorRegistry,
    parent: IServiceCollection,
) -> IInventory:
    """NetBox as the inventory (design.md, State), its service under C{parent}."""
    from fleetd.netbox.wiring import netboxService  # only when configured

    service = netboxService(
        reactor, netbox, runner, journal,
        configOf=lambda run: vault.get(configName(run)),
        onRefused=onRefused, metrics=registry,
    )  # fmt: skip
    service.setServiceParent(parent)
    return service.inventory


@dataclass(frozen=True)
class Objects:
    """Tinkerbell's objects (issue 28), for the parts that use them."""

    service: TinkerbellService
    namespace: str

    @property
    def watched(self) -> tuple[str, IWorkflowObserver]:
        """What the Workflow watch tells (L{fleetd.tink.service.TinkProxy})."""
        return self.namespace, self.service.reports

    def view(self, device: str) -> dict[str, Any] | None:
        return self.service.view(device)


def tinkerbellObjects(
    settings: Settings,
    *,
    clock: IReactorTime,
    kube: KubeService | None,
    journal: AsyncJournal,
    runner: IRunner,
    runs: RunRegistry,
    registry: CollectorRegistry,
    parent: IServiceCollection,
) -> Objects | None:
    """
    With C{[tinkerbell]} (which needs C{[kubernetes]}, checked with the
    configuration), the service keeping each device's Hardware and its
    runs' Workflows, started and stopped under C{parent}; else L{None}.
    """
    if settings.tinkerbell is None or kube is None:
        return None
    service = TinkerbellService(
        clock=clock,
        client=kube.client,
        settings=settings.tinkerbell,
        journal=journal,
        runner=runner,
        readyRun=runs.readyRun,
        metrics=registry,
    )
    service.setServiceParent(parent)
    return Objects(service, settings.tinkerbell.namespace)
