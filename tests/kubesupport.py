"""A fleet (L{tests.fleetsupport.Fleet}) with a fake cluster and the kube services."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import KubernetesSettings
from fleetd.fleet.retire import retireService
from fleetd.fleet.status import StatusService
from fleetd.kube.service import KubeService
from fleetd.kube.status import KubeStatus
from fleetd.kube.store import TokenRecord, getToken, kubelet
from fleetd.runs.render import NodeFacts
from fleetd.testing.kube import FakeKube, csrPEM
from tests.faultsupport import Faults
from tests.fleetsupport import RENDERER, Fleet, device

SETTINGS = KubernetesSettings(
    api="https://kube.test",
    ca=None,
    token_file=None,
    client_cert=None,
    client_key=None,
)


class KubeFleet(Fleet):
    """A L{Fleet} whose provisions issue tokens against a L{FakeKube}."""

    fake: FakeKube
    kube: KubeService

    def __init__(
        self,
        test: SynchronousTestCase,
        directory: Path | None = None,
        *,
        approverInventory: Callable[[Any], Any] | None = None,
    ) -> None:
        # Wraps the inventory the approver is built with (a fault); the
        # wrapper is C{kubeInventory}.
        self.approverInventory = approverInventory
        super().__init__(test, directory)

    def start(self, vault: Any = None, inventory: Any = None) -> None:
        super().start(vault, inventory)
        wrap = self.approverInventory
        self.kubeInventory: Any = (
            self.inventory if wrap is None else wrap(self.inventory)
        )
        if not hasattr(self, "fake"):
            self.fake = FakeKube(self.clock)
        self.client = self.fake.client()
        # Fresh with each start (a restart's service registers its own).
        self.metrics = CollectorRegistry()
        self.kube = KubeService(
            clock=self.clock,
            settings=SETTINGS,
            client=self.client,
            runner=self.runner,
            journal=self.journal,
            inventory=self.kubeInventory,
            sealKey=b"s" * 32,
            metrics=self.metrics,
        )
        self.kube.startService()
        self.fake.flush()
        self.retirer = retireService(
            self.kube,
            clock=self.clock,
            inventory=self.inventory,
            journal=self.journal,
            runs=self.registry,
        )

    def stopKube(self) -> None:
        d = self.kube.stopService()
        self.fake.flush()
        self.test.successResultOf(d)

    def restart(self, wipeVault: bool = False) -> None:
        self.stopKube()
        super().restart(wipeVault)

    def provision(self, *devices: Any, action: str | None = None) -> list[Any]:
        d = Deferred.fromCoroutine(
            self.registry.provision(
                list(devices),
                actor="owner:test",
                desiredAction=action,
                render=lambda d, run, token=None: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run, bootstrap_token=token)
                ),
                credentials=self.kube.book,
            )
        )
        self.fake.flush()
        result: list[Any] = self.test.successResultOf(d)
        return result

    def config(self, run: str) -> dict[str, Any]:
        body = self.vault.get(f"{run}.yaml")
        assert body is not None
        doc: dict[str, Any] = next(yaml.safe_load_all(body))
        return doc

    def bearer(self, run: str) -> str:
        token: str = self.config(run)["cluster"]["token"]
        return token

    def token(self, tokenId: str) -> TokenRecord | None:
        return self.test.successResultOf(
            self.runner.run(lambda db: getToken(db, tokenId))
        )

    def kubelet(self, name: str) -> Any:
        return self.test.successResultOf(self.runner.run(lambda db: kubelet(db, name)))

    def fileCSR(self, bearer: str, node: str, **kwargs: Any) -> dict[str, Any]:
        """A kubelet files its CSR; the watch delivers it to the approver."""
        pem = csrPEM(f"system:node:{node}", **kwargs)
        csr = self.fake.fileCSR(bearer, pem)
        self.fake.flush()
        return csr

    def csr(self, name: str) -> dict[str, Any]:
        return self.fake.csrs[name]

    def approved(self, name: str) -> bool:
        conditions = (self.csr(name).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Approved" for c in conditions)

    def statusService(self) -> StatusService:
        return StatusService(
            self.inventory,
            self.registry,
            self.alerts,
            self.journal,
            credentials=KubeStatus(self.runner, self.clock),
        )

    def decisions(self) -> dict[tuple[str, str], float]:
        """C{fleetd_kube_csr_decisions_total} by (decision, reason), no zeros."""
        return {
            (sample.labels["decision"], sample.labels["reason"]): sample.value
            for metric in self.metrics.collect()
            for sample in metric.samples
            if sample.name == "fleetd_kube_csr_decisions_total" and sample.value
        }

    def entries(self, event: str) -> list[Any]:
        found = self.test.successResultOf(self.journal.query())
        return [e for e in found if e.event == event]

    def faults(self) -> Faults:
        return Faults(self)


class TwoNodesMixin(SynchronousTestCase):
    """
    A L{KubeFleet} with w1 and w2 provisioned (C{run1}, C{run2}, their
    bootstrap tokens C{bearer1}, C{bearer2}); w1's configuration fetched.
    """

    fleet: KubeFleet
    approverInventory: Callable[[Any], Any] | None = None  # L{KubeFleet}'s

    def setUp(self) -> None:
        self.fleet = KubeFleet(self, approverInventory=self.approverInventory)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"))
        self.run1, self.run2 = self.fleet.provision(
            device("w1", "SER1"), device("w2", "SER2")
        )
        self.bearer1 = self.fleet.bearer(self.run1.run)
        self.bearer2 = self.fleet.bearer(self.run2.run)
        self.fleet.fetch(self.run1.code)


def bootstrapSecret(
    tokenId: str = "abcdef",
    secret: str = "0123456789abcdef",  # noqa: S107
    expiration: str | None = "2100-01-01T00:00:00Z",
    usage: bool = True,
    groups: str = "system:bootstrappers:fleetd",
) -> dict[str, Any]:
    data = {"token-id": tokenId, "token-secret": secret, "auth-extra-groups": groups}
    if expiration is not None:
        data["expiration"] = expiration
    if usage:
        data["usage-bootstrap-authentication"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"bootstrap-token-{tokenId}", "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": data,
    }


def secretData(fake: FakeKube, tokenId: str) -> dict[str, str]:
    secret = fake.secrets[f"bootstrap-token-{tokenId}"]
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


__all__ = ["KubeFleet", "bootstrapSecret", "device", "secretData"]
