"""
Retirement [R1]: C{fleetctl retire NAME}.

In this order:

  1. delete the Node (when a cluster is configured): first journal
     C{kube.node-delete-requested} in its own transaction, then ask the
     API. A failure refuses the retirement and nothing else changes: the
     owner runs it again. Should the transaction below fail after the
     Node went, C{kube.node-deleted} records that (when the journal can);
  2. one transaction [J1]: the device becomes C{decommissioning}, its
     current run ends (C{run.superseded} by C{retired}: its code stops
     working, L{fleetd.runs.registry.RunRegistry.retire}), its kubelet
     record is marked retired (later renewal CSRs are refused,
     L{fleetd.kube.approver}), its live tokens get a deletion deadline of
     now, and the journal records the retirement and what cannot be
     revoked: the kubelet client certificate (with its notAfter when
     fleetd saw it issued) and C{machine.token}, the trustd token every
     Talos configuration carries and nothing rotates;
  3. after the commit, the run's files leave the vault and the tokens are
     deleted (retried while the API is down; their persisted deadline
     re-arms after a restart); with C{[tinkerbell]}, the deletion of the
     device's Workflows and network boot off on its Hardware, recorded in
     the transaction of step 2 (L{IRetiringObjects}), are asked of the
     API, and the answer waits for that first try (retried from the
     record, after a restart too, when it fails).

One device at a time [R1]: before step 1 the device's tokens are
revoked in memory and its renewals refused (L{IApprovals.hold}), and the
retirement waits for the approvals already in flight for it; an
approval's own transaction re-checks C{retired_at}, so one the API made
before and fleetd records after (late) is journaled
C{kube.csr-approved-after-retirement} and never clears it.

A decommissioning device cannot be provisioned (the provision checks it
in its own transaction). Deleting the Node does not stop a machine whose
kubelet still holds a valid certificate from registering it again when it
restarts: wipe or power off the machine (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.inventory.model import DeviceStatus, IInventory, InventoryError
from fleetd.k8s.client import KubeClient
from fleetd.kube.book import TokenBook
from fleetd.kube.store import kubelet, liveTokens, noteRetired, setDeleteAt
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

_T = TypeVar("_T")


class IRetiringRuns(Protocol):
    """The run registry's part (L{fleetd.runs.registry.RunRegistry.retire})."""

    async def retire(
        self, device: str, actor: str, work: Callable[[Database, Recorder], _T]
    ) -> _T:
        "End C{device}'s current run in C{work}'s transaction; memory after."


class IApprovals(Protocol):
    """The approver's per-device part (L{fleetd.kube.flights.DeviceFlights})."""

    def hold(self, device: str) -> None:
        "No approval for C{device} from now on, until L{release}."

    def release(self, device: str) -> None:
        "The retirement ended."

    def drained(self, device: str) -> Deferred[Any]:
        "Fires once the approvals in flight for C{device} have ended."


class IRetiringObjects(Protocol):
    """Tinkerbell's objects of a retired device (L{fleetd.tinkerbell.service})."""

    def recordRetirement(
        self, db: Database, journal: Recorder, device: str, actor: str, at: float
    ) -> Any:
        "Record the retirement's intents in its transaction [J1]."

    def committed(self, recorded: Any) -> None:
        "The retirement committed: memory follows, the calls start."

    def settled(self, devices: Sequence[str]) -> Deferred[Any]:
        "Fires once the calls for C{devices} had their first try."

    def view(self, device: str) -> dict[str, Any] | None:
        "C{device}'s objects now."


UNROTATED_TRUSTD = (
    "machine.token (the cluster's trustd token) is in every Talos configuration;"
    " nothing rotates it, and a copy on disk can still obtain Talos API certificates"
)


@dataclass(frozen=True)
class Retirement:
    device: str
    node_deleted: bool | None  # None: no cluster configured
    tokens: list[str]
    not_after: float | None
    unrevocable: list[str] = field(default_factory=list)
    objects: dict[str, Any] | None = None  # [tinkerbell]: after the first try
    # Other participants' views, by name (disk_keys: issue 30).
    views: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def toJSON(self) -> dict[str, Any]:
        found = {} if self.objects is None else {"tinkerbell": self.objects}
        return (
            found
            | self.views
            | {
                "device": self.device,
                "status": DeviceStatus.DECOMMISSIONING.value,
                "node_deleted": self.node_deleted,
                "tokens_deleted": self.tokens,
                "kubelet_not_after": self.not_after,
                "unrevocable": self.unrevocable,
            }
        )


class RetireService:
    """Retire a device: Node, tokens, status, and the journal of what remains."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        inventory: IInventory,
        journal: AsyncJournal,
        runner: IRunner,
        client: KubeClient | None,
        book: TokenBook | None,
        runs: IRetiringRuns | None,
        approvals: IApprovals | None = None,
        objects: IRetiringObjects | None = None,
        participants: Sequence[tuple[str, IRetiringObjects]] = (),
    ) -> None:
        """
        @param participants: more parts that record their share of a
            retirement in its transaction, by name (C{disk_keys}: the
            node's disk keys are destroyed there [E3]); their views show
            under that name.
        """
        self.clock = clock
        self.objects = objects
        self.participants = tuple(participants)
        self.approvals = approvals
        self.runs = runs
        self.inventory = inventory
        self.journal = journal
        self.runner = runner
        self.client = client
        self.book = book

    async def _deleteNode(self, client: KubeClient, name: str, actor: str) -> bool:
        """
        Journal the deletion before asking for it, in its own transaction
        (a failure here refuses the retirement before anything changed),
        so a retirement whose commit then fails never leaves a deletion
        the journal does not know of [J1].
        """
        await self.journal.append(
            "kube.node-delete-requested",
            actor=actor,
            device=name,
            fields={"reason": "retirement"},
        )
        try:
            return await client.deleteNode(name)
        except Exception as e:
            self.log.warn(
                "kube.retire.node-delete-failed {device}: {reason}",
                device=name,
                reason=str(e),
            )
            raise

    async def _nodeOutcome(self, name: str, actor: str, deleted: bool) -> None:
        """The retirement did not commit: journal what the API did, if we can."""
        try:
            await self.journal.append(
                "kube.node-deleted",
                actor=actor,
                device=name,
                fields={"node_deleted": deleted, "retired": False},
            )
        except Exception as e:
            self.log.error(
                "kube.retire.outcome-not-journaled {device}: {reason}",
                device=name,
                reason=str(e),
            )

    async def retire(self, name: str, actor: str, via: str | None = None) -> Retirement:
        """
        @param via: where the owner asked (C{console}), journaled when given.
        @raise InventoryError: C{not-found}, or the inventory is unavailable.
        @raise KubeError: the Node could not be deleted; nothing changed.
        """
        device = await self.inventory.get(name)
        if device is None:
            raise InventoryError(f"no device named {name}", "not-found")
        name = device.name
        approvals = self.approvals
        if approvals is None:
            return await self._retire(name, actor, via)
        approvals.hold(name)  # before any API call [R1]
        try:
            await approvals.drained(name)
            return await self._retire(name, actor, via)
        finally:
            approvals.release(name)

    async def _retire(self, name: str, actor: str, via: str | None) -> Retirement:
        nodeDeleted = None
        if self.client is not None:
            nodeDeleted = await self._deleteNode(self.client, name, actor)
        now = self.clock.seconds()
        holder: dict[str, Any] = {}

        def change(db: Database, journal: Recorder) -> None:
            record = kubelet(db, name)
            tokens = [
                t.id for t in liveTokens(db) if t.kind == "node" and t.device == name
            ]
            for token in tokens:
                setDeleteAt(db, token, now)
            self.inventory.setStatusIn(db, name, DeviceStatus.DECOMMISSIONING)
            noteRetired(db, name, now)
            notAfter = None if record is None else record.not_after
            holder["tokens"], holder["not_after"] = tokens, notAfter
            journal(
                "device.retired",
                actor=actor,
                device=name,
                fields={
                    "node_deleted": nodeDeleted,
                    "bootstrap_ids": ",".join(tokens),
                }
                | ({} if via is None else {"via": via}),
            )
            journal(
                "kube.unrevocable",
                actor=actor,
                device=name,
                fields={
                    "credential": "kubelet client certificate",
                    "csr": None if record is None else record.last_csr,
                    "not_after": notAfter,
                    "note": "Kubernetes cannot revoke it; it stays valid until"
                    " notAfter and can register the Node again",
                },
            )
            journal(
                "kube.unrevocable",
                actor=actor,
                device=name,
                fields={"credential": "machine.token", "note": UNROTATED_TRUSTD},
            )
            if self.objects is not None:
                holder["objects"] = self.objects.recordRetirement(
                    db, journal, name, actor, now
                )
            holder["parts"] = [
                part.recordRetirement(db, journal, name, actor, now)
                for _, part in self.participants
            ]

        try:
            if self.runs is not None:
                await self.runs.retire(name, actor, change)
            else:
                await self.journal.change(change)
        except Exception:
            if nodeDeleted:
                await self._nodeOutcome(name, actor, nodeDeleted)
            raise
        if self.book is not None:
            self.book.revokeDevice(name)
        objects = None
        if self.objects is not None:
            self.objects.committed(holder["objects"])
            await self.objects.settled([name])
            objects = self.objects.view(name)
        views: dict[str, dict[str, Any] | None] = {}
        for (label, part), recorded in zip(
            self.participants, holder["parts"], strict=True
        ):
            part.committed(recorded)
            await part.settled([name])
            views[label] = part.view(name)
        notAfter = holder["not_after"]
        return Retirement(
            device=name,
            node_deleted=nodeDeleted,
            tokens=holder["tokens"],
            not_after=notAfter,
            unrevocable=[
                "kubelet client certificate"
                + (
                    f" (valid until notAfter {notAfter:.0f})"
                    if notAfter is not None
                    else " (notAfter unknown: fleetd did not see it issued)"
                ),
                UNROTATED_TRUSTD,
            ],
            objects=objects,
            views=views,
        )
