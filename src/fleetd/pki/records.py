"""
LDevID records [T4]: every certificate fleetd issued (serial, issuer,
notAfter) and each node's legacy cut-over, persisted in migration 7
(L{fleetd.store.migrations.MIGRATIONS}).

A node's I{current} LDevID is the last one fleetd issued it; once it has
one, certificates from the legacy issuers are refused for that node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetd.store.db import Database


@dataclass(frozen=True)
class LDevIDRecord:
    cert_serial: str
    chassis: str
    device: str
    issuer: str
    not_after: float
    issued_at: float
    how: str
    ek_sha256: str | None = None

    def toJSON(self) -> dict[str, Any]:
        return {
            "cert_serial": self.cert_serial,
            "serial": self.chassis,
            "device": self.device,
            "issuer": self.issuer,
            "not_after": self.not_after,
            "issued_at": self.issued_at,
            "how": self.how,
        }


_SELECT = (
    "SELECT cert_serial, chassis, device, issuer, not_after, issued_at, how,"
    " ek_sha256 FROM ldevids"
)
_INSERT = (
    "INSERT INTO ldevids (cert_serial, chassis, device, issuer, not_after,"
    " issued_at, how, ek_sha256, current) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)"
)


def storeIssued(db: Database, record: LDevIDRecord) -> LDevIDRecord | None:
    """Insert C{record} as its node's current LDevID; return the one it replaces."""
    row = db.execute(
        _SELECT + " WHERE chassis = ? AND current = 1",
        (record.chassis,),
    ).fetchone()
    db.execute("UPDATE ldevids SET current = 0 WHERE chassis = ?", (record.chassis,))
    db.execute(
        _INSERT,
        (
            record.cert_serial,
            record.chassis,
            record.device,
            record.issuer,
            record.not_after,
            record.issued_at,
            record.how,
            record.ek_sha256,
        ),
    )
    return None if row is None else LDevIDRecord(*row)


def storeCutover(
    db: Database, chassis: str, at: float, issuer: str, serial: str
) -> None:
    db.execute(
        "INSERT OR IGNORE INTO ldevid_cutovers (chassis, at, from_issuer, from_serial)"
        " VALUES (?, ?, ?, ?)",
        (chassis, at, issuer, serial),
    )


def loadCurrent(db: Database) -> list[LDevIDRecord]:
    rows = db.execute(_SELECT + " WHERE current = 1").fetchall()
    return [LDevIDRecord(*row) for row in rows]
