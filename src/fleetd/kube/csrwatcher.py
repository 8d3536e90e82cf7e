"""
The watch of kubelet client CSRs (the approver [K2]): the generic
L{fleetd.k8s.watcher.ListWatcher} over the cluster's CSRs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.interfaces import IReactorTime

from fleetd.k8s.client import KubeClient
from fleetd.k8s.watcher import ListWatcher
from fleetd.kube.csr import approvedFirst


class CSRWatcher(ListWatcher):
    """
    Keep C{onCSR} told of every kubelet client CSR, across failures. A
    CSR C{onCSR} raised on is counted in
    C{fleetd_kube_csr_handler_errors_total} and skipped. A LIST hands
    over its approved CSRs before its pending ones (L{approvedFirst}).
    """

    def __init__(
        self,
        clock: IReactorTime,
        client: KubeClient,
        onCSR: Callable[[dict[str, Any]], None],
        *,
        timeoutSeconds: int = 300,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.handlerErrors = Counter(
            "fleetd_kube_csr_handler_errors_total",
            "Kubelet client CSRs (listed or watched) whose handling raised:"
            " logged and skipped; the watch goes on.",
            registry=registry,
        )

        async def lister() -> tuple[list[dict[str, Any]], str]:
            items, version = await client.listCSRs()
            return approvedFirst(items), version

        super().__init__(
            clock,
            lister,
            client.watchCSRs,
            onCSR,
            timeoutSeconds=timeoutSeconds,
            name="kube.watch",
            onObjectFailed=self.handlerErrors.inc,
        )
        self.client = client
        self.onCSR = onCSR
