"""
The kubelet CSR approver [K2] [R1].

Approves exactly:

  - a node's first kubelet client certificate: requester
    C{system:bootstrap:<id>} of a live per-node token fleetd issued, with
    the groups C{system:bootstrappers} and C{system:bootstrappers:fleetd},
    CN C{system:node:<that token's device>}, kubelet-shaped
    (L{fleetd.kube.csr.shapeRefusal}), the token's first CSR, before the
    token's C{expiration}. The approval and the device's move to
    C{active} then commit together with their journal entry [J1], and
    the token's deletion is armed for one minute later [K4];
  - a node holding an owner-approved cluster-wide token grant [K5]
    (L{fleetd.kube.cluster}), once per grant;
  - a renewal from C{system:node:<name>} (CN equal to the requester,
    group C{system:nodes}) for a device that is C{active} and not retired.

Every other kubelet client CSR is left pending (never denied: Denied is
final, and a human may want to decide) and journaled with the reason,
once per CSR per L{JOURNAL_EVERY} seconds however often the watch shows
it. CSRs of other signers are not fleetd's business and are ignored.

An approval is a call to the API first and a commit second. If the
commit fails after the API approved, the next sight of the CSR (the
watch's MODIFIED event, or a re-list) finds it Approved with fleetd's
reason and records it then ("late"); meanwhile the token stays used in
memory, so no second CSR on it is approved [K2].
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import DeviceStatus, IInventory, InventoryError
from fleetd.kube.book import TokenBook, _Token
from fleetd.kube.client import KubeClient, KubeError
from fleetd.kube.csr import (
    BOOTSTRAP_PREFIX,
    NODE_PREFIX,
    CSRFacts,
    Unreadable,
    describe,
    notAfter,
    readCSR,
    shapeRefusal,
)
from fleetd.kube.store import (
    kubelet,
    noteKubeletApproved,
    noteKubeletFirst,
    noteNotAfter,
)
from fleetd.kube.tokens import NODE_GROUP
from fleetd.store.db import Database, StoreError
from fleetd.store.journal import AsyncJournal, JournalRefused, Recorder
from fleetd.store.runner import IRunner

JOURNAL_EVERY = 3600.0
_UNAVAILABLE = (StoreError, sqlite3.Error, JournalRefused, InventoryError, KubeError)
REMEMBERED = 4096
APPROVAL_REASON = "FleetdApproved"
# The statuses a first kubelet certificate moves to active [K2]; never
# decommissioning [R1], nor a status an operator set.
TO_ACTIVE = frozenset({DeviceStatus.PLANNED, DeviceStatus.STAGED, DeviceStatus.ACTIVE})


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


class Approver:
    """Decide on each kubelet client CSR the watcher shows."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        client: KubeClient,
        book: TokenBook,
        journal: AsyncJournal,
        runner: IRunner,
        inventory: IInventory,
        grants: IClusterGrants | None = None,
    ) -> None:
        self.clock = clock
        self.client = client
        self.book = book
        self.journal = journal
        self.runner = runner
        self.inventory = inventory
        self.grants = grants
        self._busy: set[str] = set()
        self._again: dict[str, dict[str, Any]] = {}
        self._journaled: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._pending: set[Deferred[None]] = set()
        self._stopped = False

    def seen(self, obj: dict[str, Any]) -> None:
        """A CSR as listed or watched (ADDED or MODIFIED)."""
        try:
            facts = readCSR(obj)
        except Unreadable as e:
            # Left pending and journaled once [K2]; never approved, and
            # never an error that could stop the watch (issue 17).
            name, uid, requester = describe(obj)
            self.log.warn("kube.csr.unreadable {csr}: {error}", csr=name, error=str(e))
            self._leave(
                name, requester, None, "unreadable", uid=name if uid == "?" else uid
            )
            return
        if facts.denied:
            return
        if facts.name in self._busy:
            self._again[facts.name] = obj  # decide on the newest sight after
            return
        self._busy.add(facts.name)
        d = Deferred.fromCoroutine(self._decide(facts))
        self._pending.add(d)

        def done(result: object) -> None:
            self._busy.discard(facts.name)
            self._pending.discard(d)
            if isinstance(result, Failure) and result.check(*_UNAVAILABLE):
                # Not recorded; the next sight of the CSR decides or records it.
                self.log.error(
                    "kube.csr.not-recorded {csr}: {reason}",
                    csr=facts.name,
                    reason=result.getErrorMessage(),
                )
            elif isinstance(result, Failure) and not result.check(CancelledError):
                self.log.failure("kube.csr.failed {csr}", result, csr=facts.name)
            again = self._again.pop(facts.name, None)
            if again is not None and not self._stopped:
                self.seen(again)

        d.addBoth(done)

    def stop(self) -> None:
        self._stopped = True
        self._again.clear()
        for d in list(self._pending):
            d.cancel()

    async def _decide(self, facts: CSRFacts) -> None:
        if facts.approved:
            await self._reconcile(facts)
            return
        refusal = shapeRefusal(facts)
        if refusal is not None:
            self._leave(facts.name, facts.username, None, refusal, uid=facts.uid)
            return
        if facts.username.startswith(BOOTSTRAP_PREFIX):
            await self._first(facts)
        elif facts.username.startswith(NODE_PREFIX):
            await self._renewal(facts)
        else:
            self._leave(
                facts.name, facts.username, None, "requester-not-a-node", facts.uid
            )

    # First certificates

    async def _first(self, facts: CSRFacts) -> None:
        tokenId = facts.username[len(BOOTSTRAP_PREFIX) :]
        node = facts.node
        assert node is not None
        token = self.book.get(tokenId)
        if token is None or token.record.kind != "node":
            if self.grants is not None and tokenId == self.grants.clusterTokenId():
                await self._clusterGrant(facts, tokenId, node)
                return
            self._leave(facts.name, facts.username, None, "unknown-token", facts.uid)
            return
        device = token.record.device
        now = self.clock.seconds()
        reason = None
        if "system:bootstrappers" not in facts.groups or NODE_GROUP not in facts.groups:
            reason = "wrong-groups"
        elif node != device:
            reason = "wrong-node"
        elif token.record.expires_at is not None and now >= token.record.expires_at:
            reason = "token-expired"
        elif (
            token.approving
            or token.apiApproved is not None
            or not token.machine.mayApprove()
        ):
            revoked = (
                token.record.approved_at is None
                and not token.approving
                and token.apiApproved is None
            )
            reason = "token-revoked" if revoked else "second-csr-for-token"
        if reason is not None:
            self._leave(facts.name, facts.username, device, reason, facts.uid)
            return
        token.approving = True
        try:
            approved = await self.client.approveCSR(
                facts.name,
                lambda csr: _stillPending(csr, facts.uid),
                f"fleetd: first kubelet certificate of {device}"
                f" (bootstrap token {tokenId})",
            )
            if approved is None:
                return  # decided by someone else meanwhile
            # Approved by the API: no other CSR on this token, whether or
            # not the record below commits (it is then recorded late).
            token.apiApproved = facts.name
            await self._recordFirst(token, facts, late=False)
        except KubeError as e:
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
        finally:
            token.approving = False

    async def _recordFirst(self, token: _Token, facts: CSRFacts, late: bool) -> None:
        device = token.record.device
        assert device is not None
        holder: dict[str, Any] = {}

        def change(db: Database, journal: Recorder) -> None:
            record, deadline = self.book.approvedIn(db, token, facts.name)
            holder["record"], holder["deadline"] = record, deadline
            noteKubeletFirst(db, device, facts.name, self.clock.seconds())
            # Compare and set in this transaction: a retirement (or an
            # operator's status) committed since is never overwritten.
            try:
                self.inventory.transitionIn(db, device, TO_ACTIVE, DeviceStatus.ACTIVE)
            except InventoryError as e:
                if e.kind != "not-found":
                    raise
            journal(
                "kube.csr-approved",
                actor="fleetd",
                device=device,
                run=token.record.run,
                fields={
                    "csr": facts.name,
                    "bootstrap_id": token.record.id,
                    "delete_at": deadline,
                    "late": late,
                },
            )

        await self.journal.change(change)
        self.book.approvedCommitted(token, holder["record"], holder["deadline"])

    async def _clusterGrant(self, facts: CSRFacts, tokenId: str, node: str) -> None:
        assert self.grants is not None
        request = self.grants.grantFor(node, tokenId)
        if request is None:
            self._leave(
                facts.name,
                facts.username,
                None,
                "no-approved-cluster-token-request",
                facts.uid,
            )
            return
        grants = self.grants
        # Once per grant: claimed while the API decides, and kept once it
        # approved, whether or not the record below commits.
        grants.claim(request, facts.name)
        try:
            approved = await self.client.approveCSR(
                facts.name,
                lambda csr: _stillPending(csr, facts.uid),
                f"fleetd: {node} joins with the cluster token (request {request})",
            )
        except KubeError as e:
            grants.unclaim(request)
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
            return
        except BaseException:
            grants.unclaim(request)
            raise
        if approved is None:
            grants.unclaim(request)
            return
        await self._recordGrant(request, facts.name, node, late=False)

    async def _recordGrant(self, request: str, csr: str, node: str, late: bool) -> None:
        """
        The API approved C{csr} with the grant C{request}: record it used.
        If this fails the grant stays claimed (no other CSR gets it), and
        the next sight of the approved CSR records it late [J1].
        """
        assert self.grants is not None
        grants = self.grants

        def change(db: Database, journal: Recorder) -> None:
            grants.usedIn(db, request, csr)
            journal(
                "kube.csr-approved-cluster-token",
                actor="fleetd",
                fields={"csr": csr, "node": node, "request": request, "late": late},
            )

        await self.journal.change(change)
        grants.usedCommitted(request)

    # Renewals [R1]

    async def _renewal(self, facts: CSRFacts) -> None:
        node = facts.node
        if (
            facts.username != NODE_PREFIX + (node or "")
            or "system:nodes" not in facts.groups
        ):
            self._leave(
                facts.name, facts.username, None, "renewal-for-another-node", facts.uid
            )
            return
        assert node is not None
        device = await self.inventory.get(node)
        record = await self.runner.run(lambda db: kubelet(db, node))
        reason = None
        if device is None:
            reason = "renewal-unknown-device"
        elif record is not None and record.retired_at is not None:
            reason = "renewal-device-retired"
        elif device.status is not DeviceStatus.ACTIVE:
            reason = f"renewal-device-{device.status.value}"
        if reason is not None:
            self._leave(facts.name, facts.username, node, reason, facts.uid)
            return
        try:
            approved = await self.client.approveCSR(
                facts.name,
                lambda csr: _stillPending(csr, facts.uid),
                f"fleetd: renewal for active device {node}",
            )
        except KubeError as e:
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
            return
        if approved is None:
            return

        def change(db: Database, journal: Recorder) -> None:
            noteKubeletApproved(db, node, facts.name, self.clock.seconds())
            journal(
                "kube.csr-renewal-approved",
                actor="fleetd",
                device=node,
                fields={"csr": facts.name},
            )

        await self.journal.change(change)

    # Already approved: late records and issued certificates

    async def _reconcile(self, facts: CSRFacts) -> None:
        if facts.reason != APPROVAL_REASON:
            return
        node = facts.node
        if facts.username.startswith(BOOTSTRAP_PREFIX):
            token = self.book.get(facts.username[len(BOOTSTRAP_PREFIX) :])
            if (
                token is not None
                and token.record.kind == "node"
                and token.record.approved_at is None
                and not token.approving
                and token.apiApproved in (None, facts.name)
                and node == token.record.device
            ):
                await self._recordFirst(token, facts, late=True)
            elif self.grants is not None and node is not None:
                request = self.grants.claimedBy(facts.name)
                if request is not None:  # approved with a grant, not recorded
                    await self._recordGrant(request, facts.name, node, late=True)
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

        await self.journal.change(change)

    # Left pending

    def _leave(
        self, csr: str, requester: str, device: str | None, reason: str, uid: str
    ) -> None:
        """Journal a CSR left pending, at most once per CSR and reason per hour."""
        key = (uid or csr, reason)
        now = self.clock.seconds()
        last = self._journaled.get(key)
        if last is not None and now - last < JOURNAL_EVERY:
            return
        self._journaled[key] = now
        self._journaled.move_to_end(key)
        while len(self._journaled) > REMEMBERED:
            self._journaled.popitem(last=False)
        self.log.warn(
            "kube.csr.left-pending {csr} {requester}: {reason}",
            csr=csr,
            requester=requester,
            reason=reason,
        )
        self.journal.append(
            "kube.csr-left-pending",
            actor="fleetd",
            device=device,
            fields={"csr": csr[:128], "requester": requester[:256], "reason": reason},
        ).addErrback(self._journalFailed, key)

    def _journalFailed(self, f: Failure, key: tuple[str, str]) -> None:
        self._journaled.pop(key, None)  # try again on the next sight
        self.log.failure("kube.csr.journal-failed", f)


def _stillPending(csr: dict[str, Any], uid: str) -> bool:
    """Approve only the object decided on: same uid, still undecided."""
    if (csr.get("metadata") or {}).get("uid") != uid:
        return False
    conditions = (csr.get("status") or {}).get("conditions") or []
    return not any(c.get("type") in ("Approved", "Denied") for c in conditions)
