"""
The console's resources, built from the services the owner API reads
through: L{consoleTree} gives the fleet view (the admin root's index) and
the children of the admin root (C{device}, C{devices}, C{journal},
C{login}, C{logout}, C{static}).
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.web import resource

from fleetd.admin.console.device import DevicesPages
from fleetd.admin.console.fleet import Fleet
from fleetd.admin.console.gate import ConsoleGate, Guarded, Logout, Static
from fleetd.admin.console.journal import JournalView
from fleetd.admin.console.login import Login
from fleetd.admin.console.sessions import ConsoleSessions
from fleetd.admin.console.verify import verifyPage
from fleetd.admin.readers import ReaderRefusals
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.fleet.journal import Verify
from fleetd.fleet.provision import Provisioner
from fleetd.fleet.retire import RetireService
from fleetd.fleet.status import StatusService
from fleetd.fleet.view import FleetView
from fleetd.inventory.model import IInventory
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.registry import RunRegistry
from fleetd.store.chain import ChainMonitor
from fleetd.store.journal import AsyncJournal
from fleetd.trust.refusals import AttestRefusals
from fleetd.trust.service import TrustService
from fleetd.web.owner import OwnerOf, RoleOf


@dataclass(frozen=True)
class ConsoleServices:
    """What the console's pages read and change through (the owner API's)."""

    journal: AsyncJournal
    inventory: IInventory
    runs: RunRegistry
    alerts: AlertTracker
    status: StatusService
    deviceFlow: DeviceFlow
    trust: TrustService
    retire: RetireService
    verify: Verify
    chain: ChainMonitor
    provisioner: Provisioner
    # Seconds one inventory listing serves the fleet view (FleetView):
    # 0 for SQLite, more for NetBox, where a listing walks NetBox's pages.
    fleetListingAge: float = 0.0
    # Devices' standing refused attestations, for the fleet view (issue 27).
    refusals: AttestRefusals | None = None


@dataclass(frozen=True)
class ConsoleTree:
    """The fleet view (the root's index) and the root's console children."""

    index: resource.Resource
    children: dict[bytes, resource.Resource]


def fleetView(services: ConsoleServices, clock: IReactorTime) -> FleetView:
    """The fleet view's reader over C{services}."""
    return FleetView(
        services.inventory,
        services.runs,
        services.alerts,
        services.deviceFlow,
        clock,
        listingAge=services.fleetListingAge,
        refusals=services.refusals,
    )


def consoleTree(
    services: ConsoleServices,
    sessions: ConsoleSessions,
    clock: IReactorTime,
    owner: OwnerOf | None = None,
    role: RoleOf | None = None,
) -> ConsoleTree:
    """
    The console over C{services}; C{owner} names a request's certificate
    owner and C{role} its role (tests pass fakes; by default the TLS
    client certificate's).
    """
    readers = ReaderRefusals(services.journal, clock, via="console")
    gate = ConsoleGate(sessions, clock, owner, readers=readers, role=role)
    return ConsoleTree(
        index=Guarded(Fleet(fleetView(services, clock)), gate),
        children={
            b"device": Guarded(
                verifyPage(services.deviceFlow, services.inventory), gate
            ),
            b"journal": Guarded(
                JournalView(services.journal, services.inventory, services.chain), gate
            ),
            b"login": Login(gate, services.journal),
            b"logout": Guarded(Logout(sessions), gate),
            b"static": Static(),
            b"devices": Guarded(DevicesPages(services), gate),
        },
    )
