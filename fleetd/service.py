"""
Assemble fleetd from its settings: one reactor, separate listeners.

L{prepare} reads and checks every file the daemon needs (TLS material,
vault directory, state database) before anything listens, so a bad
configuration stops start-up with one line and nothing half-started.
L{FleetdService} then binds the listeners in C{privilegedStartService}
and starts the workers in C{startService}. Every part owns its stop: the
database worker wraps the services that use it (they stop first), each
listener stops what it serves, the Tink proxy drains its own listener and
the start-up load (L{LoadService}) is waited for before the worker stops.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import IO, Any

from prometheus_client import CollectorRegistry
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IProtocolFactory
from twisted.internet.ssl import CertificateOptions
from twisted.internet.threads import deferToThreadPool
from twisted.logger import ILogObserver, Logger
from twisted.python.components import Componentized
from twisted.python.failure import Failure
from twisted.web.resource import Resource

from fleetd import __version__
from fleetd.admin.deviceflow import (
    DevicePage,
    deviceFlowAdminResource,
    followAdminPort,
    verificationURI,
)
from fleetd.admin.devices import devicesResource
from fleetd.admin.kube import clusterTokenResource, retireResource
from fleetd.admin.provision import ProvisionResource
from fleetd.admin.resource import adminRoot
from fleetd.admin.status import StatusResource
from fleetd.admin.trust import (
    BindingsResource,
    DisksAdminResource,
    EvidenceResource,
)
from fleetd.attest.identity import LDevIDBook, LDevIDIdentifier
from fleetd.attest.lookup import LookupService
from fleetd.attest.service import AttestationService
from fleetd.attest.wiring import (
    approvedSerialFor,
    bindingRefusal,
    diskRefusal,
    targetDiskFor,
)
from fleetd.boot.config import ConfigResource
from fleetd.boot.deviceflow_resource import deviceCodeResource, tokenResource
from fleetd.boot.resource import bootRoot
from fleetd.config import NetBoxSettings, loadTopology
from fleetd.device.attest import deviceAPI
from fleetd.device.disks import NodeDisksResource
from fleetd.device.identity import byLDevID
from fleetd.device.resource import deviceRoot
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.dns.service import DNSService
from fleetd.heap import ICollector, pauseForStartup, tune
from fleetd.inventory.model import IInventory
from fleetd.inventory.sqlite import SQLiteInventory
from fleetd.kube.connect import clientFromSettings
from fleetd.kube.retire import RetireService
from fleetd.kube.service import KubeService
from fleetd.kube.status import KubeStatus
from fleetd.listen.policy import ListenerName, listenerPolicy
from fleetd.listen.service import ListenerService, StartupError
from fleetd.listen.tls import tlsFactory
from fleetd.loading import LoadService
from fleetd.logs import makeObserver
from fleetd.metrics import listenerGauges, makeRegistry
from fleetd.prepare import Prepared, prepare
from fleetd.ratelimit import RateLimiter
from fleetd.reactors import IFleetdReactor
from fleetd.readiness import Readiness, notifySystemd
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.registry import RunRegistry
from fleetd.runs.render import TemplateRenderer
from fleetd.status import StatusService
from fleetd.store.chain import ChainMonitor
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.store.keys import deriveKey
from fleetd.store.runner import DatabaseRunner, RunnerService
from fleetd.tink.service import TinkProxy
from fleetd.trust.disks import DiskService
from fleetd.trust.service import TrustService
from fleetd.web.owner import isOwner
from fleetd.web.site import BoundedSite


class FleetdService(MultiService):
    """The whole daemon: listeners, DNS, database worker, journal."""

    log = Logger()

    def __init__(
        self,
        prepared: Prepared,
        reactor: IFleetdReactor,
        *,
        logFormat: str = "text",
        logOutput: IO[Any] | None = None,
        handleSignals: bool = False,
        onStartupError: Callable[[str], None] | None = None,
        collector: ICollector | None = None,
        notify: Callable[[bytes], object] = notifySystemd,
    ) -> None:
        """
        @param collector: the C{gc} module, to tune for a long-running
            daemon (L{fleetd.heap}); L{None} leaves the collector alone
            (tests share their process).
        @param notify: sends a state line to the service manager
            (C{READY=1} once loaded; L{fleetd.readiness}).
        """
        super().__init__()
        self.collector = collector
        settings = prepared.settings
        self.settings = settings
        self.reactor = reactor
        self.vault = prepared.vault
        self.logFormat = logFormat
        self.logOutput = logOutput
        self.handleSignals = handleSignals
        self.onStartupError = onStartupError
        self.registry: CollectorRegistry = makeRegistry(__version__, settings.site_name)
        self.notify = notify
        self.readiness = Readiness(self.registry)  # /healthz, fleetd_ready
        self.runner = DatabaseRunner(reactor, prepared.database)
        # Started first, stopped last: every other service is its child.
        self.database = RunnerService(self.runner)
        self.database.setServiceParent(self)
        self.journal = AsyncJournal(
            self.runner,
            Journal(deriveKey(prepared.masterKey, "journal")),
            reactor,
        )
        # [J2] verified at start, once the run load no longer waits behind it.
        self.chain = ChainMonitor(
            reactor, self.journal, self.registry, after=self.readiness.whenSettled
        )
        self.chain.setServiceParent(self.database)
        # Children of /v1/admin/ contributed by subsystems (behind the owner gate).
        self.adminAPI: dict[bytes, Resource] = {}
        self.inventory: IInventory = SQLiteInventory(self.runner, self.journal)
        if settings.netbox is not None:
            self.inventory = self._netbox(settings.netbox)
        self.adminAPI[b"devices"] = devicesResource(
            self.inventory, self.journal, offload=self._inThread
        )
        self.alerts = AlertTracker(reactor, settings.provision.alert_hold).register(
            self.registry
        )
        self.runs = RunRegistry(
            clock=reactor,
            vault=self.vault,
            runner=self.runner,
            inventory=self.inventory,
            journal=self.journal,
            alerts=self.alerts,
            codeKey=deriveKey(prepared.masterKey, "codes"),
            metrics=self.registry,
        )
        renderer = TemplateRenderer(
            settings.provision.templates, settings.provision.default_cluster
        )
        self.kube = self._kubernetes(prepared)
        self.adminAPI[b"provision"] = ProvisionResource(
            self.runs,
            self.inventory,
            renderer,
            self.journal,
            credentials=None if self.kube is None else self.kube.book,
        )
        self.trust = TrustService(self.runner, self.journal, self.inventory, reactor)
        self.adminAPI[b"evidence"] = EvidenceResource(self.trust, self._inThread)
        self.adminAPI[b"bindings"] = BindingsResource(self.trust)
        self.disks = DiskService(self.runner, self.journal, reactor)
        self.adminAPI[b"disks"] = DisksAdminResource(self.disks)
        self._buildAttestation(prepared)
        # Children of /v1/node/ on the device listener besides the lookups;
        # who calls is decided by the LDevID identification [T4].
        self.nodeAPI: dict[bytes, Resource] = {
            b"disks": NodeDisksResource(
                self.disks, byLDevID(self.identifyLDevID), admit=self.lookups.admit
            )
        }
        self.status = StatusService(
            self.inventory,
            self.runs,
            self.alerts,
            self.journal,
            trust=self.trust,
            disks=self.disks,
            credentials=KubeStatus(self.runner, reactor),
            ldevid=self.ldevids.status,
        )
        self.adminAPI[b"status"] = StatusResource(self.status)
        self.listeners: dict[str, ListenerService] = {}
        self._buildListeners(prepared)
        # Last to start, first to stop: the runs, then the boot states that
        # need them [B1]; the worker stops only once the load settled.
        self.loading = LoadService(
            self._load,
            self.readiness,
            notify=notify,
            collector=collector,
            started=self._started,
            stop=self.runs.stop,
        )
        self.loading.setServiceParent(self.database)

    def _netbox(self, netbox: NetBoxSettings) -> IInventory:
        """C{[netbox]} present: NetBox is the inventory (DESIGN section 4)."""
        from fleetd.netbox.connect import makeClient
        from fleetd.netbox.inventory import digestOf
        from fleetd.netbox.service import NetBoxService
        from fleetd.runs.registry import configName

        vault = self.vault
        service = NetBoxService(
            self.reactor,
            makeClient(self.reactor, netbox.url, netbox.token_file, netbox.ca),
            self.runner,
            self.journal,
            configDigest=lambda run: digestOf(vault.get(configName(run))),
            onRefused=self._refused,
            metrics=self.registry,
        )
        service.setServiceParent(self.database)
        return service.inventory

    def _refused(self, message: str) -> None:
        """A peer refuses fleetd's start (NetBox lacks its fields): stop."""
        if self.onStartupError is not None:
            try:
                self.onStartupError(message)
            except SystemExit:
                pass
        self.reactor.stop()

    def _kubernetes(self, prepared: Prepared) -> KubeService | None:
        """
        Kubernetes credentials [K1]-[K7] [R1]. Without [kubernetes] fleetd
        makes no cluster calls: provisions carry the template's own
        cluster.token, cluster-token commands refuse, retirement still
        marks the device and journals what it cannot revoke.
        """
        kube = self.settings.kubernetes
        service = None
        if kube is not None:
            service = KubeService(
                clock=self.reactor,
                settings=kube,
                client=clientFromSettings(self.reactor, kube),
                runner=self.runner,
                journal=self.journal,
                inventory=self.inventory,
                sealKey=deriveKey(prepared.masterKey, "kube cluster token"),
                metrics=self.registry,
            )
            service.setServiceParent(self.database)
        self.adminAPI[b"cluster-token"] = clusterTokenResource(
            None if service is None else service.cluster
        )
        self.adminAPI[b"retire"] = retireResource(
            RetireService(
                clock=self.reactor,
                inventory=self.inventory,
                journal=self.journal,
                runner=self.runner,
                client=None if service is None else service.client,
                book=None if service is None else service.book,
                runs=self.runs,
                approvals=None if service is None else service.approver.flights,
            )
        )
        return service

    def _buildAttestation(self, prepared: Prepared) -> None:
        """Attestation, LDevID issuance and lookups on the device listener."""
        self.ldevids = LDevIDBook()
        self.ldevids.load(prepared.database)  # before any listener answers
        self.attestation = AttestationService(
            clock=self.reactor,
            runner=self.runner,
            journal=self.journal,
            ekRoots=prepared.ekRoots,
            issuer=prepared.issuer,
            book=self.ldevids,
            approvedSerialFor=approvedSerialFor,
            deviceBySerial=self.inventory.bySerial,
            challengeTTL=self.settings.challenge_ttl,
            bindingRefusal=bindingRefusal,
        )
        self.identifyLDevID = LDevIDIdentifier(prepared.trustBundle, self.ldevids)
        self.lookups = LookupService(
            runner=self.runner,
            attestation=self.attestation,
            book=self.ldevids,
            getDevice=self.inventory.get,
            runs=self.runs,
            vault=self.vault,
            targetDiskFor=targetDiskFor,
            diskRefusal=diskRefusal,
        )

    def _inThread(self, work: Callable[[bytes], Any], data: bytes) -> Deferred[Any]:
        """Run blocking C{work(data)} in the reactor's thread pool."""
        pool = self.reactor.getThreadPool()
        return deferToThreadPool(self.reactor, pool, work, data)

    def _web(self, name: ListenerName, root: Resource, **hooks: Any) -> None:
        """A BoundedSite for C{root} behind listener C{name}'s policy;
        C{hooks} are the listener's (L{ListenerService})."""
        s = self.settings
        policy = listenerPolicy(s, name)  # body limits, client CA [O1] [O2] [T4]
        assert policy.maxBodyBytes is not None
        site = BoundedSite(
            root,
            maxHeaderBytes=s.limits.max_header_bytes,
            maxHeaders=s.limits.max_headers,
            maxBodyBytes=policy.maxBodyBytes,
            # The listener's sweep closes idle connections (no byte either
            # way for limits.idle_timeout): no HTTP timer per connection.
            idleTimeout=None,
            requestTimeout=s.limits.request_timeout,
            clock=self.reactor,
            privileged=isOwner if policy.largeBodiesForOwnersOnly else None,
        )
        self._listen(
            name, getattr(s.listen, name), policy.tlsOptions(s.tls), site, **hooks
        )

    def _listen(
        self,
        name: str,
        description: str,
        options: CertificateOptions,
        factory: IProtocolFactory,
        idleTimeout: float | None = None,
        parent: MultiService | None = None,
        **hooks: Any,
    ) -> None:
        limited = tlsFactory(
            options,
            factory,
            name=name,
            clock=self.reactor,
            maxConnections=self.settings.limits.max_connections,
            maxPerSource=self.settings.limits.max_connections_per_source,
            idleTimeout=idleTimeout or self.settings.limits.idle_timeout,
        )
        self._openGauge.labels(name).set_function(limited.openConnections)
        self._maxGauge.labels(name).set(limited.maxConnections)
        listener = ListenerService(self.reactor, name, description, limited, **hooks)
        listener.setServiceParent(self.database if parent is None else parent)
        self.listeners[name] = listener

    def _buildListeners(self, prepared: Prepared) -> None:
        s = self.settings
        self._openGauge, self._maxGauge = listenerGauges(self.registry)
        bl = s.boot_limits
        self.bootLimiter = RateLimiter(
            self.reactor,
            rate=bl.failure_rate,
            burst=bl.failure_burst,
            globalRate=bl.global_failure_rate,
            globalBurst=bl.global_failure_burst,
        )
        self.deviceFlow = DeviceFlow(
            self.reactor,
            self.runs,
            self.journal,
            # The admin port is known once bound (followAdminPort).
            verificationURI=verificationURI(s.topology.enrollment_name, None),
        )
        self.adminAPI[b"device-flow"] = deviceFlowAdminResource(self.deviceFlow)
        self.configResource = ConfigResource(
            self.runs,
            clock=self.reactor,
            metrics=self.registry,
            limiter=self.bootLimiter,
            grants=self.deviceFlow,
        )
        self._web(
            "boot",
            bootRoot(
                config=self.configResource,
                deviceCode=deviceCodeResource(self.deviceFlow),
                token=tokenResource(self.deviceFlow),
            ),
            onStop=self.configResource.stop,
        )
        api = deviceAPI(
            self.attestation, self.identifyLDevID, self.lookups, node=self.nodeAPI
        )
        self._web("device", deviceRoot(api), onStop=self.attestation.stop)
        admin = adminRoot(
            clock=self.reactor,
            registry=self.registry,
            journal=self.journal,
            site=s.site_name,
            version=__version__,
            api=self.adminAPI,
            readiness=self.readiness,
        )
        admin.putChild(b"device", DevicePage())  # owners only [F3]
        self._web(
            "admin",
            admin,
            onListening=followAdminPort(self.deviceFlow, s.topology.enrollment_name),
        )
        self.tink = TinkProxy(
            self.reactor,
            s.tink,
            idleTimeout=s.limits.idle_timeout,
            registry=self.registry,
            inventory=self.inventory,
            runs=self.runs,
            runner=self.runner,
            journal=self.journal,
            alerts=self.alerts,
            kube=None if self.kube is None else self.kube.client,
            upstreamCA=prepared.upstreamCA,
        )
        self.tink.setServiceParent(self.database)
        self._listen(
            "tink",
            s.listen.tink,
            listenerPolicy(s, "tink").tlsOptions(s.tls),
            self.tink.factory,
            # tink-server may take a minute to answer (it retries conflicts):
            # a call in flight is timed by tink.stream_timeout, an idle
            # connection still by limits.idle_timeout (the HTTP/2 layer).
            idleTimeout=max(s.limits.idle_timeout, s.tink.stream_timeout),
            parent=self.tink,  # which drains it before it stops
        )
        self.dns = DNSService(
            self.reactor,
            s.topology,
            port=s.listen.dns_port,
            interface=s.listen.dns_interface,
            ttl=s.dns_ttl,
            registry=self.registry,
            topologyLoader=lambda: loadTopology(s.topology_file),
            maxConnections=s.limits.max_connections,
            idleTimeout=s.limits.idle_timeout,
            maxConnectionsPerSource=s.limits.max_connections_per_source,
            rateLimit=s.dns_rate_limit,
        )
        self.dns.setName("dns")
        self.dns.setServiceParent(self.database)

    def setServiceParent(self, parent: Any) -> None:
        """
        Under twistd the parent is the Application: give it fleetd's log
        observer so every line, twistd's own included, has one format.
        """
        if isinstance(parent, Componentized) and self.logOutput is not None:
            parent.setComponent(
                ILogObserver, makeObserver(self.logFormat, self.logOutput)
            )
        super().setServiceParent(parent)

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except StartupError as e:
            for listener in reversed(self.listeners.values()):
                listener.stopService()  # the ones bound close again
            if self.onStartupError is not None:
                self.onStartupError(str(e))
            raise

    def startService(self) -> None:
        if self.collector is not None:
            tune(self.collector)
            pauseForStartup(self.collector)  # until the load settled
        super().startService()
        if self.handleSignals:
            signal.signal(signal.SIGHUP, self._sighup)

    def _started(self) -> None:
        self.log.info(
            "fleetd.started {version} {site} vault={entries}",
            version=__version__,
            site=self.settings.site_name,
            entries=len(self.vault),
        )
        self.journal.append(
            "fleetd.started", actor="fleetd", fields={"version": __version__}
        ).addErrback(self._journalFailed)

    async def _load(self) -> None:
        await self.runs.load()
        await self.tink.load()  # boot completion needs the runs [B1]

    def _journalFailed(self, f: Failure) -> None:
        self.log.failure("journal.append.failed", failure=f)

    def _sighup(self, signum: int, frame: Any) -> None:
        self.reactor.callFromThread(self.dns.reloadTopology)

    def stopService(self) -> Deferred[None]:
        if self.handleSignals:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
        self.log.info("fleetd.stopping")
        self.notify(b"STOPPING=1")
        stopping: Deferred[Any] = super().stopService()
        # The vault directory's descriptor, held since prepare().
        return stopping.addCallback(lambda _: self.vault.close())


__all__ = ["FleetdService", "Prepared", "StartupError", "prepare"]
