"""
The Kubernetes credential services, started and stopped with the daemon.

L{KubeService} exists only when C{[kubernetes]} is configured. At start
it loads the live tokens (arming every persisted deletion deadline; an
overdue one fires at once [K4]) and the cluster-token grants, then
starts the CSR watch (the approver [K2]) and the RBAC check [K3]; a
start that fails (the database unavailable) is tried again with
exponential backoff. At stop it cancels every timer, the retry, the
watch and the calls in flight.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.config import KubernetesSettings
from fleetd.inventory.model import IInventory
from fleetd.k8s.client import KubeClient
from fleetd.kube.approver import Approver
from fleetd.kube.book import TokenBook
from fleetd.kube.cluster import ClusterTokens
from fleetd.kube.csrwatcher import CSRWatcher
from fleetd.kube.rbac import RBACCheck
from fleetd.kube.tokens import Sealer
from fleetd.periodic import BackedOffStart
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner


class KubeService(Service):
    """Token book, approver, watch, RBAC check and cluster tokens."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        settings: KubernetesSettings,
        client: KubeClient,
        runner: IRunner,
        journal: AsyncJournal,
        inventory: IInventory,
        sealKey: bytes,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self.clock = clock
        self.client = client
        self.book = TokenBook(
            clock=clock,
            client=client,
            journal=journal,
            runner=runner,
            tokenTTL=settings.token_ttl,
            deleteAfter=settings.delete_after,
        )
        self.cluster = ClusterTokens(
            clock=clock,
            client=client,
            book=self.book,
            journal=journal,
            runner=runner,
            sealer=Sealer(sealKey),
            overlap=settings.rotate_overlap,
            grantWindow=settings.token_ttl,
        )
        self.approver = Approver(
            clock=clock,
            client=client,
            book=self.book,
            journal=journal,
            runner=runner,
            inventory=inventory,
            grants=self.cluster,
            metrics=metrics,
        )
        self.watcher = CSRWatcher(clock, client, self.approver.seen, registry=metrics)
        self.rbac = RBACCheck(clock, client, metrics, settings.rbac_check_interval)
        self._starting = BackedOffStart(self.clock, self._start, self._failed)
        self._bookLoaded = False

    def startService(self) -> None:
        super().startService()
        self._starting.begin()

    async def _start(self) -> None:
        if not self._bookLoaded:  # loaded once: it arms the tokens' timers
            await self.book.start()
            self._bookLoaded = True
        await self.cluster.start()
        if not self.running:
            return
        self.rbac.start()
        self.watcher.start()
        self.log.info("kube.started {api}", api=self.client.api)

    def _failed(self, f: Failure, delay: float) -> None:
        # The database was unavailable (say): without the watch no CSR is
        # ever approved, so try again, backing off, on the injected clock.
        self.log.failure("kube.start.failed, retrying in {delay}s", f, delay=delay)

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        starting = self._starting.stop()
        self.rbac.stop()
        self.approver.stop()
        self.book.stop()
        pending: list[Deferred[Any]] = []
        loop = self.watcher.stop()
        if loop is not None:
            pending.append(loop)
        if starting is not None:
            pending.append(starting)

        def close(_: object) -> Deferred[None] | None:
            return self.client.close()

        return DeferredList(pending, consumeErrors=True).addCallback(close)
