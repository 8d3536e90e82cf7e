"""
Retirement [R1]: C{fleetctl retire NAME} (and the console's device page),
with or without a cluster configured.

In this order:

  1. one device at a time: its approvals are held and drained
     (L{fleetd.kube.retire.ClusterRetirement.held}), then, when a cluster
     is configured, its Node is deleted (the intent journaled first, in its
     own transaction); a failure refuses the retirement and nothing else
     changes: the owner runs it again;
  2. one transaction [J1]: the device becomes C{decommissioning}, its
     current run ends (C{run.superseded} by C{retired}: its code stops
     working, L{fleetd.runs.registry.RunRegistry.retire}), the cluster's
     records follow (its kubelet record retired, its live tokens due for
     deletion now), the journal records C{device.retired} and what cannot
     be revoked, and each L{IRetirementPart} records its own intents
     (with C{[tinkerbell]}, the deletion of the device's Workflows and
     network boot off on its Hardware). Should this transaction fail
     after the Node went, C{kube.node-deleted} records that (when the
     journal can);
  3. after the commit, the run's files leave the vault, the tokens are
     deleted, and each part's calls start; the answer waits for their
     first try (what fails is retried, from the record, after a restart
     too).

Without C{[kubernetes]} no Node is deleted and there is no token to
delete; the device still becomes C{decommissioning}, its run still ends,
and the journal records the retirement and what cannot be revoked. A
decommissioning device cannot be provisioned (the provision checks it in
its own transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from fleetd.inventory.model import DeviceStatus, IInventory, InventoryError
from fleetd.kube.retire import ClusterRetirement, Revoked
from fleetd.kube.service import KubeService
from fleetd.runs.registry import RunRegistry
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder


class IRetirementPart(Protocol):
    """
    A part of fleetd that joins a retirement's one transaction [J1]: it
    records its intents there, follows in memory after the commit, and
    tells the owner what became of it in the answer, under C{answerKey}.
    (Tinkerbell's objects, L{fleetd.tinkerbell.service.TinkerbellService}.)
    """

    @property
    def answerKey(self) -> str:
        "The key of L{view} in the retirement's answer."

    def recordRetirement(
        self, db: Database, journal: Recorder, device: str, actor: str, at: float
    ) -> Any:
        "Record the retirement's intents in its transaction [J1]; raise to refuse it."

    def committed(self, recorded: Any) -> None:
        "The retirement committed (C{recorded} is what L{recordRetirement} gave)."

    def settled(self, devices: Sequence[str]) -> Deferred[Any]:
        "Fires once the work for C{devices} had its first try."

    def view(self, device: str) -> dict[str, Any] | None:
        "What became of C{device} here (L{None}: nothing to tell)."


@dataclass(frozen=True)
class Retirement:
    """What a retirement did and could not do, as the owner is told."""

    device: str
    node_deleted: bool | None  # None: no cluster configured
    tokens: list[str]
    not_after: float | None
    unrevocable: list[str] = field(default_factory=list)
    # Each part's view, under its answerKey, after the first try.
    parts: dict[str, Any] = field(default_factory=dict)

    def toJSON(self) -> dict[str, Any]:
        return self.parts | {
            "device": self.device,
            "status": DeviceStatus.DECOMMISSIONING.value,
            "node_deleted": self.node_deleted,
            "tokens_deleted": self.tokens,
            "kubelet_not_after": self.not_after,
            "unrevocable": self.unrevocable,
        }


class RetireService:
    """Retire a device: its run, status, credentials, parts, and the journal."""

    def __init__(
        self,
        *,
        clock: IReactorTime,
        inventory: IInventory,
        journal: AsyncJournal,
        runs: RunRegistry,
        cluster: ClusterRetirement | None = None,
        parts: Sequence[IRetirementPart] = (),
    ) -> None:
        """
        @param cluster: the cluster's side; L{None}: no cluster configured
            (its records only).
        @param parts: what else joins the transaction, in this order.
        """
        self.clock = clock
        self.inventory = inventory
        self.journal = journal
        self.runs = runs
        self.cluster = ClusterRetirement(journal) if cluster is None else cluster
        self.parts = tuple(parts)

    async def retire(self, name: str, actor: str, via: str | None = None) -> Retirement:
        """
        @param via: where the owner asked (C{console}), journaled when given.
        @raise InventoryError: C{not-found}, or the inventory is unavailable.
        @raise KubeError: the Node could not be deleted; nothing changed.
        @raise NotReady: the runs are still loading; nothing changed.
        """
        device = await self.inventory.get(name)
        if device is None:
            raise InventoryError(f"no device named {name}", "not-found")
        name = device.name
        return await self.cluster.held(name, lambda: self._retire(name, actor, via))

    async def _retire(self, name: str, actor: str, via: str | None) -> Retirement:
        cluster = self.cluster
        nodeDeleted = await cluster.deleteNode(name, actor)
        now = self.clock.seconds()

        def change(db: Database, journal: Recorder) -> tuple[Revoked, list[Any]]:
            revoked = cluster.recordRetirement(db, name, now)
            self.inventory.setStatusIn(db, name, DeviceStatus.DECOMMISSIONING)
            journal(
                "device.retired",
                actor=actor,
                device=name,
                fields={
                    "node_deleted": nodeDeleted,
                    "bootstrap_ids": ",".join(revoked.tokens),
                }
                | ({} if via is None else {"via": via}),
            )
            cluster.recordUnrevocable(journal, name, actor, revoked)
            recorded = [
                part.recordRetirement(db, journal, name, actor, now)
                for part in self.parts
            ]
            return revoked, recorded

        try:
            revoked, recorded = await self.runs.retire(name, actor, change)
        except Exception:
            await cluster.undone(name, actor, nodeDeleted)
            raise
        cluster.committed(name)
        for part, intents in zip(self.parts, recorded, strict=True):
            part.committed(intents)
        for part in self.parts:
            await part.settled([name])
        views = {part.answerKey: part.view(name) for part in self.parts}
        return Retirement(
            device=name,
            node_deleted=nodeDeleted,
            tokens=revoked.tokens,
            not_after=revoked.not_after,
            unrevocable=revoked.unrevocable(),
            parts={key: view for key, view in views.items() if view is not None},
        )


def retireService(
    kube: KubeService | None,
    *,
    clock: IReactorTime,
    inventory: IInventory,
    journal: AsyncJournal,
    runs: RunRegistry,
    parts: Sequence[IRetirementPart] = (),
) -> RetireService:
    """
    The retirement over C{kube}'s client, token book and approvals; with no
    cluster configured (C{kube} is L{None}) it makes no cluster call.
    """
    cluster = None
    if kube is not None:
        cluster = ClusterRetirement(
            journal, kube.client, kube.book, kube.approver.flights
        )
    return RetireService(
        clock=clock,
        inventory=inventory,
        journal=journal,
        runs=runs,
        cluster=cluster,
        parts=parts,
    )
