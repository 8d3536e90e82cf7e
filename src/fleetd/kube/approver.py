"""
The kubelet CSR approver [K2] [R1]: the watch's side, and the effects.

For each kubelet client CSR the watch shows, L{Approver} gathers the
facts (the token, the grant, the device), takes the verdict of
L{fleetd.kube.verdicts} (which says what fleetd approves), and carries it
out: approve and record (L{fleetd.kube.approvals}: the intent, the API
call, the record, late records), or leave the CSR pending.

A CSR left pending is never denied (Denied is final, and a human may
want to decide) and is journaled with the reason, once per CSR per hour
however often the watch shows it (L{fleetd.kube.pending}); a CSR that
cannot be read at all is one of them (C{unreadable}). CSRs of other
signers are not fleetd's business.

A decision that met a busy store or API (or an approval whose answer was
lost) is read and decided again, backed off (L{fleetd.kube.retries}).

A retirement holds the device (L{fleetd.kube.flights}): no new approval
for it, and it waits for the ones in flight. The records re-check the
device in their own transaction (L{fleetd.kube.records}) [R1].
"""

from __future__ import annotations

import sqlite3
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import IInventory, InventoryError
from fleetd.k8s.client import KubeClient, KubeError, KubeUnavailable
from fleetd.kube.approvals import ApprovalCore, Approvals, IClusterGrants
from fleetd.kube.book import LiveToken, TokenBook
from fleetd.kube.csr import (
    BOOTSTRAP_PREFIX,
    NODE_PREFIX,
    CSRFacts,
    Unreadable,
    describe,
    readCSR,
    shapeRefusal,
)
from fleetd.kube.decisions import CSRDecisions
from fleetd.kube.flights import DeviceFlights
from fleetd.kube.pending import LeftPending
from fleetd.kube.retries import BusyRetries
from fleetd.kube.store import kubelet
from fleetd.kube.verdicts import (
    NodeToken,
    RenewingDevice,
    Verdict,
    firstVerdict,
    grantVerdict,
    renewalVerdict,
)
from fleetd.store.db import StoreError
from fleetd.store.entries import JournalRefused
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner

_UNAVAILABLE = (StoreError, sqlite3.Error, JournalRefused, InventoryError, KubeError)


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
        metrics: CollectorRegistry | None = None,
    ) -> None:
        # fleetd_kube_csr_decisions_total (L{fleetd.kube.decisions})
        self.decisions = CSRDecisions(metrics)
        self.core = ApprovalCore(
            clock, client, book, journal, runner, inventory, grants, self.decisions
        )
        self.approvals = Approvals(self.core)
        self._busy: set[str] = set()
        self._again: dict[str, dict[str, Any]] = {}
        self.pending = LeftPending(clock, journal, self.decisions)
        self.flights = DeviceFlights(book)
        self._pending: set[Deferred[None]] = set()
        self._stopped = False
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
            await self.approvals.reconcile(facts)
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
        token = self.core.book.get(tokenId)
        if token is None or token.record.kind != "node":
            if (
                self.core.grants is not None
                and tokenId == self.core.grants.clusterTokenId()
            ):
                await self._clusterGrant(facts, tokenId, node)
                return
            token = None
        now = self.core.clock.seconds()
        verdict = firstVerdict(facts, None if token is None else _nodeToken(token), now)
        if token is None or not verdict.approve:
            self._refuse(facts, verdict)
            return
        device = verdict.device
        assert device is not None
        flight = self.flights.enter(device)
        if flight is None:  # a retirement holds the device [R1]
            self._leave(facts.name, facts.username, device, "token-revoked", facts.uid)
            return
        token.claimed = facts.name
        try:
            if token.record.csr != facts.name:
                await self.approvals.intend(token, facts)
            await self.approvals.approve(
                facts,
                f"fleetd: first kubelet certificate of {device}"
                f" (bootstrap token {tokenId})",
                lambda late: self.approvals.recordFirst(token.record, facts, late),
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

    async def _clusterGrant(self, facts: CSRFacts, tokenId: str, node: str) -> None:
        grants = self.core.grants
        assert grants is not None
        # The grant claimed for this very CSR by an earlier call whose
        # outcome is unknown, or a free one.
        request = grants.claimedBy(facts.name) or grants.grantFor(node, tokenId)
        verdict = grantVerdict(facts, request)
        if request is None or not verdict.approve:
            self._refuse(facts, verdict)
            return
        # Once per grant: claimed while the API decides, and kept once it
        # approved, whether or not the record commits.
        grants.claim(request, facts.name)
        try:
            approved = await self.approvals.approve(
                facts,
                f"fleetd: {node} joins with the cluster token (request {request})",
                lambda late: self.approvals.recordGrant(
                    request, facts.name, node, late
                ),
            )
        except KubeError as e:
            if not self.approvals.unrecorded(facts.name):
                grants.unclaim(request)  # a definite answer: not approved
            if isinstance(e, KubeUnavailable):
                raise  # maybe approved: kept claimed, looked at again
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )
            return
        except BaseException:
            if not self.approvals.unrecorded(facts.name):
                grants.unclaim(request)
            raise
        if not approved and not self.approvals.unrecorded(facts.name):
            grants.unclaim(request)

    # Renewals [R1]

    async def _renewal(self, facts: CSRFacts) -> None:
        verdict = renewalVerdict(facts)
        if not verdict.approve:
            self._refuse(facts, verdict)
            return
        node = verdict.device
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
        device = await self.core.inventory.get(node)
        record = await self.core.runner.run(lambda db: kubelet(db, node))
        renewing = RenewingDevice(
            status=None if device is None else device.status,
            retired=record is not None and record.retired_at is not None,
        )
        verdict = renewalVerdict(facts, renewing)
        if not verdict.approve:
            self._refuse(facts, verdict)
            return
        try:
            await self.approvals.approve(
                facts,
                f"fleetd: renewal for active device {node}",
                lambda late: self.approvals.recordRenewal(facts, node, late),
            )
        except KubeError as e:
            if isinstance(e, KubeUnavailable):
                raise  # the outcome is unknown: looked at again (seen)
            self.log.warn(
                "kube.csr.approve-failed {csr}: {reason}", csr=facts.name, reason=str(e)
            )

    def _refuse(self, facts: CSRFacts, verdict: Verdict) -> None:
        """Leave C{facts}' CSR pending for the C{verdict}'s reason."""
        assert verdict.reason is not None
        self._leave(
            facts.name, facts.username, verdict.device, verdict.reason, facts.uid
        )

    def _leave(
        self, csr: str, requester: str, device: str | None, reason: str, uid: str
    ) -> None:
        self.pending.leave(csr, requester, device, reason, uid)


def _nodeToken(token: LiveToken) -> NodeToken:
    """The facts L{firstVerdict} needs of a live per-node token."""
    device = token.record.device
    assert device is not None
    return NodeToken(
        device=device,
        expiresAt=token.record.expires_at,
        boundTo=token.boundTo,
        approvedAt=token.record.approved_at,
        revoked=token.suspended or not token.machine.firstCSR(),
    )
