"""
Parts of the daemon's assembly that L{fleetd.service} hands out, so that
it stays a list of children: the optional subsystems built from their
settings (C{[tinkerbell]}, NetBox as the inventory), each returning what
the others are given, the admin listener's site (L{adminSite}) and the
Tink proxy the tink listener serves (L{tinkProxy}).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.application.service import IServiceCollection
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.web.resource import Resource

from fleetd import __version__
from fleetd.admin.api import ownerAPI
from fleetd.admin.console.gate import consoleAPI
from fleetd.admin.console.sessions import ConsoleSessions
from fleetd.admin.console.tree import ConsoleServices, consoleTree
from fleetd.admin.deviceflow import followAdminPort
from fleetd.admin.resource import adminRoot
from fleetd.config import NetBoxSettings, Settings
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.fleet.provision import Provisioner
from fleetd.fleet.retire import retireService
from fleetd.fleet.status import StatusService
from fleetd.inventory.defined import SiteDefinitions
from fleetd.inventory.model import IInventory
from fleetd.kms.reasons import KMSMetrics
from fleetd.kms.record import DestructionRecord
from fleetd.kms.retire import KeyRetirement, SweepService
from fleetd.kms.service import DiskKeys
from fleetd.kmsgrpc.listener import KMSListener, kmsFactory
from fleetd.kube.service import KubeService
from fleetd.prepare import Prepared, diskEncryptionOf
from fleetd.reactors import IFleetdReactor
from fleetd.readiness import Readiness
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.placeholders import DevValues
from fleetd.runs.registry import RunRegistry
from fleetd.runs.render import TemplateRenderer
from fleetd.runs.vaultnames import configName
from fleetd.store.chain import ChainMonitor
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner
from fleetd.tink.service import TinkProxy
from fleetd.tink.wfstate import IWorkflowObserver
from fleetd.tink.workflows import REFRESH_FLOOR
from fleetd.tinkerbell.service import TinkerbellService
from fleetd.trust.bindings import bindingForSerial
from fleetd.trust.disks import DiskService
from fleetd.trust.refusals import AttestRefusals
from fleetd.trust.service import TrustService
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


@dataclass(frozen=True)
class DiskKeyParts:
    """fleetd as the site's Talos KMS (C{[kms]}, issue 30)."""

    keys: DiskKeys
    sweep: SweepService  # the start-up sweep; the KMS answers after it
    retirement: KeyRetirement  # the retirement's participant [E3]
    listener: KMSListener  # the kms listener's service is its child


def bindingApproved(db: Database, serial: str) -> bool:
    """[E1] Whether C{serial}'s EK binding is approved and holds now."""
    view = bindingForSerial(db.connection, serial)
    return view is not None and view.state == "approved"


def diskKeys(
    prepared: Prepared,
    *,
    reactor: IFleetdReactor,
    registry: CollectorRegistry,
    runner: IRunner,
    journal: AsyncJournal,
    inventory: IInventory,
    runs: RunRegistry,
    parent: IServiceCollection,
) -> DiskKeyParts | None:
    """With C{[kms]}, the KMS and its services under C{parent} (the kms
    listener is the caller's to add, to C{listener}); else L{None}."""
    s = prepared.settings
    if s.kms is None or prepared.kmsKey is None or prepared.kmsRecord is None:
        return None
    metrics = KMSMetrics(registry)
    record = DestructionRecord(prepared.kmsRecord, clock=reactor, metrics=metrics)
    keys = DiskKeys(
        clock=reactor, runner=runner, journal=journal, inventory=inventory,
        uuids=runs.index, approved=bindingApproved, masterKey=prepared.kmsKey,
        metrics=metrics, record=record,
    )  # fmt: skip
    sweep = SweepService(keys, inventory, journal, reactor)
    sweep.setServiceParent(parent)
    factory = kmsFactory(
        reactor, keys, s.kms, s.tink, idleTimeout=s.limits.idle_timeout,
        registry=registry,
    )  # fmt: skip
    listener = KMSListener(factory)
    listener.setServiceParent(parent)
    return DiskKeyParts(keys, sweep, KeyRetirement(keys), listener)


@dataclass(frozen=True)
class AdminSite:
    """The admin listener's site, and what the daemon keeps of it."""

    root: Resource
    console: ConsoleServices
    sessions: ConsoleSessions
    # Once the listener is bound: the device flow's and the console's links.
    follow: Callable[[IListeningPort], None]
    # Once the kms listener is bound: the endpoint written into configurations.
    followKMS: Callable[[IListeningPort], None]


def adminSite(
    prepared: Prepared,
    *,
    reactor: IFleetdReactor,
    registry: CollectorRegistry,
    readiness: Readiness,
    journal: AsyncJournal,
    chain: ChainMonitor,
    inventory: IInventory,
    runs: RunRegistry,
    alerts: AlertTracker,
    status: StatusService,
    trust: TrustService,
    disks: DiskService,
    refusals: AttestRefusals,
    deviceFlow: DeviceFlow,
    kube: KubeService | None,
    objects: Objects | None,
    diskKeys: DiskKeyParts | None = None,
) -> AdminSite:
    """
    The admin listener's tree (owner API, console, C{/healthz},
    C{/metrics}) over the subsystems, with what only it uses: the
    provisioner, the retirement and the site's definitions.
    """
    s = prepared.settings

    def offload(work: Callable[[bytes], Any], data: bytes) -> Deferred[Any]:
        """Run blocking C{work(data)} in the reactor's thread pool."""
        pool = reactor.getThreadPool()
        return deferToThreadPool(reactor, pool, work, data)

    retire = retireService(  # with or without [kubernetes]
        kube,
        clock=reactor,
        inventory=inventory,
        journal=journal,
        runs=runs,
        parts=tuple(
            part
            for part in (
                None if objects is None else objects.service,
                None if diskKeys is None else diskKeys.retirement,
            )
            if part is not None
        ),
    )
    encryption = diskEncryptionOf(s)
    renderer = TemplateRenderer(
        s.provision.templates,
        s.provision.default_cluster,
        values=DevValues(prepared.masterKey) if s.dev_values else None,
        diskEncryption=encryption,
    )
    defined = None  # NetBox refuses additions: its devices are made there
    if s.netbox is None:
        defined = SiteDefinitions(
            s.provision.classes, renderer.clusters, str(s.provision.templates)
        )
    sessions = ConsoleSessions(reactor)
    provisioner = Provisioner(  # the owner API's and the console's
        runs,
        inventory,
        renderer,
        journal,
        credentials=None if kube is None else kube.book,
        objects=None if objects is None else objects.service,
    )
    api = ownerAPI(
        inventory=inventory,
        journal=journal,
        offload=offload,
        defined=defined,
        provisioner=provisioner,
        trust=trust,
        disks=disks,
        status=status,
        deviceFlow=deviceFlow,
        retire=retire,
        kube=kube,
        database=prepared.database.path,
    )
    api[b"console"] = consoleAPI(sessions, journal)
    console = ConsoleServices(
        journal=journal,
        inventory=inventory,
        runs=runs,
        alerts=alerts,
        status=status,
        deviceFlow=deviceFlow,
        trust=trust,
        retire=retire,
        verify=chain.verify,
        chain=chain,
        provisioner=provisioner,
        refusals=refusals,
        fleetListingAge=0.0 if s.netbox is None else NETBOX_LISTING_AGE,
    )
    root = adminRoot(
        clock=reactor,
        registry=registry,
        journal=journal,
        site=s.site_name,
        version=__version__,
        api=api,
        readiness=readiness,
        inventory=inventory,
        verify=chain.verify,  # the chain gauge follows at once
        console=consoleTree(console, sessions, reactor),
    )
    follow = followAdminPort(
        deviceFlow,
        s.topology.enrollment_name,
        sessions.setBase,
        consoleHost=s.owner.console_host,
    )
    followKMS = (lambda port: None) if encryption is None else encryption.bound
    return AdminSite(root, console, sessions, follow, followKMS)


def tinkProxy(
    prepared: Prepared,
    *,
    reactor: IFleetdReactor,
    registry: CollectorRegistry,
    inventory: IInventory,
    runs: RunRegistry,
    runner: IRunner,
    journal: AsyncJournal,
    alerts: AlertTracker,
    kube: KubeService | None,
    objects: Objects | None,
) -> TinkProxy:
    """The Tink proxy (its listener is the caller's to add)."""
    s = prepared.settings
    return TinkProxy(
        reactor,
        s.tink,
        idleTimeout=s.limits.idle_timeout,
        registry=registry,
        inventory=inventory,
        runs=runs,
        runner=runner,
        journal=journal,
        alerts=alerts,
        kube=None if kube is None else kube.client,
        upstreamCA=prepared.upstreamCA,
        # a stranger naming unknown MACs must not walk NetBox every second
        listingFloor=REFRESH_FLOOR if s.netbox is None else NETBOX_LISTING_AGE,
        objects=None if objects is None else objects.watched,
    )
