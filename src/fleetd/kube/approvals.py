"""
Approve a kubelet client CSR, then record it [J1] [K2] [K5] [R1].

Every approval (first, grant, renewal) goes through L{Approvals.approve}:
the API call, then the record. Should the record fail after the API
approved, or the call's answer be lost, the next sight of the CSR (the
watch's MODIFIED event, or a re-list, which hands approved CSRs over
first) records it then, once ("late", L{Approvals.reconcile}); after a
restart the token's intent finds it. A first certificate's intent
(C{kube.csr-approving}: the token bound to that CSR) commits in its own
transaction before the API call (L{Approvals.intend}), so the token
approves no other CSR once bound, also after a restart at any point
[K2]. The records re-check the device in their own transaction
(L{fleetd.kube.records}) [R1].
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from twisted.internet.interfaces import IReactorTime

from fleetd.inventory.model import IInventory
from fleetd.k8s.client import KubeClient, KubeUnavailable
from fleetd.kube.book import LiveToken, TokenBook
from fleetd.kube.csr import BOOTSTRAP_PREFIX, CSRFacts, notAfter, stillPending
from fleetd.kube.decisions import GRANTED, CSRDecisions
from fleetd.kube.records import firstApprovedIn, intentIn, renewalApprovedIn
from fleetd.kube.store import TokenRecord, getToken, noteNotAfter
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

APPROVAL_REASON = "FleetdApproved"


class IClusterGrants(Protocol):
    """Owner-approved uses of the cluster-wide token [K5]."""

    def clusterTokenId(self) -> str | None:
        "The current cluster-wide token's id."

    def grantFor(self, node: str, tokenId: str) -> str | None:
        "The approved, unused request letting C{node} join with C{tokenId}."

    def claim(self, request: str, csr: str) -> None:
        "The approver asks the API to approve C{csr} with C{request}."

    def claimedBy(self, csr: str) -> str | None:
        "The request claimed for C{csr} and not yet recorded as used."

    def unclaim(self, request: str) -> None:
        "The API did not approve: C{request} may be used again."

    def usedIn(self, db: Database, request: str, csr: str) -> None:
        "Mark the grant used, in the approval's transaction."

    def usedCommitted(self, request: str) -> None:
        "That transaction committed: forget the grant."


@dataclass
class ApprovalCore:
    """What the approver and its approvals act on (one, shared)."""

    clock: IReactorTime
    client: KubeClient
    book: TokenBook
    journal: AsyncJournal
    runner: IRunner
    inventory: IInventory
    grants: IClusterGrants | None = None
    decisions: CSRDecisions = field(default_factory=lambda: CSRDecisions(None))


class Approvals:
    """The API approval of a CSR and its record, now or late [J1]."""

    def __init__(self, core: ApprovalCore) -> None:
        self.core = core
        # Approved by the API, not recorded yet: CSR -> its record [J1].
        self._unrecorded: dict[str, Callable[[bool], Coroutine[Any, Any, None]]] = {}

    def unrecorded(self, csr: str) -> bool:
        """
        Whether the API may have approved C{csr} here (its answer was lost,
        or it approved) and its record is still due.
        """
        return csr in self._unrecorded

    async def approve(
        self,
        facts: CSRFacts,
        message: str,
        record: Callable[[bool], Coroutine[Any, Any, None]],
    ) -> bool:
        """
        Ask the API to approve C{facts}' CSR; once it did, C{record} it.
        Should that record fail, the next sight of the approved CSR
        records it late (L{reconcile}), once: the same for a first
        certificate, a cluster-token grant [K5] and a renewal [R1].
        """
        # Registered before the call: a timeout or a cut connection
        # (KubeUnavailable) may hide an approval the API applied, which its
        # next sight then records late. Only a definite answer forgets it,
        # and only if no earlier call of ours may have been applied.
        earlier = facts.name in self._unrecorded
        self._unrecorded[facts.name] = record
        try:
            approved = await self.core.client.approveCSR(
                facts.name, lambda csr: stillPending(csr, facts.uid), message
            )
        except KubeUnavailable:
            raise
        except BaseException:
            if not earlier:
                self._unrecorded.pop(facts.name, None)
            raise
        if approved is None:
            if not earlier:
                self._unrecorded.pop(facts.name, None)
            return False  # decided by someone else meanwhile
        await self.recordOnce(facts.name, late=False)
        return True

    async def recordOnce(self, csr: str, late: bool) -> None:
        record = self._unrecorded.get(csr)
        if record is not None:
            await record(late)
            self._unrecorded.pop(csr, None)

    async def intend(self, token: LiveToken, facts: CSRFacts) -> None:
        """
        Journal the intent, in its own transaction, before the API call
        [K2] [J1]: after a restart at any point the token stays bound to
        this CSR (C{kube_tokens.csr} without C{approved_at}).
        """
        record = token.record
        await self.core.journal.change(
            lambda db, journal: intentIn(db, journal, record, facts.name)
        )
        token.record = replace(token.record, csr=facts.name)

    async def recordFirst(
        self, record: TokenRecord, facts: CSRFacts, late: bool
    ) -> None:
        """
        Record a first certificate's approval (L{firstApprovedIn}); the
        token book learns of it once that committed.
        """
        book, inventory = self.core.book, self.core.inventory
        now = self.core.clock.seconds()
        deadline = book.deletionDeadline(now)
        approved, reason = await self.core.journal.change(
            lambda db, journal: firstApprovedIn(
                db,
                journal,
                inventory=inventory,
                record=record,
                facts=facts,
                late=late,
                now=now,
                deadline=deadline,
            )
        )
        self.core.decisions.approved(reason)  # recorded with its entry [J1]
        token = book.get(record.id)
        if token is not None:
            book.approvedCommitted(token, approved, deadline)

    async def recordGrant(self, request: str, csr: str, node: str, late: bool) -> None:
        """
        The API approved C{csr} with the grant C{request}: record it used.
        If this fails the grant stays claimed (no other CSR gets it), and
        the next sight of the approved CSR records it late [J1].
        """
        assert self.core.grants is not None
        grants = self.core.grants

        def change(db: Database, journal: Recorder) -> None:
            grants.usedIn(db, request, csr)
            journal(
                "kube.csr-approved-cluster-token",
                actor="fleetd",
                fields={"csr": csr, "node": node, "request": request, "late": late},
            )

        await self.core.journal.change(change)
        self.core.decisions.approved(GRANTED)
        grants.usedCommitted(request)

    async def recordRenewal(self, facts: CSRFacts, node: str, late: bool) -> None:
        """Record a renewal; its transaction re-checks retirement [R1]."""
        reason = await self.core.journal.change(
            lambda db, journal: renewalApprovedIn(
                db, journal, facts, node, late, self.core.clock.seconds()
            )
        )
        self.core.decisions.approved(reason)

    # Already approved: late records and issued certificates

    async def reconcile(self, facts: CSRFacts) -> None:
        if facts.reason != APPROVAL_REASON:
            return
        node = facts.node
        if facts.name in self._unrecorded:  # approved here, not recorded yet
            await self.recordOnce(facts.name, late=True)
        elif facts.username.startswith(BOOTSTRAP_PREFIX) and node is not None:
            await self._lateFirst(facts, facts.username[len(BOOTSTRAP_PREFIX) :], node)
        if facts.certificate is None or node is None:
            return
        expiry = notAfter(facts.certificate)
        if expiry is None:
            return

        def change(db: Database, journal: Recorder) -> None:
            if noteNotAfter(db, node, facts.name, expiry):
                journal(
                    "kube.kubelet-certificate-issued",
                    actor="fleetd",
                    device=node,
                    fields={"csr": facts.name, "not_after": expiry},
                )

        await self.core.journal.change(change)

    async def _lateFirst(self, facts: CSRFacts, tokenId: str, node: str) -> None:
        """
        A first CSR the API approved with fleetd's reason and no record:
        after a restart, the token's persisted intent names it [K2]. The
        token is marked before anything is awaited, so no other CSR of the
        same LIST gets it meanwhile.
        """
        token = self.core.book.get(tokenId)
        if token is not None:
            if (
                token.record.kind != "node"
                or token.record.approved_at is not None
                or token.boundTo not in (None, facts.name)
                or node != token.record.device
            ):
                return
            token.claimed = facts.name
            try:
                await self.recordFirst(token.record, facts, late=True)
            finally:
                if token.claimed == facts.name:
                    token.claimed = None
            return
        # Deleted meanwhile (a retirement, its expiry): its stored intent.
        record = await self.core.runner.run(lambda db: getToken(db, tokenId))
        if (
            record is not None
            and record.kind == "node"
            and record.approved_at is None
            and record.csr == facts.name
            and node == record.device
        ):
            await self.recordFirst(record, facts, late=True)
