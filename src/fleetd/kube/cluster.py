"""
The cluster-wide bootstrap token [K5] [K6].

Control planes and machines fleetd does not provision (shale) join with
the cluster's shared token (Talos's C{cluster.token}). fleetd manages it:

  - C{request(node, reason)}: journaled, pending; anyone with the owner
    certificate may ask, nothing is revealed;
  - C{approve(request)}: an owner's decision, journaled. The answer
    carries the token, once (fleetd keeps it sealed with a key derived
    from its master key, so the next approval can show it again; it is
    never journaled or logged). The approval also lets the approver
    (L{fleetd.kube.approver}) approve that node's first kubelet CSR made
    with this token, once, within the token TTL of the approval;
  - C{rotate()}: a new token (a new Secret) becomes current; the old one
    gets a persisted deletion deadline C{rotate_overlap} seconds later,
    so control planes can be reconfigured before it stops working. The
    answer says what must change in the Talos configurations.

Each change creates its Secret before its commit and deletes it if the
commit fails, as per-node tokens do (L{fleetd.kube.book}). Approvals and
rotations run one at a time, and each checks again inside its
transaction that the current token is still the one it decided from: two
at once never leave a second cluster token that nothing expires [K6].
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import DeferredLock
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.k8s.client import KubeClient
from fleetd.kube.book import TokenBook
from fleetd.kube.store import TokenRecord, insertToken, sealedToken, setDeleteAt
from fleetd.kube.tokens import CLUSTER_GROUP, Sealer, Token, mintToken, tokenSecret
from fleetd.refused import Refused
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner


class ClusterTokenError(Refused):
    """
    A refusal: a L{Refused} whose reason is its C{kind} (C{not-found},
    C{conflict}, C{invalid} or C{no-cluster}), whose line (C{str}) is its
    detail.
    """

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(kind, message)
        self.kind = kind

    def __str__(self) -> str:
        return self.detail


@dataclass(frozen=True)
class Request:
    id: str
    node: str
    reason: str
    requested_by: str
    requested_at: float
    state: str
    decided_by: str | None = None
    decided_at: float | None = None
    token_id: str | None = None
    csr: str | None = None

    def toJSON(self) -> dict[str, Any]:
        return {
            "request": self.id,
            "node": self.node,
            "reason": self.reason,
            "requested_by": self.requested_by,
            "requested_at": self.requested_at,
            "state": self.state,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at,
            "token_id": self.token_id,
            "csr": self.csr,
        }


_REQUEST_COLUMNS = (
    "id, node, reason, requested_by, requested_at, state, decided_by,"
    " decided_at, token_id, csr"
)


def _requests(
    db: Database, where: str = "", args: tuple[Any, ...] = ()
) -> list[Request]:
    rows = db.execute(
        f"SELECT {_REQUEST_COLUMNS} FROM cluster_token_requests {where}"  # noqa: S608
        " ORDER BY requested_at, id",
        args,
    ).fetchall()
    return [Request(*row) for row in rows]


def _current(db: Database) -> TokenRecord | None:
    row = db.execute(
        "SELECT token_id, kind, device, run, created_at, expires_at, approved_at,"
        " csr, delete_at, deleted_at FROM kube_tokens WHERE kind = 'cluster'"
        " AND deleted_at IS NULL AND delete_at IS NULL"
        " ORDER BY created_at DESC LIMIT 1"
    ).fetchone()
    return None if row is None else TokenRecord(*row)


class ClusterTokens:
    """Requests, approvals and rotation of the cluster-wide token."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        client: KubeClient,
        book: TokenBook,
        journal: AsyncJournal,
        runner: IRunner,
        sealer: Sealer,
        overlap: float,
        grantWindow: float,
    ) -> None:
        self.clock = clock
        self.client = client
        self.book = book
        self.journal = journal
        self.runner = runner
        self.sealer = sealer
        self.overlap = overlap
        self.grantWindow = grantWindow
        self._current: str | None = None
        self._grants: dict[str, tuple[str, float, str]] = {}  # request -> node, at, id
        # Grants the API was asked to use, by request: the CSR it was for
        # (kept once approved, until the record commits).
        self._claimed: dict[str, str] = {}
        # Approvals and rotations one at a time: each decides from the
        # current token, which the other may be replacing [K6].
        self._changing = DeferredLock()

    async def start(self) -> None:
        current = await self.runner.run(_current)
        self._current = None if current is None else current.id
        for request in await self.runner.run(
            lambda db: _requests(db, "WHERE state = 'approved'")
        ):
            if request.decided_at is not None and request.token_id is not None:
                self._grants[request.id] = (
                    request.node,
                    request.decided_at,
                    request.token_id,
                )

    # IClusterGrants (the approver)

    def clusterTokenId(self) -> str | None:
        return self._current

    def grantFor(self, node: str, tokenId: str) -> str | None:
        now = self.clock.seconds()
        for request, (grantNode, at, grantToken) in self._grants.items():
            if request in self._claimed:
                continue
            if grantNode == node and grantToken == tokenId:
                if now - at < self.grantWindow:
                    return request
        return None

    def claim(self, request: str, csr: str) -> None:
        """The approver is using C{request} for C{csr}: no other CSR gets it."""
        self._claimed[request] = csr

    def claimedBy(self, csr: str) -> str | None:
        """The claimed request whose use for C{csr} is not recorded yet."""
        for request, claimedFor in self._claimed.items():
            if claimedFor == csr:
                return request
        return None

    def unclaim(self, request: str) -> None:
        """The API did not approve: C{request} is free again."""
        self._claimed.pop(request, None)

    def usedIn(self, db: Database, request: str, csr: str) -> None:
        db.execute(
            "UPDATE cluster_token_requests SET state = 'used', csr = ? WHERE id = ?",
            (csr, request),
        )

    def usedCommitted(self, request: str) -> None:
        """L{usedIn} committed: the grant is gone [J1]."""
        self._grants.pop(request, None)
        self._claimed.pop(request, None)

    # The owner's commands

    async def pending(self) -> list[Request]:
        return await self.runner.run(
            lambda db: _requests(db, "WHERE state = 'pending'")
        )

    async def request(self, node: str, reason: str, actor: str) -> Request:
        request = Request(
            id=f"ctr-{secrets.token_hex(4)}",
            node=node,
            reason=reason,
            requested_by=actor,
            requested_at=self.clock.seconds(),
            state="pending",
        )

        def change(db: Database, journal: Recorder) -> None:
            db.execute(
                "INSERT INTO cluster_token_requests (id, node, reason, requested_by,"
                " requested_at, state) VALUES (?, ?, ?, ?, ?, ?)",
                (request.id, node, reason, actor, request.requested_at, "pending"),
            )
            journal(
                "cluster-token.requested",
                actor=actor,
                fields={"request": request.id, "node": node, "reason": reason},
            )

        await self.journal.change(change)
        return request

    async def approve(self, requestId: str, actor: str) -> tuple[Request, Token]:
        async with self._changing:
            return await self._approve(requestId, actor)

    async def _approve(self, requestId: str, actor: str) -> tuple[Request, Token]:
        found = await self.runner.run(
            lambda db: _requests(db, "WHERE id = ?", (requestId,))
        )
        if not found:
            raise ClusterTokenError(f"no request {requestId}", "not-found")
        if found[0].state != "pending":
            raise ClusterTokenError(
                f"request {requestId} is already {found[0].state}", "conflict"
            )
        created: Token | None = None
        token = await self._currentToken()
        if token is None:
            created = token = await self._create()
        now = self.clock.seconds()
        assert token is not None
        newToken = token

        def change(db: Database, journal: Recorder) -> None:
            cursor = db.execute(
                "UPDATE cluster_token_requests SET state = 'approved', decided_by = ?,"
                " decided_at = ?, token_id = ? WHERE id = ? AND state = 'pending'",
                (actor, now, newToken.id, requestId),
            )
            if cursor.rowcount != 1:
                raise ClusterTokenError(f"request {requestId} was decided", "conflict")
            current = _current(db)
            expected = None if created is not None else newToken.id
            if (None if current is None else current.id) != expected:
                raise ClusterTokenError(
                    "the cluster token changed meanwhile; approve again", "conflict"
                )
            if created is not None:
                self._insert(db, journal, created, actor)
            journal(
                "cluster-token.approved",
                actor=actor,
                fields={
                    "request": requestId,
                    "node": found[0].node,
                    "bootstrap_id": newToken.id,
                },
            )

        try:
            await self.journal.change(change)
        except Exception:
            if created is not None:
                await self.book.discardToken(created)
            raise
        if created is not None:
            self._started(created)
        self._grants[requestId] = (found[0].node, now, newToken.id)
        request = Request(
            **{
                **found[0].__dict__,
                "state": "approved",
                "decided_by": actor,
                "decided_at": now,
                "token_id": newToken.id,
            }
        )
        return request, newToken

    async def rotate(self, actor: str) -> tuple[Token, str | None, float | None]:
        """A new current token; the old one deleted C{overlap} seconds later."""
        async with self._changing:
            return await self._rotate(actor)

    async def _rotate(self, actor: str) -> tuple[Token, str | None, float | None]:
        old = self._current
        token = await self._create()
        deadline = self.clock.seconds() + self.overlap

        def change(db: Database, journal: Recorder) -> None:
            current = _current(db)
            if (None if current is None else current.id) != old:
                raise ClusterTokenError(
                    "the cluster token changed meanwhile; rotate again", "conflict"
                )
            if old is not None:
                setDeleteAt(db, old, deadline)
            self._insert(db, journal, token, actor)
            journal(
                "cluster-token.rotated",
                actor=actor,
                fields={
                    "bootstrap_id": token.id,
                    "old_bootstrap_id": old,
                    "old_deleted_at": None if old is None else deadline,
                },
            )

        try:
            await self.journal.change(change)
        except Exception:
            await self.book.discardToken(token)
            raise
        if old is not None:
            previous = self.book.get(old)
            if previous is not None:
                previous.machine.reschedule(deadline)
        self._started(token)
        return token, old, None if old is None else deadline

    # Helpers

    async def _currentToken(self) -> Token | None:
        current = self._current
        if current is None:
            return None
        sealed = await self.runner.run(lambda db: sealedToken(db, current))
        return None if sealed is None else self.sealer.open(current, sealed)

    async def _create(self) -> Token:
        token = mintToken()
        await self.client.createSecret(
            tokenSecret(
                token,
                description="fleetd: the cluster-wide bootstrap token",
                expiresAt=None,
                group=CLUSTER_GROUP,
            )
        )
        return token

    def _record(self, token: Token) -> TokenRecord:
        return TokenRecord(
            id=token.id,
            kind="cluster",
            device=None,
            run=None,
            created_at=self.clock.seconds(),
            expires_at=None,
        )

    def _insert(
        self, db: Database, journal: Recorder, token: Token, actor: str
    ) -> None:
        insertToken(db, self._record(token), self.sealer.seal(token))
        journal(
            "kube.token-issued",
            actor=actor,
            fields={"bootstrap_id": token.id, "kind": "cluster"},
        )

    def _started(self, token: Token) -> None:
        self._current = token.id
        self.book.add(self._record(token))
