"""
Persistent Kubernetes credential state (schema migrations 9 and 10 in
L{fleetd.store.migrations}).

Migration 9: C{kube_tokens} (every token fleetd created, by id: kind,
device and run, expiry, approval, the persisted deletion deadline [K4],
deletion) and C{kube_kubelets} (per device: the kubelet client
certificate's approvals and notAfter, retirement [R1]).
Migration 10: the cluster-wide token's sealed value and the requests to
use it [K5][K6]. No table holds a token in the clear.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fleetd.store.db import Database


@dataclass(frozen=True)
class TokenRecord:
    """One token fleetd created, as stored (never its secret part)."""

    id: str
    kind: str
    device: str | None
    run: str | None
    created_at: float
    expires_at: float | None
    approved_at: float | None = None
    csr: str | None = None
    delete_at: float | None = None
    deleted_at: float | None = None

    def toJSON(self) -> dict[str, Any]:
        return {
            "token_id": self.id,
            "kind": self.kind,
            "run": self.run,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "approved_at": self.approved_at,
            "csr": self.csr,
            "delete_at": self.delete_at,
            "deleted_at": self.deleted_at,
        }


@dataclass(frozen=True)
class KubeletRecord:
    """What fleetd knows of a device's kubelet client certificate."""

    device: str
    first_approved_at: float | None
    last_csr: str | None
    last_approved_at: float | None
    not_after: float | None
    retired_at: float | None

    def toJSON(self) -> dict[str, Any]:
        return {
            "first_approved_at": self.first_approved_at,
            "last_csr": self.last_csr,
            "last_approved_at": self.last_approved_at,
            "not_after": self.not_after,
            "retired_at": self.retired_at,
        }


_TOKEN_COLUMNS = (
    "token_id, kind, device, run, created_at, expires_at, approved_at, csr,"  # noqa: S105
    " delete_at, deleted_at"
)


def _token(row: Any) -> TokenRecord:
    return TokenRecord(*row)


def insertToken(db: Database, record: TokenRecord, sealed: bytes | None = None) -> None:
    db.execute(
        f"INSERT INTO kube_tokens ({_TOKEN_COLUMNS}, sealed)"  # noqa: S608
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.id,
            record.kind,
            record.device,
            record.run,
            record.created_at,
            record.expires_at,
            record.approved_at,
            record.csr,
            record.delete_at,
            record.deleted_at,
            sealed,
        ),
    )


def liveTokens(db: Database) -> list[TokenRecord]:
    """Every token not yet deleted, oldest first."""
    rows = db.execute(
        f"SELECT {_TOKEN_COLUMNS} FROM kube_tokens WHERE deleted_at IS NULL"  # noqa: S608
        " ORDER BY created_at, token_id"
    ).fetchall()
    return [_token(row) for row in rows]


def getToken(db: Database, tokenId: str) -> TokenRecord | None:
    row = db.execute(
        f"SELECT {_TOKEN_COLUMNS} FROM kube_tokens WHERE token_id = ?",  # noqa: S608
        (tokenId,),
    ).fetchone()
    return None if row is None else _token(row)


def latestNodeToken(db: Database, device: str) -> TokenRecord | None:
    row = db.execute(
        f"SELECT {_TOKEN_COLUMNS} FROM kube_tokens"  # noqa: S608
        " WHERE kind = 'node' AND device = ?"
        " ORDER BY created_at DESC, rowid DESC LIMIT 1",
        (device,),
    ).fetchone()
    return None if row is None else _token(row)


def sealedToken(db: Database, tokenId: str) -> bytes | None:
    row = db.execute(
        "SELECT sealed FROM kube_tokens WHERE token_id = ?", (tokenId,)
    ).fetchone()
    return None if row is None else row[0]


def setDeleteAt(db: Database, tokenId: str, at: float) -> None:
    db.execute(
        "UPDATE kube_tokens SET delete_at = ?"
        " WHERE token_id = ? AND deleted_at IS NULL",
        (at, tokenId),
    )


def markApproved(
    db: Database, token: TokenRecord, at: float, csr: str, deleteAt: float
) -> TokenRecord:
    db.execute(
        "UPDATE kube_tokens SET approved_at = ?, csr = ?, delete_at = ?"
        " WHERE token_id = ?",
        (at, csr, deleteAt, token.id),
    )
    return replace(token, approved_at=at, csr=csr, delete_at=deleteAt)


def markIntent(db: Database, tokenId: str, csr: str) -> bool:
    """
    Bind a token not yet approved to C{csr} before the API is asked to
    approve it [K2]: C{csr} with no C{approved_at} is the intent. L{False}
    when the token is approved already or bound to another CSR.
    """
    cursor = db.execute(
        "UPDATE kube_tokens SET csr = ? WHERE token_id = ?"
        " AND approved_at IS NULL AND (csr IS NULL OR csr = ?)",
        (csr, tokenId, csr),
    )
    return cursor.rowcount > 0


def markDeleted(db: Database, tokenId: str, at: float) -> None:
    db.execute(
        "UPDATE kube_tokens SET deleted_at = ?, sealed = NULL WHERE token_id = ?",
        (at, tokenId),
    )


def kubelet(db: Database, device: str) -> KubeletRecord | None:
    row = db.execute(
        "SELECT device, first_approved_at, last_csr, last_approved_at, not_after,"
        " retired_at FROM kube_kubelets WHERE device = ?",
        (device,),
    ).fetchone()
    return None if row is None else KubeletRecord(*row)


def noteKubeletApproved(db: Database, device: str, csr: str, at: float) -> None:
    db.execute(
        "INSERT INTO kube_kubelets (device, first_approved_at, last_csr,"
        " last_approved_at) VALUES (?, ?, ?, ?) ON CONFLICT (device) DO UPDATE SET"
        " first_approved_at = coalesce(first_approved_at, excluded.first_approved_at),"
        " last_csr = excluded.last_csr, last_approved_at = excluded.last_approved_at",
        (device, at, csr, at),
    )


def noteKubeletFirst(db: Database, device: str, csr: str, at: float) -> None:
    """A new first certificate (a new provision): retirement no longer applies."""
    db.execute(
        "INSERT INTO kube_kubelets (device, first_approved_at, last_csr,"
        " last_approved_at) VALUES (?, ?, ?, ?) ON CONFLICT (device) DO UPDATE SET"
        " first_approved_at = excluded.first_approved_at,"
        " last_csr = excluded.last_csr, last_approved_at = excluded.last_approved_at,"
        " not_after = NULL, retired_at = NULL",
        (device, at, csr, at),
    )


def noteNotAfter(db: Database, device: str, csr: str, notAfter: float) -> bool:
    """Record the issued certificate's notAfter; L{False} if already known."""
    cursor = db.execute(
        "UPDATE kube_kubelets SET not_after = ? WHERE device = ? AND last_csr = ?"
        " AND (not_after IS NULL OR not_after != ?)",
        (notAfter, device, csr, notAfter),
    )
    return cursor.rowcount > 0


def noteRetired(db: Database, device: str, at: float) -> None:
    db.execute(
        "INSERT INTO kube_kubelets (device, retired_at) VALUES (?, ?)"
        " ON CONFLICT (device) DO UPDATE SET retired_at = excluded.retired_at",
        (device, at),
    )
