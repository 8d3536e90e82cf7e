"""
The token book: every live bootstrap token fleetd created, its machine
(L{fleetd.kube.machine}), and the provision hooks that issue per-node
tokens [K1].

Issuing a token is an external side effect (a Secret in the cluster)
that must agree with a database commit (the run that carries it). The
order, for each provision (L{fleetd.runs.registry.RunRegistry.provision}):

  1. L{issue}: mint the token and create its Secret (with C{expiration});
  2. render the configuration with it, into the vault;
  3. L{recordIn}, inside the provision's one transaction: the token row
     (id, device, run, expiry, deletion deadline; never the secret part),
     its journal entry (the id only), and a deletion deadline of "now" for
     the device's earlier tokens not yet approved;
  4. commit fails: L{discard} deletes the Secrets (a failed delete is
     logged; the Secret's C{expiration} is the backstop);
     commit succeeds: L{committed} starts the machines and revokes the
     earlier tokens in the cluster.

A crash between 1 and 3 leaves a Secret no row names: it expires on its
own. Nothing in the database ever names a token that was not created.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.k8s.client import KubeClient, KubeError
from fleetd.kube.machine import TokenEffects, TokenInputs, TokenMachine
from fleetd.kube.store import (
    TokenRecord,
    insertToken,
    liveTokens,
    markDeleted,
    setDeleteAt,
)
from fleetd.kube.tokens import NODE_GROUP, Token, mintToken, tokenSecret
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

FIRST_RETRY = 1.0
MAX_RETRY = 60.0


@dataclass(frozen=True)
class Issued:
    """A token created for one device's run, not yet recorded."""

    token: Token
    record: TokenRecord


class LiveToken(TokenEffects):
    """One live token: its record, its machine, its timers."""

    def __init__(self, book: TokenBook, record: TokenRecord) -> None:
        self.book = book
        self.record = record
        # The CSR an approval or a late record is deciding on now, set
        # before the first await: no other CSR gets the token meanwhile.
        self.claimed: str | None = None
        # A retirement is under way: no approval [R1].
        self.suspended = False
        self._timer: IDelayedCall | None = None
        self._call: Deferred[None] | None = None
        self._delay = FIRST_RETRY
        self.machine: TokenInputs = TokenMachine(self)

    @property
    def boundTo(self) -> str | None:
        """
        The one CSR this token may still be used for [K2]: the one being
        decided, else the persisted intent or approval (C{record.csr}).
        """
        return self.claimed or self.record.csr

    # TokenEffects

    def arm(self, deadline: float) -> None:
        delay = max(0.0, deadline - self.book.clock.seconds())
        self._timer = self.book.clock.callLater(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.machine.deadline()

    def disarm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def startDelete(self) -> None:
        self._call = Deferred.fromCoroutine(self.book._delete(self.record))
        self._call.addCallbacks(self._deleted, self._failed)

    def _deleted(self, _: None) -> None:
        self._call = None
        self.machine.deleted()

    def _failed(self, f: Failure) -> None:
        self._call = None
        if f.check(CancelledError):
            return
        if f.check(KubeError):
            self.book.log.warn(
                "kube.token.delete-failed {bootstrap_id}: {reason}; retrying",
                bootstrap_id=self.record.id,
                reason=f.getErrorMessage(),
            )
        else:
            self.book.log.failure(
                "kube.token.delete-failed {bootstrap_id}",
                f,
                bootstrap_id=self.record.id,
            )
        self.machine.failed()

    def cancelDelete(self) -> None:
        if self._call is not None:
            call, self._call = self._call, None
            call.cancel()

    def armRetry(self) -> None:
        delay, self._delay = self._delay, min(self._delay * 2, MAX_RETRY)
        self._timer = self.book.clock.callLater(delay, self._fire)

    def forget(self) -> None:
        self.book._tokens.pop(self.record.id, None)


class TokenBook:
    """Live tokens by id; issues per-node tokens for provisions [K1]."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        client: KubeClient,
        journal: AsyncJournal,
        runner: IRunner,
        tokenTTL: float,
        deleteAfter: float,
    ) -> None:
        self.clock = clock
        self.client = client
        self.journal = journal
        self.runner = runner
        self.tokenTTL = tokenTTL
        self.deleteAfter = deleteAfter
        self._tokens: dict[str, LiveToken] = {}
        self.stopped = False

    def load(self, records: list[TokenRecord]) -> None:
        """Rebuild every live token's machine from the database (a start)."""
        if self.stopped:
            return  # stopped while loading: arm nothing
        for record in records:
            token = self._add(record)
            if record.approved_at is not None and record.delete_at is not None:
                token.machine.restoreApproved(record.delete_at)
            else:
                token.machine.restoreIssued(record.delete_at)

    async def start(self) -> None:
        records = await self.runner.run(liveTokens)
        self.load(records)

    def _add(self, record: TokenRecord) -> LiveToken:
        token = LiveToken(self, record)
        self._tokens[record.id] = token
        return token

    def get(self, tokenId: str) -> LiveToken | None:
        return self._tokens.get(tokenId)

    def forDevice(self, device: str) -> list[LiveToken]:
        return [
            t
            for t in self._tokens.values()
            if t.record.kind == "node" and t.record.device == device
        ]

    def stop(self) -> None:
        """Cancel every timer and call in flight; nothing is left armed."""
        self.stopped = True
        for token in list(self._tokens.values()):
            token.machine.stop()

    # Provision hooks (fleetd.runs.registry.RunRegistry.provision)

    async def issue(self, device: str, run: str) -> Issued:
        """Mint a token for C{device}'s C{run} and create its Secret."""
        token = mintToken()
        now = self.clock.seconds()
        expires = now + self.tokenTTL
        secret = tokenSecret(
            token,
            description=f"fleetd: device {device}, run {run}",
            expiresAt=expires,
            group=NODE_GROUP,
        )
        await self.client.createSecret(secret)
        record = TokenRecord(
            id=token.id,
            kind="node",
            device=device,
            run=run,
            created_at=now,
            expires_at=expires,
            delete_at=expires,
        )
        self.log.info(
            "kube.token.created {bootstrap_id} {device} {run}",
            bootstrap_id=token.id,
            device=device,
            run=run,
        )
        return Issued(token, record)

    def recordIn(
        self, db: Database, journal: Recorder, issued: list[Issued], actor: str
    ) -> None:
        """Store the tokens as part of the provision's transaction [J1]."""
        now = self.clock.seconds()
        for item in issued:
            record = item.record
            for old in self.forDevice(record.device or ""):
                if old.record.approved_at is None:
                    setDeleteAt(db, old.record.id, now)
                    journal(
                        "kube.token-superseded",
                        actor=actor,
                        device=old.record.device,
                        run=old.record.run,
                        fields={"bootstrap_id": old.record.id, "by_run": record.run},
                    )
            insertToken(db, record)
            journal(
                "kube.token-issued",
                actor=actor,
                device=record.device,
                run=record.run,
                fields={"bootstrap_id": record.id, "expires_at": record.expires_at},
            )

    def committed(self, issued: list[Issued]) -> None:
        """The provision committed: start the new tokens, revoke the old."""
        for item in issued:
            device = item.record.device or ""
            for old in self.forDevice(device):
                if old.record.approved_at is None:
                    old.machine.revoke()
            self._add(item.record).machine.restoreIssued(item.record.delete_at)

    async def discard(self, issued: list[Issued]) -> None:
        """The provision did not commit: delete the Secrets it created."""
        for item in issued:
            await self.discardToken(item.token)

    async def discardToken(self, token: Token) -> None:
        """Delete a Secret no commit refers to (best effort)."""
        try:
            await self.client.deleteSecret(token.secretName)
        except KubeError as e:
            self.log.warn(
                "kube.token.discard-failed {bootstrap_id}: {reason}",
                bootstrap_id=token.id,
                reason=str(e),
            )

    # Deletion (the machine's effect)

    async def _delete(self, record: TokenRecord) -> None:
        existed = await self.client.deleteSecret(f"bootstrap-token-{record.id}")

        def change(db: Database, journal: Recorder) -> None:
            markDeleted(db, record.id, self.clock.seconds())
            journal(
                "kube.token-deleted",
                actor="fleetd",
                device=record.device,
                run=record.run,
                fields={
                    "bootstrap_id": record.id,
                    "kind": record.kind,
                    "was_present": existed,
                    "approved": record.approved_at is not None,
                },
            )

        await self.journal.change(change)

    # Approval bookkeeping (the approver)

    def deletionDeadline(self, approvedAt: float) -> float:
        """When a token approved at C{approvedAt} is deleted [K4]."""
        return approvedAt + self.deleteAfter

    def approvedCommitted(
        self, token: LiveToken, record: TokenRecord, deadline: float
    ) -> None:
        token.record = record
        token.machine.approved(deadline)

    def suspendDevice(self, device: str, suspended: bool) -> None:
        """A retirement begins (or gave up): no approval meanwhile [R1]."""
        for token in self.forDevice(device):
            token.suspended = suspended

    def revokeDevice(self, device: str) -> list[str]:
        """Delete every live token of C{device} now (retirement)."""
        ids = []
        for token in self.forDevice(device):
            token.record = replace(token.record, delete_at=self.clock.seconds())
            token.machine.revoke()
            ids.append(token.record.id)
        return ids

    def add(self, record: TokenRecord) -> LiveToken:
        """A token recorded elsewhere (the cluster-wide token)."""
        token = self._add(record)
        token.machine.restoreIssued(record.delete_at)
        return token
