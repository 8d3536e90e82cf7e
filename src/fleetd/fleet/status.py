"""
What state is this machine in, and what do I do? (C{fleetctl status NAME})

L{StatusService} gathers a device's record, its latest run and that run's
state, the alerts that concern it, its standing refused attestation (issue
27), its disk key with C{[kms]} (issue 30) and its last journal entries,
and derives the recovery step, if one is needed. It knows nothing of
HTTP, so the admin API, the owner console and the rack simulator share it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetd.inventory.model import REFUSED_CLASSES, Device, DeviceStatus, IInventory
from fleetd.kube import status as kubestatus
from fleetd.runs.alerts import AlertTracker
from fleetd.runs.index import RunView
from fleetd.runs.registry import RunRegistry
from fleetd.statuswords import refusalWords
from fleetd.store.entries import JournalEntry
from fleetd.store.journal import AsyncJournal

if TYPE_CHECKING:
    from fleetd.trust.disks import DiskReportView, DiskService
    from fleetd.trust.refusals import AttestRefusals
    from fleetd.trust.service import TrustService, TrustState

RECENT_ENTRIES = 10

STAGED_IS_THE_END = (
    "configuration delivered; staged is where the path ends on this fleetd:"
    " without [kubernetes] it approves no kubelet certificate, so the device"
    " never becomes active here"
)


@dataclass(frozen=True)
class DeviceReport:
    """One device as C{fleetctl status} shows it; no code, token or body."""

    device: Device
    run: RunView | None
    alerts: list[str]
    journal: list[JournalEntry]
    state: str
    recovery: str | None
    trust: TrustState | None = None
    disks: DiskReportView | None = None
    kubernetes: kubestatus.Credentials | None = None
    ldevid: dict[str, Any] | None = None
    refusal: dict[str, Any] | None = None  # AttestRefusals.standing's
    tinkerbell: dict[str, Any] | None = None  # its Hardware and Workflow
    diskKey: dict[str, Any] | None = None  # with [kms]: DiskKeys.view's

    def toJSON(self) -> dict[str, Any]:
        run = None
        if self.run is not None:
            run = {**self.run.record.toJSON(), "state": self.run.state}
        # Without [kms] the report is as it was: no disk_key at all.
        key = {} if self.diskKey is None else {"disk_key": self.diskKey}
        return key | {
            "device": self.device.toJSON(),
            "trust": None if self.trust is None else self.trust.toJSON(),
            "disks": None if self.disks is None else self.disks.toJSON(),
            "run": run,
            "alerts": list(self.alerts),
            "journal": [entry.toJSON() for entry in self.journal],
            "state": self.state,
            "recovery": self.recovery,
            "kubernetes": None if self.kubernetes is None else self.kubernetes.toJSON(),
            "ldevid": self.ldevid,
            "attest_refusal": self.refusal,
            "tinkerbell": self.tinkerbell,
        }


def assess(
    device: Device,
    run: RunView | None,
    alerts: list[str],
    kubernetes: bool = True,
    refusal: dict[str, Any] | None = None,
) -> tuple[str, str | None]:
    """
    A one-line description of where C{device} stands, and the recovery
    step an owner should take (L{None} when nothing is needed). A standing
    refused attestation (C{refusal}) is where a device stands that was
    never provisioned or waits for its node: its step back is the recovery.

    @param kubernetes: whether this fleetd has a cluster to approve
        kubelet certificates for (C{[kubernetes]}); without one, C{staged}
        is where a device's path through fleetd ends.
    """
    name = device.name
    provision = f"fleetctl provision {name}"
    if device.device_class in REFUSED_CLASSES:
        return (
            f"class {device.device_class} cannot attest or install through fleetd",
            "none through fleetd: install this machine another way or retire it",
        )
    if device.status is DeviceStatus.DECOMMISSIONING:
        return "retired (decommissioning): it cannot be provisioned", None
    waiting = run is None or (
        run.state == "ready" and "FleetNodeBootedHookOSAfterInstall" not in alerts
    )
    if refusal is not None and waiting:
        where = "never provisioned" if run is None else "provisioned"
        return (
            f"{where}; its attestation was refused: {refusalWords(refusal)}",
            refusal["step"],
        )
    if run is None:
        return "never provisioned", f"{provision}, then write the code to META 0x0b"
    if run.state == "lost":
        return (
            "its configuration is lost (fleetd's host rebooted before the node"
            " fetched it); fleetd will not provision again on its own",
            f"{provision}, then give the node the new code",
        )
    if run.state == "consumed" and "FleetInstallConfigRefetched" in alerts:
        return (
            "its configuration was delivered, and the node keeps asking for it"
            " again (it probably lost power before Talos wrote STATE)",
            f"{provision}; the disk holds no STATE to preserve",
        )
    if run.state == "consumed":
        if device.status is DeviceStatus.ACTIVE:
            return "installed and joined the cluster", None
        if device.status is DeviceStatus.STAGED and not kubernetes:
            return STAGED_IS_THE_END, None
        return (
            "configuration delivered; waiting for the node's kubelet certificate",
            None,
        )
    if run.state == "delivering":
        return "its configuration is being delivered right now", None
    if run.state == "ready" and "FleetNodeBootedHookOSAfterInstall" in alerts:
        return (
            "its workflow succeeded, but the node booted back into HookOS"
            " instead of its disk; its configuration is unread",
            "make the disk boot first (or turn off PXE for it; see"
            " docs/operations.md, Boot completion) and power-cycle it",
        )
    if run.state == "ready":
        return (
            "provisioned; waiting for the node to fetch its configuration",
            None,
        )
    return f"latest run is {run.state}", f"{provision} to start a new run"


LOST_HOW = {
    "lost": "deleted",
    "changed": "changed",
    "disowned": "stripped of fleetd's labels",
}


def assessObjects(
    name: str, run: RunView | None, objects: dict[str, Any] | None
) -> tuple[str, str | None] | None:
    """
    Where a device provisioned with C{[tinkerbell]} stands when its
    Workflow is the reason its node waits (issue 28); L{None}: it is not.
    """
    workflow = None if objects is None else objects.get("workflow")
    if run is None or run.state != "ready" or workflow is None:
        return None
    if workflow["run"] != run.record.id:
        return None
    made, path = workflow["made"], workflow["name"]
    provision = f"fleetctl provision {name}"
    if made in LOST_HOW and str(workflow.get("state") or "").upper().removeprefix(
        "STATE_"
    ) not in ("POST", "SUCCESS"):
        return (
            f"provisioned; its Workflow {path} was {LOST_HOW[made]} by someone"
            " else before it ran, and fleetd does not make it again",
            f"{provision}: a new run, and a new Workflow",
        )
    if made in ("refused", "failed"):
        return (
            f"provisioned, but fleetd could not make its Workflow {path}:"
            f" {workflow.get('problem')}",
            f"put that right, then {provision}",
        )
    if made == "create" and objects is not None and objects.get("waiting"):
        return (
            f"provisioned; its Workflow {path} is not made yet, retrying:"
            f" {objects['waiting']}",
            None,
        )
    return None


class StatusService:
    """Reports on devices for people; reads only, changes nothing."""

    def __init__(
        self,
        inventory: IInventory,
        registry: RunRegistry,
        alerts: AlertTracker,
        journal: AsyncJournal,
        *,
        trust: TrustService | None = None,
        disks: DiskService | None = None,
        credentials: kubestatus.KubeStatus | None = None,
        ldevid: Callable[[str], dict[str, Any] | None] | None = None,
        kubernetes: bool = True,
        refusals: AttestRefusals | None = None,
        objects: Callable[[str], dict[str, Any] | None] | None = None,
        diskKey: Callable[[str], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        """
        @param ldevid: the current LDevID record of a chassis serial [T4]
            (issuer, notAfter; L{None} when spore issued it none).
        @param kubernetes: whether fleetd has C{[kubernetes]} (L{assess}).
        @param refusals: devices' standing refused attestations (issue 27).
        @param objects: a device's Tinkerbell objects (C{[tinkerbell]}).
        @param diskKey: a device's disk key (C{[kms]}, issue 30, item 6).
        """
        self._diskKey = diskKey
        self._objects = objects
        self._kubernetes = kubernetes
        self._refusals = refusals
        self._credentials = credentials
        self._ldevid = ldevid
        self._inventory = inventory
        self._registry = registry
        self._alerts = alerts
        self._journal = journal
        self._trust = trust
        self._disks = disks

    async def report(self, name: str) -> DeviceReport | None:
        """C{name}'s report, or L{None} when no such device exists."""
        device = await self._inventory.get(name)
        if device is None:
            return None
        run = await self._registry.view(device.name)
        alerts = self._alerts.openFor(device.name)
        entries = await self._journal.latest(device=device.name, limit=RECENT_ENTRIES)
        refusal = None
        if self._refusals is not None:
            refusal = (await self._refusals.standing([device])).get(device.name)
        state, recovery = assess(device, run, alerts, self._kubernetes, refusal)
        trust = (
            None if self._trust is None else await self._trust.stateFor(device.serial)
        )
        disks = (
            None if self._disks is None else await self._disks.lastReport(device.name)
        )
        creds = None
        if self._credentials is not None:
            creds = await self._credentials.credentials(device.name)
            if recovery is None and device.status is not DeviceStatus.DECOMMISSIONING:
                found = kubestatus.assess(
                    device.name, None if run is None else run.state, creds
                )
                if found is not None:
                    state, recovery = found
        objects = None if self._objects is None else self._objects(device.name)
        if device.status is not DeviceStatus.DECOMMISSIONING:
            waits = assessObjects(device.name, run, objects)
            if waits is not None:
                state, recovery = waits
                made = ((objects or {}).get("workflow") or {}).get("made")
                if made in LOST_HOW:  # as fleetd_tinkerbell_workflows_missing
                    alerts = [*alerts, "FleetTinkerbellWorkflowLost"]
        return DeviceReport(
            device,
            run,
            alerts,
            entries,
            state,
            recovery,
            trust=trust,
            disks=disks,
            kubernetes=creds,
            ldevid=None if self._ldevid is None else self._ldevid(device.serial),
            refusal=refusal,
            tinkerbell=objects,
            diskKey=None if self._diskKey is None else await self._diskKey(device.name),
        )
