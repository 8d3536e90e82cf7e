"""
The cluster's side of a retirement [R1]: what C{fleetctl retire NAME}
does to the device's credentials. L{fleetd.fleet.retire} owns the order
of the steps and the one transaction; L{ClusterRetirement} does the
cluster's steps when asked:

  - L{ClusterRetirement.held}: one device at a time, the device's tokens
    are revoked in memory and its renewals refused (L{IApprovals.hold})
    before any API call, and the retirement waits for the approvals
    already in flight for it; an approval's own transaction re-checks
    C{retired_at}, so one the API made before and fleetd records after
    (late) is journaled C{kube.csr-approved-after-retirement} and never
    clears it;
  - L{ClusterRetirement.deleteNode}: when a cluster is configured, the
    Node's deletion, journaled C{kube.node-delete-requested} in its own
    transaction before the API is asked; a failure refuses the retirement
    and nothing else changes. L{ClusterRetirement.undone} journals
    C{kube.node-deleted} when the Node went but the retirement's
    transaction then failed (when the journal can);
  - L{ClusterRetirement.recordRetirement}, in the retirement's
    transaction [J1]: the kubelet record is marked retired (later renewal
    CSRs are refused, L{fleetd.kube.approver}), the device's live tokens
    get a deletion deadline of now; L{ClusterRetirement.recordUnrevocable}
    journals what cannot be revoked: the kubelet client certificate (with
    its notAfter when fleetd saw it issued) and C{machine.token}, the
    trustd token every Talos configuration carries and nothing rotates;
  - L{ClusterRetirement.committed}, after the commit: the tokens are
    deleted (retried while the API is down; their persisted deadline
    re-arms after a restart).

Without C{[kubernetes]} there is no client, token book or approver: no
Node is deleted, and the kubelet and token tables are empty (or hold what
a cluster configured before left there, which the retirement still marks
and reports). Deleting the Node does not stop a machine whose kubelet
still holds a valid certificate from registering it again when it
restarts: wipe or power off the machine (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from fleetd.k8s.client import KubeClient
from fleetd.kube.book import TokenBook
from fleetd.kube.store import kubelet, liveTokens, noteRetired, setDeleteAt
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder

_T = TypeVar("_T")


class IApprovals(Protocol):
    """The approver's per-device part (L{fleetd.kube.flights.DeviceFlights})."""

    def hold(self, device: str) -> None:
        "No approval for C{device} from now on, until L{release}."

    def release(self, device: str) -> None:
        "The retirement ended."

    def drained(self, device: str) -> Deferred[Any]:
        "Fires once the approvals in flight for C{device} have ended."


UNROTATED_TRUSTD = (
    "machine.token (the cluster's trustd token) is in every Talos configuration;"
    " nothing rotates it, and a copy on disk can still obtain Talos API certificates"
)


@dataclass(frozen=True)
class Revoked:
    """What the retirement's transaction found and did to the credentials."""

    tokens: list[str]  # the device's live bootstrap tokens, deleted now
    csr: str | None  # the kubelet's last CSR fleetd approved
    not_after: float | None  # its certificate's notAfter, when fleetd saw it

    def unrevocable(self) -> list[str]:
        """What the owner is told cannot be revoked."""
        notAfter = self.not_after
        return [
            "kubelet client certificate"
            + (
                f" (valid until notAfter {notAfter:.0f})"
                if notAfter is not None
                else " (notAfter unknown: fleetd did not see it issued)"
            ),
            UNROTATED_TRUSTD,
        ]


class ClusterRetirement:
    """
    The cluster's steps of a retirement (the module's docstring); with
    no cluster configured (no C{client}), its records only.
    """

    log = Logger()

    def __init__(
        self,
        journal: AsyncJournal,
        client: KubeClient | None = None,
        book: TokenBook | None = None,
        approvals: IApprovals | None = None,
    ) -> None:
        self.journal = journal
        self.client = client
        self.book = book
        self.approvals = approvals

    async def held(self, device: str, work: Callable[[], Awaitable[_T]]) -> _T:
        """C{work}, with C{device}'s approvals held and drained first [R1]."""
        approvals = self.approvals
        if approvals is None:
            return await work()
        approvals.hold(device)  # before any API call [R1]
        try:
            await approvals.drained(device)
            return await work()
        finally:
            approvals.release(device)

    async def deleteNode(self, name: str, actor: str) -> bool | None:
        """
        Delete the Node (L{None}: no cluster configured). Journal the
        deletion before asking for it, in its own transaction (a failure
        here refuses the retirement before anything changed), so a
        retirement whose commit then fails never leaves a deletion the
        journal does not know of [J1].
        """
        client = self.client
        if client is None:
            return None
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

    async def undone(self, name: str, actor: str, nodeDeleted: bool | None) -> None:
        """The retirement did not commit: journal what the API did, if we can."""
        if not nodeDeleted:
            return
        try:
            await self.journal.append(
                "kube.node-deleted",
                actor=actor,
                device=name,
                fields={"node_deleted": nodeDeleted, "retired": False},
            )
        except Exception as e:
            self.log.error(
                "kube.retire.outcome-not-journaled {device}: {reason}",
                device=name,
                reason=str(e),
            )

    def recordRetirement(self, db: Database, name: str, at: float) -> Revoked:
        """
        In the retirement's transaction: the device's live tokens are to
        be deleted at C{at}, its kubelet record is retired (renewals
        refused).
        """
        record = kubelet(db, name)
        tokens = [t.id for t in liveTokens(db) if t.kind == "node" and t.device == name]
        for token in tokens:
            setDeleteAt(db, token, at)
        noteRetired(db, name, at)
        if record is None:
            return Revoked(tokens, None, None)
        return Revoked(tokens, record.last_csr, record.not_after)

    def recordUnrevocable(
        self, journal: Recorder, name: str, actor: str, revoked: Revoked
    ) -> None:
        """In the retirement's transaction: journal what cannot be revoked."""
        journal(
            "kube.unrevocable",
            actor=actor,
            device=name,
            fields={
                "credential": "kubelet client certificate",
                "csr": revoked.csr,
                "not_after": revoked.not_after,
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

    def committed(self, name: str) -> None:
        """The retirement committed: the device's tokens go now."""
        if self.book is not None:
            self.book.revokeDevice(name)
