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
once per CSR per hour however often the watch shows it
(L{fleetd.kube.pending}); a CSR that cannot be read at all is one of
them (C{unreadable}). CSRs of other signers are not fleetd's business.

A first certificate's approval is three steps: the intent
(C{kube.csr-approving}: the token bound to that CSR) commits in its own
transaction, then the API call, then the record [J1]. The token approves
no other CSR once bound, also after a restart at any point [K2].
Every approval (first, grant, renewal) goes through L{Approver._approve}:
should the record fail after the API approved, or the call's answer be
lost, the next sight of the CSR (the watch's MODIFIED event, or a
re-list, which hands approved CSRs over first) records it then, once
("late"); after a restart the token's intent finds it. A decision that
met a busy store or API is read and decided again, backed off
(L{fleetd.kube.retries}).

A retirement holds the device (L{fleetd.kube.flights}): no new approval
for it, and it waits for the ones in flight. The records re-check the
device in their own transaction (L{fleetd.kube.records}) [R1].
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import DeviceStatus, IInventory, InventoryError
from fleetd.kube.book import TokenBook, _Token
from fleetd.kube.client import KubeClient, KubeError, KubeUnavailable
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
from fleetd.kube.flights import DeviceFlights
from fleetd.kube.pending import LeftPending
from fleetd.kube.records import firstApprovedIn, intentIn, renewalApprovedIn
from fleetd.kube.retries import BusyRetries
from fleetd.kube.store import (
    TokenRecord,
    getToken,
    kubelet,
    noteNotAfter,
)
from fleetd.kube.tokens import NODE_GROUP
from fleetd.store.db import Database, StoreError
from fleetd.store.entries import JournalRefused
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

_UNAVAILABLE = (StoreError, sqlite3.Error, JournalRefused, InventoryError, KubeError)
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
        self.pending = LeftPending(clock, journal)
        self.flights = DeviceFlights(book)
        self._pending: set[Deferred[None]] = set()
        self._stopped = False
        # Approved by the API, not recorded yet: CSR -> its record [J1].
        self._unrecorded: dict[str, Callable[[bool], Coroutine[Any, Any, None]]] = {}
        # Busy CSRs are read and decided again, backed off [K2].
        self.retries = BusyRetries(clock, client.getCSR, self.seen)

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
        self.retries.cancel(facts.name)  # this sight decides now
        if facts.denied:
            self.retries.forget(facts.name)
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
            busy = False
            if isinstance(result, Failure) and result.check(*_UNAVAILABLE):
                # Not decided or not recorded: looked at again, backed off.
                busy = True
                self.log.error(
                    "kube.csr.not-recorded {csr}: {reason}",
                    csr=facts.name,
                    reason=result.getErrorMessage(),
                )
            elif isinstance(result, Failure) and not result.check(CancelledError):
                self.log.failure("kube.csr.failed {csr}", result, csr=facts.name)
            again = self._again.pop(facts.name, None)
            if self._stopped:
                return
            if again is not None:
                self.seen(again)
            elif busy:
                self.retries.later(facts.name)
            else:
                self.retries.forget(facts.name)

        d.addBoth(done)

    def stop(self) -> None:
        self._stopped = True
        self._again.clear()
        self.retries.stop()
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

    # Approve, then record: now, or late on the next sight [J1]

    async def _approve(
        self,
        facts: CSRFacts,
        message: str,
        record: Callable[[bool], Coroutine[Any, Any, None]],
    ) -> bool:
        """
        Ask the API to approve C{facts}' CSR; once it did, C{record} it.
        Should that record fail, the next sight of the approved CSR
        records it late (L{_reconcile}), once: the same for a first
        certificate, a cluster-token grant [K5] and a renewal [R1].
        """
        # Registered before the call: a timeout or a cut connection
        # (KubeUnavailable) may hide an approval the API applied, which its
        # next sight then records late. Only a definite answer forgets it,
        # and only if no earlier call of ours may have been applied.
        earlier = facts.name in self._unrecorded
        self._unrecorded[facts.name] = record
        try:
            approved = await self.client.approveCSR(
                facts.name, lambda csr: _stillPending(csr, facts.uid), message
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
        await self._recordOnce(facts.name, late=False)
        return True

    async def _recordOnce(self, csr: str, late: bool) -> None:
        record = self._unrecorded.get(csr)
        if record is not None:
            await record(late)
            self._unrecorded.pop(csr, None)

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
        assert device is not None
        now = self.clock.seconds()
        reason = None
        if "system:bootstrappers" not in facts.groups or NODE_GROUP not in facts.groups:
            reason = "wrong-groups"
        elif node != device:
            reason = "wrong-node"
        elif token.record.expires_at is not None and now >= token.record.expires_at:
            reason = "token-expired"
        elif (
            token.boundTo not in (None, facts.name)
            or token.record.approved_at is not None
        ):
            # Once per token [K2]: bound to another CSR by an approval in
            # flight, its persisted intent, or its recorded approval.
            reason = "second-csr-for-token"
        elif token.suspended or not token.machine.firstCSR():
            reason = "token-revoked"
        flight = None if reason is not None else self.flights.enter(device)
        if reason is not None or flight is None:
            reason = reason or "token-revoked"
            self._leave(facts.name, facts.username, device, reason, facts.uid)
            return
        token.claimed = facts.name
        try:
            if token.record.csr != facts.name:
                await self._intend(token, facts)
            await self._approve(
                facts,
                f"fleetd: first kubelet certificate of {device}"
                f" (bootstrap token {tokenId})",
                lambda late: self._recordFirst(token.record, facts, late),
            )
        except KubeError as e:
            if isinstance(e, KubeUnavailable):
                raise  # the outcome is unknown: looked at again (seen)
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
        finally:
            if token.claimed == facts.name:
                token.claimed = None
            self.flights.exit(device, flight)

    async def _intend(self, token: _Token, facts: CSRFacts) -> None:
        """
        Journal the intent, in its own transaction, before the API call
        [K2] [J1]: after a restart at any point the token stays bound to
        this CSR (C{kube_tokens.csr} without C{approved_at}).
        """
        record = token.record
        await self.journal.change(
            lambda db, journal: intentIn(db, journal, record, facts.name)
        )
        token.record = replace(token.record, csr=facts.name)

    async def _recordFirst(
        self, record: TokenRecord, facts: CSRFacts, late: bool
    ) -> None:
        """Record a first certificate's approval (L{firstApprovedIn})."""
        approved, deadline = await self.journal.change(
            lambda db, journal: firstApprovedIn(
                db,
                journal,
                book=self.book,
                inventory=self.inventory,
                record=record,
                facts=facts,
                late=late,
                now=self.clock.seconds(),
            )
        )
        token = self.book.get(record.id)
        if token is not None:
            self.book.approvedCommitted(token, approved, deadline)

    async def _clusterGrant(self, facts: CSRFacts, tokenId: str, node: str) -> None:
        assert self.grants is not None
        # The grant claimed for this very CSR by an earlier call whose
        # outcome is unknown, or a free one.
        request = self.grants.claimedBy(facts.name) or self.grants.grantFor(
            node, tokenId
        )
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
        # approved, whether or not the record commits.
        grants.claim(request, facts.name)
        try:
            approved = await self._approve(
                facts,
                f"fleetd: {node} joins with the cluster token (request {request})",
                lambda late: self._recordGrant(request, facts.name, node, late),
            )
        except KubeError as e:
            if facts.name not in self._unrecorded:
                grants.unclaim(request)  # a definite answer: not approved
            if isinstance(e, KubeUnavailable):
                raise  # maybe approved: kept claimed, looked at again
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
            return
        except BaseException:
            if facts.name not in self._unrecorded:
                grants.unclaim(request)
            raise
        if not approved and facts.name not in self._unrecorded:
            grants.unclaim(request)

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
        flight = self.flights.enter(node)
        if flight is None:
            self._leave(
                facts.name, facts.username, node, "renewal-device-retiring", facts.uid
            )
            return
        try:
            await self._renew(facts, node)
        finally:
            self.flights.exit(node, flight)

    async def _renew(self, facts: CSRFacts, node: str) -> None:
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
            await self._approve(
                facts,
                f"fleetd: renewal for active device {node}",
                lambda late: self._recordRenewal(facts, node, late),
            )
        except KubeError as e:
            if isinstance(e, KubeUnavailable):
                raise  # the outcome is unknown: looked at again (seen)
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )

    async def _recordRenewal(self, facts: CSRFacts, node: str, late: bool) -> None:
        """Record a renewal; its transaction re-checks retirement [R1]."""
        await self.journal.change(
            lambda db, journal: renewalApprovedIn(
                db, journal, facts, node, late, self.clock.seconds()
            )
        )

    # Already approved: late records and issued certificates

    async def _reconcile(self, facts: CSRFacts) -> None:
        if facts.reason != APPROVAL_REASON:
            return
        node = facts.node
        if facts.name in self._unrecorded:  # approved here, not recorded yet
            await self._recordOnce(facts.name, late=True)
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

        await self.journal.change(change)

    async def _lateFirst(self, facts: CSRFacts, tokenId: str, node: str) -> None:
        """
        A first CSR the API approved with fleetd's reason and no record:
        after a restart, the token's persisted intent names it [K2]. The
        token is marked before anything is awaited, so no other CSR of the
        same LIST gets it meanwhile.
        """
        token = self.book.get(tokenId)
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
                await self._recordFirst(token.record, facts, late=True)
            finally:
                if token.claimed == facts.name:
                    token.claimed = None
            return
        # Deleted meanwhile (a retirement, its expiry): its stored intent.
        record = await self.runner.run(lambda db: getToken(db, tokenId))
        if (
            record is not None
            and record.kind == "node"
            and record.approved_at is None
            and record.csr == facts.name
            and node == record.device
        ):
            await self._recordFirst(record, facts, late=True)

    def _leave(
        self, csr: str, requester: str, device: str | None, reason: str, uid: str
    ) -> None:
        self.pending.leave(csr, requester, device, reason, uid)


def _stillPending(csr: dict[str, Any], uid: str) -> bool:
    """Approve only the object decided on: same uid, still undecided."""
    if (csr.get("metadata") or {}).get("uid") != uid:
        return False
    conditions = (csr.get("status") or {}).get("conditions") or []
    return not any(c.get("type") in ("Approved", "Denied") for c in conditions)
