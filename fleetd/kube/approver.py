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
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred, DeferredList
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
    TokenRecord,
    getToken,
    kubelet,
    markIntent,
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
        # Approved by the API, not recorded yet: CSR -> its record [J1].
        self._unrecorded: dict[str, Callable[[bool], Coroutine[Any, Any, None]]] = {}
        self._inflight: dict[str, set[Deferred[None]]] = {}  # device -> [R1]
        self._retiring: dict[str, int] = {}

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

    # Retirement [R1]: one device at a time

    def hold(self, device: str) -> None:
        """
        A retirement of C{device} begins: its tokens are revoked in memory
        and its renewals refused, before any API call of the retirement.
        """
        self._retiring[device] = self._retiring.get(device, 0) + 1
        self.book.suspendDevice(device, True)

    def release(self, device: str) -> None:
        """The retirement ended (committed, or gave up)."""
        left = self._retiring.get(device, 0) - 1
        if left > 0:
            self._retiring[device] = left
            return
        self._retiring.pop(device, None)
        self.book.suspendDevice(device, False)

    def drained(self, device: str) -> Deferred[Any]:
        """Fires once every approval in flight for C{device} has ended."""
        return DeferredList(list(self._inflight.get(device, ())), consumeErrors=True)

    def _enter(self, device: str) -> Deferred[None] | None:
        """An approval for C{device} starts; L{None} while it is retiring."""
        if device in self._retiring:
            return None
        done: Deferred[None] = Deferred()
        self._inflight.setdefault(device, set()).add(done)
        return done

    def _exit(self, device: str, done: Deferred[None]) -> None:
        flights = self._inflight.get(device, set())
        flights.discard(done)
        if not flights:
            self._inflight.pop(device, None)
        done.callback(None)

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
        approved = await self.client.approveCSR(
            facts.name, lambda csr: _stillPending(csr, facts.uid), message
        )
        if approved is None:
            return False  # decided by someone else meanwhile
        self._unrecorded[facts.name] = record
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
        elif token.suspended or not token.machine.mayApprove():
            reason = "token-revoked"
        flight = None if reason is not None else self._enter(device)
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
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
        finally:
            if token.claimed == facts.name:
                token.claimed = None
            self._exit(device, flight)

    async def _intend(self, token: _Token, facts: CSRFacts) -> None:
        """
        Journal the intent, in its own transaction, before the API call
        [K2] [J1]: after a restart at any point the token stays bound to
        this CSR (C{kube_tokens.csr} without C{approved_at}).
        """
        record = token.record

        def change(db: Database, journal: Recorder) -> None:
            if not markIntent(db, record.id, facts.name):
                raise StoreError(f"token {record.id} is bound to another CSR")
            journal(
                "kube.csr-approving",
                actor="fleetd",
                device=record.device,
                run=record.run,
                fields={"csr": facts.name, "bootstrap_id": record.id},
            )

        await self.journal.change(change)
        token.record = replace(token.record, csr=facts.name)

    async def _recordFirst(
        self, record: TokenRecord, facts: CSRFacts, late: bool
    ) -> None:
        """
        Record a first certificate's approval. Its transaction re-checks
        the device [R1]: a token issued before the device's retirement
        gives C{kube.csr-approved-after-retirement} (a warning, with the
        certificate's notAfter when issued), never clears C{retired_at}
        and never moves the status.
        """
        device = record.device
        assert device is not None
        holder: dict[str, Any] = {}

        def change(db: Database, journal: Recorder) -> None:
            now = self.clock.seconds()
            holder["record"], holder["deadline"] = self.book.approvedIn(
                db, record, facts.name
            )
            retiredAt = _retiredAt(db, device)
            if retiredAt is not None and record.created_at <= retiredAt:
                noteKubeletApproved(db, device, facts.name, now)
                self._afterRetirement(journal, facts, device, late, record.id)
                return
            noteKubeletFirst(db, device, facts.name, now)
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
                run=record.run,
                fields={
                    "csr": facts.name,
                    "bootstrap_id": record.id,
                    "delete_at": holder["deadline"],
                    "late": late,
                },
            )

        await self.journal.change(change)
        token = self.book.get(record.id)
        if token is not None:
            self.book.approvedCommitted(token, holder["record"], holder["deadline"])

    def _afterRetirement(
        self,
        journal: Recorder,
        facts: CSRFacts,
        device: str,
        late: bool,
        tokenId: str | None,
    ) -> None:
        expiry = None if facts.certificate is None else notAfter(facts.certificate)
        self.log.warn(
            "kube.csr.approved-after-retirement {csr} {device}",
            csr=facts.name,
            device=device,
        )
        journal(
            "kube.csr-approved-after-retirement",
            actor="fleetd",
            device=device,
            fields={
                "csr": facts.name,
                "kind": "renewal" if tokenId is None else "first",
                "bootstrap_id": tokenId,
                "not_after": expiry,
                "late": late,
                "note": "approved by the API while the device was retired;"
                " Kubernetes cannot revoke the certificate",
            },
        )

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
        # approved, whether or not the record commits.
        grants.claim(request, facts.name)
        try:
            approved = await self._approve(
                facts,
                f"fleetd: {node} joins with the cluster token (request {request})",
                lambda late: self._recordGrant(request, facts.name, node, late),
            )
        except KubeError as e:
            grants.unclaim(request)
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
            return
        except BaseException:
            if facts.name not in self._unrecorded:
                grants.unclaim(request)
            raise
        if not approved:
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
        flight = self._enter(node)
        if flight is None:
            self._leave(
                facts.name, facts.username, node, "renewal-device-retiring", facts.uid
            )
            return
        try:
            await self._renew(facts, node)
        finally:
            self._exit(node, flight)

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
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )

    async def _recordRenewal(self, facts: CSRFacts, node: str, late: bool) -> None:
        """Record a renewal; its transaction re-checks retirement [R1]."""

        def change(db: Database, journal: Recorder) -> None:
            noteKubeletApproved(db, node, facts.name, self.clock.seconds())
            if _retiredAt(db, node) is not None:
                self._afterRetirement(journal, facts, node, late, None)
                return
            journal(
                "kube.csr-renewal-approved",
                actor="fleetd",
                device=node,
                fields={"csr": facts.name, "late": late},
            )

        await self.journal.change(change)

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


def _retiredAt(db: Database, device: str) -> float | None:
    record = kubelet(db, device)
    return None if record is None else record.retired_at
