"""
The tink proxy assembled from its settings: upstream pool, listener
factory, the observation chain and boot completion [A4] [B1] [B2] [B3].

No listening here: L{fleetd.service} binds the factory behind TLS (ALPN
h2) in a listener service it makes a child of the L{TinkProxy}; the
start-up load (L{fleetd.loading.LoadService}) calls L{TinkProxy.load}
once the runs are loaded. The proxy stops its listener
itself (L{TinkProxy.stopService}): GOAWAY, drain, the upstream, then the
port.

With C{tink.workflow_state = "kubernetes"} the Workflows' state is read
from the cluster as boot completion's second "done" signal
(L{fleetd.tink.wfstate}): watched from L{TinkProxy.load} on, stopped
first by L{TinkProxy.stop}. With C{[tinkerbell]} the same watch (in its
namespace, when C{workflow_state} is "off") tells the Tinkerbell objects'
observer what happens to the Workflows fleetd made.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.interfaces import IReactorTime

from fleetd.config import TinkSettings, UpstreamAddress
from fleetd.h2.guard import H2Limits
from fleetd.h2.listener import TinkListenerFactory, proxyFactory
from fleetd.h2.upstream import UpstreamPool
from fleetd.inventory.model import IInventory
from fleetd.k8s.client import KubeClient
from fleetd.logs import ThrottledLog
from fleetd.runs.alerts import AlertTracker
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner
from fleetd.tink.completion import BootTracker, IRuns
from fleetd.tink.metrics import TinkMetrics
from fleetd.tink.observe import WireObserver
from fleetd.tink.wfstate import IWorkflowObserver, WorkflowStateWatch
from fleetd.tink.workflows import REFRESH_FLOOR, DeviceIndex, WorkflowWatcher


class TinkProxy(MultiService):
    """Everything behind the tink listener, whose service is its child."""

    def __init__(
        self,
        reactor: IReactorTime,
        settings: TinkSettings,
        *,
        idleTimeout: float,
        registry: CollectorRegistry | None,
        inventory: IInventory,
        runs: IRuns,
        runner: IRunner,
        journal: AsyncJournal,
        alerts: AlertTracker,
        kube: KubeClient | None = None,
        upstreamCA: bytes | None = None,
        listingFloor: float = REFRESH_FLOOR,
        objects: tuple[str, IWorkflowObserver] | None = None,
    ) -> None:
        """
        @param listingFloor: the least seconds between two inventory
            listings for ids the device index does not know
            (L{fleetd.tink.workflows.DeviceIndex}).
        @param kube: the C{[kubernetes]} cluster client, for
            C{tink.workflow_state = "kubernetes"} (ignored otherwise).
        @param reactor: the proxy's clock; the upstream endpoint also
            connects with it (TCP, TLS).
        @param upstreamCA: the PEM of C{tink.upstream_ca}, read by
            L{fleetd.prepare.prepare}.
        @param objects: with C{[tinkerbell]}, its namespace and the observer
            the Workflow watch tells (through C{kube}).
        """
        super().__init__()  # type: ignore[no-untyped-call]
        clock = reactor
        self.inventory = inventory
        self.metrics = TinkMetrics(registry)
        address = UpstreamAddress(
            settings.upstream_tls, settings.upstream_host, settings.upstream_port
        )
        self.pool = UpstreamPool(
            clock,
            lambda: address.endpoint(reactor, upstreamCA),
            log=ThrottledLog(clock),
            metrics=self.metrics,
            connectTimeout=settings.connect_timeout,
            maxHeaderListSize=max(65536, settings.max_header_list_size),
        )
        self.boot = BootTracker(
            clock=clock,
            runs=runs,
            runner=runner,
            journal=journal,
            alerts=alerts,
            minReboot=settings.min_reboot,
        )
        self.devices = DeviceIndex(inventory, clock, listingFloor)
        self.watcher = WorkflowWatcher(self.devices, self.boot)
        self.observer = WireObserver(self.watcher, self.metrics, ThrottledLog(clock))
        self.workflowState: WorkflowStateWatch | None = None
        self._stopped = False
        reading = settings.workflow_state == "kubernetes"
        if reading or objects is not None:
            if kube is None:
                raise ValueError("reading Workflows needs [kubernetes]")
            namespace = settings.workflow_namespace
            if not reading and objects is not None:
                namespace = objects[0]
            self.workflowState = WorkflowStateWatch(
                clock,
                kube,
                namespace,
                self.devices,
                self.watcher if reading else None,
                registry=registry,
                observer=None if objects is None else objects[1],
            )
        self.factory: TinkListenerFactory = proxyFactory(
            clock,
            self.pool,
            self.metrics,
            tapFactory=self.observer,
            maxConcurrentStreams=settings.max_concurrent_streams,
            maxHeaderListSize=settings.max_header_list_size,
            maxMessageBytes=settings.max_message_bytes,
            idleTimeout=idleTimeout,
            streamTimeout=settings.stream_timeout,
            handshakeTimeout=settings.handshake_timeout,
            drainTimeout=settings.drain_timeout,
            limits=H2Limits(streamBudget=settings.stream_budget),
            sourceStreamRate=settings.source_stream_rate,
            sourceStreamBurst=settings.source_stream_burst,
        )

    async def load(self) -> None:
        """After the run registry loaded: the device index and every current
        run's boot state."""
        identities = await self.inventory.identities()
        await self.devices.refresh()
        await self.boot.load([name for name, _, _ in identities])
        if self.workflowState is not None and not self._stopped:
            self.workflowState.start()

    def stop(self) -> Deferred[Any]:
        """Stop reading Workflows; GOAWAY to every client, let calls
        finish, then close upstream."""
        self._stopped = True
        watching = None
        if self.workflowState is not None:
            watching = self.workflowState.stop()
        d = self.factory.drain()
        d.addBoth(lambda _: self.pool.close())
        if watching is None:
            return d
        return DeferredList([d, watching], consumeErrors=True)

    def stopService(self) -> Deferred[Any]:
        """L{stop}, then the listener: its port closes (and any connection
        still open with it) only once the calls in flight had
        C{tink.drain_timeout} to finish."""
        Service.stopService(self)
        listeners = list(self)

        def stopListeners(_: object) -> Deferred[Any]:
            stopping = [maybeDeferred(s.stopService) for s in reversed(listeners)]
            return DeferredList(stopping, consumeErrors=True)

        return self.stop().addBoth(stopListeners)
