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
from twisted.logger import ILogObserver, Logger
from twisted.python.components import Componentized
from twisted.python.failure import Failure
from twisted.web.resource import Resource

from fleetd import __version__
from fleetd.admin.deviceflow import verificationURI
from fleetd.assembly import (
    adminSite,
    diskKeys,
    netboxInventory,
    tinkerbellObjects,
    tinkProxy,
)
from fleetd.attest.wiring import buildAttestation
from fleetd.boot.face import bootFace
from fleetd.config import ConfigError, NetBoxSettings
from fleetd.device.resource import deviceFace
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.dns.service import DNSService
from fleetd.fleet.status import StatusService
from fleetd.heap import ICollector, pauseForStartup, tune
from fleetd.inventory.census import LOCAL_INTERVAL, REMOTE_INTERVAL, Census
from fleetd.inventory.model import IInventory
from fleetd.inventory.sqlite import SQLiteInventory
from fleetd.k8s.connect import clientFromSettings
from fleetd.kube.service import KubeService
from fleetd.kube.status import KubeStatus
from fleetd.listen.expiry import watchCertificates
from fleetd.listen.policy import ListenerName, listenerPolicy
from fleetd.listen.reload import reloadCertificates
from fleetd.listen.selfcheck import SelfCheck
from fleetd.listen.service import Listeners, ListenerService, StartupError
from fleetd.loading import LoadService
from fleetd.logs import makeObserver
from fleetd.metrics import makeRegistry
from fleetd.prepare import Prepared, prepare
from fleetd.reactors import IFleetdReactor
from fleetd.readiness import Readiness, notifySystemd
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.registry import RunRegistry
from fleetd.store.chain import ChainMonitor
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.store.keys import deriveKey
from fleetd.store.runner import DatabaseRunner, RunnerService
from fleetd.trust.disks import DiskService
from fleetd.trust.refusals import AttestRefusals
from fleetd.trust.service import TrustService
from fleetd.web.site import listenerSite


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
            (C{READY=1} once loaded and every listener passed its TLS
            self-check; L{fleetd.readiness}).
        """
        super().__init__()
        s = self.settings = prepared.settings
        self.reactor = reactor
        self.vault = prepared.vault
        self._uncheckedVault = prepared.uncheckedVault
        self.collector = collector
        self.logFormat = logFormat
        self.logOutput = logOutput
        self.handleSignals = handleSignals
        self.onStartupError = onStartupError
        self.notify = notify
        self.registry: CollectorRegistry = makeRegistry(__version__, s.site_name)
        self.readiness = Readiness(self.registry, notify)  # /healthz, fleetd_ready
        self.runner = DatabaseRunner(reactor, prepared.database)
        # Started first, stopped last: every other service is its child.
        self.database = RunnerService(self.runner)
        self.database.setServiceParent(self)
        key = prepared.masterKey
        self.journal = AsyncJournal(
            self.runner, Journal(deriveKey(key, "journal")), reactor
        )
        # [J2] verified at start, once the run load no longer waits behind it.
        self.chain = ChainMonitor(
            reactor, self.journal, self.registry, after=self.readiness.whenSettled
        )
        self.chain.setServiceParent(self.database)
        self.inventory: IInventory = SQLiteInventory(self.runner, self.journal)
        if s.netbox is not None:  # NetBox is the inventory (design.md, State)
            self.inventory = self._netbox(s.netbox)
        self.alerts = AlertTracker(reactor, s.provision.alert_hold).register(
            self.registry
        )
        self.runs = RunRegistry(
            clock=reactor,
            vault=self.vault,
            runner=self.runner,
            inventory=self.inventory,
            journal=self.journal,
            alerts=self.alerts,
            codeKey=deriveKey(key, "codes"),
            metrics=self.registry,
        )
        # Kubernetes credentials [K1]-[K7] [R1]; without [kubernetes] no
        # cluster calls (retirement still journals what it cannot revoke).
        self.kube: KubeService | None = None
        if s.kubernetes is not None:
            self.kube = KubeService(
                clock=reactor,
                settings=s.kubernetes,
                client=clientFromSettings(reactor, s.kubernetes),
                runner=self.runner,
                journal=self.journal,
                inventory=self.inventory,
                sealKey=deriveKey(key, "kube cluster token"),
                metrics=self.registry,
            )
            self.kube.setServiceParent(self.database)
        self.objects = tinkerbellObjects(  # [tinkerbell]: Hardware and Workflows
            s, clock=reactor, kube=self.kube, journal=self.journal,
            runner=self.runner, runs=self.runs, registry=self.registry,
            parent=self.database,
        )  # fmt: skip
        self.diskKeys = diskKeys(  # [kms]: fleetd as the site's Talos KMS
            prepared, reactor=reactor, registry=self.registry, runner=self.runner,
            journal=self.journal, inventory=self.inventory, runs=self.runs,
            parent=self.database,
        )  # fmt: skip
        self.trust = TrustService(self.runner, self.journal, self.inventory, reactor)
        self.disks = DiskService(self.runner, self.journal, reactor)
        attestation = buildAttestation(
            clock=reactor,
            runner=self.runner,
            journal=self.journal,
            database=prepared.database,
            inventory=self.inventory,
            runs=self.runs,
            vault=self.vault,
            ekRoots=prepared.ekRoots,
            issuer=prepared.issuer,
            trustBundle=prepared.trustBundle,
            challengeTTL=s.challenge_ttl,
            metrics=self.registry,
            known=self.runs.index,
        )
        self.attestation = attestation
        self.ldevids, self.lookups = attestation.ldevids, attestation.lookups
        self.refusals = AttestRefusals(self.runner, self.journal)  # issue 27
        self.status = StatusService(
            self.inventory, self.runs, self.alerts, self.journal,
            trust=self.trust, disks=self.disks,
            credentials=KubeStatus(self.runner, reactor),
            ldevid=self.ldevids.status,
            kubernetes=self.kube is not None,
            refusals=self.refusals,
            objects=None if self.objects is None else self.objects.view,
            diskKey=None if self.diskKeys is None else self.diskKeys.keys.view,
        )  # fmt: skip
        # fleetd_devices and the longest-staged node, counted in the background
        self.census = Census(
            reactor, self.inventory, self.registry,
            interval=LOCAL_INTERVAL if s.netbox is None else REMOTE_INTERVAL,
            staged=s.kubernetes is not None, after=self.readiness.whenSettled,
        )  # fmt: skip
        self.census.setServiceParent(self.database)
        self._listeners = Listeners(
            reactor,
            self.registry,
            maxConnections=s.limits.max_connections,
            maxPerSource=s.limits.max_connections_per_source,
            idleTimeout=s.limits.idle_timeout,
        )
        self.listeners: dict[str, ListenerService] = self._listeners.services
        watchCertificates(self.registry, self._listeners, s, prepared.certificates)
        self._buildListeners(prepared)
        # Ready once fleetd completed a TLS handshake with each listener;
        # stops before them (listen/selfcheck).
        self.readiness.expect(self.listeners)
        self.selfCheck = SelfCheck(
            reactor, self._listeners.targets, self.readiness.checked
        )
        self.selfCheck.setServiceParent(self.database)
        # Last to start, first to stop: the runs, then the boot states that
        # need them [B1]; the worker stops only once the load settled.
        self.loading = LoadService(
            self._load,
            self.readiness,
            collector=collector,
            started=self._started,
            stop=self.runs.stop,
        )
        self.loading.setServiceParent(self.database)

    def _netbox(self, netbox: NetBoxSettings) -> IInventory:
        return netboxInventory(
            netbox, reactor=self.reactor, runner=self.runner, journal=self.journal,
            vault=self.vault, onRefused=self._refused, registry=self.registry,
            parent=self.database,
        )  # fmt: skip

    def _refused(self, message: str) -> None:
        """A peer refuses fleetd's start (NetBox lacks its fields): stop."""
        if self.onStartupError is not None:
            try:
                self.onStartupError(message)
            except SystemExit:
                pass
        self.reactor.stop()

    def _web(self, name: ListenerName, root: Resource, **hooks: Any) -> None:
        """Listener C{name} serving C{root} under its policy [O1] [O2] [T4]."""
        s = self.settings
        policy = listenerPolicy(s, name)  # body limits, client CA
        site = listenerSite(root, policy, s.limits, self.reactor)
        description, options = getattr(s.listen, name), policy.tlsOptions(s.tls)
        listener = self._listeners.add(
            name, description, options, site, protocol=policy.clientProtocol, **hooks
        )
        listener.setServiceParent(self.database)

    def _buildListeners(self, prepared: Prepared) -> None:
        s = self.settings
        self.deviceFlow = DeviceFlow(
            self.reactor,
            self.runs,
            self.journal,
            # The admin port is known once bound (followAdminPort).
            verificationURI=verificationURI(s.topology.enrollment_name, None),
        )
        boot = bootFace(
            self.runs,
            self.deviceFlow,
            clock=self.reactor,
            metrics=self.registry,
            limits=s.boot_limits,
        )
        self._web("boot", boot.root, onStop=boot.config.stop)
        face = deviceFace(self.attestation, self.disks)
        self._web("device", face, onStop=self.attestation.service.stop)
        admin = adminSite(
            prepared, reactor=self.reactor, registry=self.registry,
            readiness=self.readiness, journal=self.journal, chain=self.chain,
            inventory=self.inventory, runs=self.runs,
            alerts=self.alerts, status=self.status, trust=self.trust,
            disks=self.disks, refusals=self.refusals, deviceFlow=self.deviceFlow,
            kube=self.kube, objects=self.objects, diskKeys=self.diskKeys,
        )  # fmt: skip
        self.console, self.consoleSessions = admin.console, admin.sessions
        self._web("admin", admin.root, onListening=admin.follow)
        self.tink = tinkProxy(
            prepared, reactor=self.reactor, registry=self.registry,
            inventory=self.inventory, runs=self.runs, runner=self.runner,
            journal=self.journal, alerts=self.alerts, kube=self.kube,
            objects=self.objects,
        )  # fmt: skip
        self.tink.setServiceParent(self.database)
        policy = listenerPolicy(s, "tink")
        tink = self._listeners.add(
            "tink",
            s.listen.tink,
            policy.tlsOptions(s.tls),
            self.tink.factory,
            protocol=policy.clientProtocol,
            # tink-server may take a minute to answer (it retries conflicts):
            # a call in flight is timed by tink.stream_timeout, an idle
            # connection still by limits.idle_timeout (the HTTP/2 layer).
            idleTimeout=max(s.limits.idle_timeout, s.tink.stream_timeout),
        )
        tink.setServiceParent(self.tink)  # which drains it before it stops
        if self.diskKeys is not None:  # the kms listener, drained the same way
            policy = listenerPolicy(s, "kms")
            kms = self._listeners.add(
                "kms", s.listen.kms, policy.tlsOptions(s.tls),
                self.diskKeys.listener.factory, protocol=policy.clientProtocol,
                onListening=admin.followKMS,  # the endpoint configurations name
            )  # fmt: skip
            kms.setServiceParent(self.diskKeys.listener)
        self.dns = DNSService.fromSettings(self.reactor, s, self.registry)
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
            self._listeners.unbind()
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
            version=__version__, site=self.settings.site_name, entries=len(self.vault),
        )  # fmt: skip
        self.journal.append(
            "fleetd.started", actor="fleetd", fields={"version": __version__}
        ).addErrback(self._journalFailed)

    async def _load(self) -> None:
        await self.runs.load(self._checkVault)
        await self.tink.load()  # boot completion needs the runs [B1]
        if self.diskKeys is not None:  # the KMS answers once every uuid is known
            await self.diskKeys.sweep.begin()

    def _checkVault(self) -> None:
        """The vault's entries, listed in prepare(), looked at and put right."""
        vault, self._uncheckedVault = self._uncheckedVault, None
        if vault is not None:
            vault.settle(vault.inspect())

    def _journalFailed(self, f: Failure) -> None:
        self.log.failure("journal.append.failed", failure=f)

    def _sighup(self, signum: int, frame: Any) -> None:
        self.reactor.callFromThread(self.reload)

    def reload(self) -> None:
        """SIGHUP: the topology and the listeners' certificates read again."""
        self.dns.reloadTopology()
        try:
            fields = reloadCertificates(self._listeners, self.settings)
        except ConfigError as e:
            self.log.error("tls.reload.failed {error}", error=str(e))
            return
        self.log.info("tls.reloaded {listeners} {sha256} {not_after}", **fields)
        self.selfCheck.checkNow()  # clients get the new certificate
        self.journal.append("tls.reloaded", actor="fleetd", fields=fields).addErrback(
            self._journalFailed
        )

    def stopService(self) -> Deferred[None]:
        if self.handleSignals:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
        self.log.info("fleetd.stopping")
        self.notify(b"STOPPING=1")
        stopping: Deferred[Any] = super().stopService()
        # The vault directory's descriptor, held since prepare().
        return stopping.addCallback(lambda _: self.vault.close())


__all__ = ["FleetdService", "Prepared", "StartupError", "prepare"]
