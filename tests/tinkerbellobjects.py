"""
A fleet with C{[tinkerbell]} (issue 28): a L{KubeFleet} whose owner's
provisions and retirements keep Tinkerbell's Hardware and Workflows in the
fake cluster, with the Workflow watch fleetd keeps (L{fleetd.tink.wfstate})
telling the objects' reports; rebuildable over the same state (a restart).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from fleetd.config.tinkerbell import TinkerbellClass, TinkerbellSettings
from fleetd.fleet.provision import Provisioner
from fleetd.fleet.retire import retireService
from fleetd.fleet.status import StatusService
from fleetd.inventory.model import Device, validateDevice
from fleetd.tink.wfstate import WorkflowStateWatch
from fleetd.tinkerbell.service import TinkerbellService
from fleetd.tinkerbell.store import WorkflowRecord, workflowsOf
from tests.fleetsupport import RENDERER
from tests.kubesupport import KubeFleet
from tests.tinkerbellschemas import validating

NS = "tink-system"
IMAGE = "https://images.test/talos/v1.9.0/metal-amd64.raw.zst"
CLASS = TinkerbellClass("fleetd-talos-install", IMAGE, True)
SETTINGS = TinkerbellSettings(NS, {"worker-g3": CLASS})


def machine(
    name: str = "w1", serial: str = "SER1", macs: tuple[str, ...] | None = None
) -> Device:
    """A worker-g3 with its MACs (by default one, from its name)."""
    n = int.from_bytes(name.encode(), "big")
    if macs is None:
        macs = (f"52:54:00:{n >> 16 & 255:02x}:{n >> 8 & 255:02x}:{n & 255:02x}",)
    return validateDevice(
        name=name,
        serial=serial,
        uuid=f"00000000-0000-4000-8000-{n % 10**12:012d}",
        macs=list(macs),
        device_class="worker-g3",
    )


class NoDevices:
    def lookup(self, workerId: str) -> str | None:
        return None


class ObjectsFleet(KubeFleet):
    """A L{KubeFleet} with the Tinkerbell objects' service and the watch."""

    objects: TinkerbellService
    watch: WorkflowStateWatch | None = None

    def start(self, vault: Any = None, inventory: Any = None) -> None:
        super().start(vault, inventory)
        # Every Hardware and Workflow fleetd writes must suit Tinkerbell's
        # own CRD schemas, both generations (issue 28 item 6): 422 if not.
        validating(self.fake)
        self.objects = TinkerbellService(
            clock=self.clock,
            client=self.client,
            settings=SETTINGS,
            journal=self.journal,
            runner=self.runner,
            readyRun=self.registry.readyRun,
            metrics=self.metrics,
        )
        self.objects.startService()
        self.owner = Provisioner(
            self.registry,
            self.inventory,
            RENDERER,
            self.journal,
            credentials=self.kube.book,
            objects=self.objects,
        )
        self.retirer = retireService(
            self.kube,
            clock=self.clock,
            inventory=self.inventory,
            journal=self.journal,
            runs=self.registry,
            parts=[self.objects],
        )
        self.fake.flush()

    def startWatch(self) -> WorkflowStateWatch:
        """The Workflow watch as the tink proxy keeps it for [tinkerbell]."""
        self.watch = WorkflowStateWatch(
            self.clock,
            self.client,
            NS,
            NoDevices(),
            None,
            observer=self.objects.reports,
        )
        self.watch.start()
        self.fake.flush()
        return self.watch

    def stopKube(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        d = self.objects.stopService()
        self.fake.flush()
        self.test.successResultOf(d)
        super().stopKube()

    def provisionAsOwner(self, *devices: Device) -> Deferred[Any]:
        """C{fleetctl provision}: the owner API's provisioner."""
        d = Deferred.fromCoroutine(
            self.owner.provision([x.name for x in devices], "owner:test")
        )
        self.fake.flush()
        return d

    def provisioned(self, *devices: Device) -> list[Any]:
        result: list[Any] = self.test.successResultOf(self.provisionAsOwner(*devices))
        return result

    def retire(self, name: str) -> Deferred[Any]:
        d = Deferred.fromCoroutine(self.retirer.retire(name, "owner:test"))
        self.fake.flush()
        return d

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.fake.flush()

    def rows(self, device: str) -> list[WorkflowRecord]:
        found: list[WorkflowRecord] = self.test.successResultOf(
            self.runner.run(lambda db: workflowsOf(db, device))
        )
        return found

    def events(self, device: str | None = None) -> list[str]:
        return [e for e in super().events(device) if e.startswith("tinkerbell.")]

    def posts(self, plural: str) -> int:
        """How many creates of C{plural} the fake was asked."""
        return sum(
            1
            for method, path in self.fake.calls
            if method == "POST" and path.endswith(f"/{plural}")
        )

    def workflow(self, run: str, device: str = "w1") -> dict[str, Any] | None:
        return self.fake.workflows.get(f"{NS}/{device}-{run}")

    def hardware(self, device: str = "w1") -> dict[str, Any] | None:
        return self.fake.hardware.get(f"{NS}/{device}")

    def metric(self, name: str, **labels: str) -> float | None:
        value = self.metrics.get_sample_value(name, labels)
        return value

    def statusService(self) -> StatusService:
        return StatusService(
            self.inventory,
            self.registry,
            self.alerts,
            self.journal,
            objects=self.objects.view,
        )

    def report(self, name: str) -> dict[str, Any]:
        d = Deferred.fromCoroutine(self.statusService().report(name))
        found = self.test.successResultOf(d)
        assert found is not None
        doc: dict[str, Any] = found.toJSON()
        return doc
