"""
The disk keys' rows (C{kms_keys}, migration 15) and what a Seal or Unseal
reads besides them, inside the caller's transaction on the database
thread [J1].

A key is made for a device and a generation: the run whose delivery the
node's install fetched (C{""} when fleetd delivered none). Destroying a
key sets its material to NULL and keeps the row as the record of when
and why; the connection deletes securely (C{PRAGMA secure_delete}), so
the material's bytes are zeroed in the database file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fleetd.store.db import Database

_SELECT = (
    "SELECT id, device, uuid, generation, wrapped, created_at, destroyed_at,"
    " destroyed_why FROM kms_keys"
)
DELIVERED = "run.delivered"
# The entries that begin or end a device's life as fleetd sees it: a
# provision (refused while decommissioning) begins one, a delivery does not
# (the releaser may record one served before a retirement after it).
_LIFE = ("device.added", "run.provisioned", "device.retired")


@dataclass(frozen=True)
class KeyRow:
    id: str
    device: str
    uuid: str
    generation: str
    wrapped: bytes | None  # None: destroyed
    created_at: float
    destroyed_at: float | None
    destroyed_why: str | None = None

    @property
    def live(self) -> bool:
        return self.wrapped is not None


def _row(row: tuple[Any, ...]) -> KeyRow:
    id_, device, uuid, generation, wrapped, created, destroyed, why = row
    return KeyRow(
        str(id_),
        str(device),
        str(uuid),
        str(generation),
        None if wrapped is None else bytes(wrapped),
        float(created),
        None if destroyed is None else float(destroyed),
        None if why is None else str(why),
    )


def secureDelete(db: Database) -> None:
    """Zero what is deleted or overwritten, where that costs no extra I/O."""
    db.execute("PRAGMA secure_delete = FAST")


def keyById(db: Database, keyId: str) -> KeyRow | None:
    row = db.execute(f"{_SELECT} WHERE id = ?", (keyId,))
    found = row.fetchone()
    return None if found is None else _row(found)


def liveKeys(db: Database, device: str) -> list[KeyRow]:
    """C{device}'s keys that still have their material, oldest first."""
    rows = db.execute(
        f"{_SELECT} WHERE device = ? AND wrapped IS NOT NULL ORDER BY created_at, id",
        (device,),
    ).fetchall()
    return [_row(r) for r in rows]


def keysOf(db: Database, device: str) -> list[KeyRow]:
    """Every key row of C{device}, oldest first."""
    rows = db.execute(
        f"{_SELECT} WHERE device = ? ORDER BY created_at, id",
        (device,),
    ).fetchall()
    return [_row(r) for r in rows]


def insertKey(
    db: Database,
    *,
    keyId: str,
    device: str,
    uuid: str,
    generation: str,
    wrapped: bytes,
    at: float,
) -> None:
    db.execute(
        "INSERT INTO kms_keys (id, device, uuid, generation, wrapped, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (keyId, device, uuid, generation, wrapped, at),
    )


def destroyKey(db: Database, keyId: str, at: float, why: str) -> None:
    """The key's material goes; its row stays as the record."""
    db.execute(
        "UPDATE kms_keys SET wrapped = NULL, destroyed_at = ?, destroyed_why = ?"
        " WHERE id = ? AND wrapped IS NOT NULL",
        (at, why, keyId),
    )


def devicesWithLiveKeys(db: Database) -> list[str]:
    rows = db.execute(
        "SELECT DISTINCT device FROM kms_keys WHERE wrapped IS NOT NULL ORDER BY device"
    ).fetchall()
    return [str(device) for (device,) in rows]


def lastDelivery(db: Database, device: str) -> tuple[str, str] | None:
    """
    C{(run, peer)} of C{device}'s last delivery, from the journal's
    C{run.delivered} entry (written by the runs' releaser with either
    inventory back end): the address the node fetched its configuration
    from, and the run that configuration belongs to.
    """
    row = db.execute(
        "SELECT run, fields FROM journal WHERE device = ? AND event = ?"
        " ORDER BY seq DESC LIMIT 1",
        (device, DELIVERED),
    ).fetchone()
    if row is None:
        return None
    run, text = row
    try:
        fields = json.loads(text)
    except ValueError:
        return None
    peer = fields.get("peer") if isinstance(fields, dict) else None
    if not isinstance(peer, str) or run is None:
        return None
    return str(run), peer


def retiredSince(db: Database, device: str) -> bool:
    """
    Whether C{device}'s latest entry among its addition, its provisions and
    its retirement is the retirement: read inside a Seal's or Unseal's own
    transaction, so a retirement that commits after the call checked the
    inventory's status is still seen, and a key is never made for a device
    retired meanwhile [E3]. A device added or provisioned again since (a
    new life after C{forget-identity}) is not retired.
    """
    row = db.execute(
        "SELECT event FROM journal WHERE device = ? AND event IN (?, ?, ?)"
        " ORDER BY seq DESC LIMIT 1",
        (device, *_LIFE),
    ).fetchone()
    return row is not None and row[0] == _LIFE[2]


def liveKeysAmong(db: Database, ids: frozenset[str]) -> list[KeyRow]:
    """The live keys whose id is one of C{ids} (the destruction record's)."""
    rows = db.execute(f"{_SELECT} WHERE wrapped IS NOT NULL ORDER BY device, id")
    return [_row(r) for r in rows if str(r[0]) in ids]


def destroyedKeysNotIn(db: Database, ids: frozenset[str]) -> list[KeyRow]:
    """The destroyed keys whose id is not one of C{ids}, oldest first."""
    rows = db.execute(f"{_SELECT} WHERE wrapped IS NULL ORDER BY destroyed_at, id")
    return [_row(r) for r in rows if str(r[0]) not in ids]


def keyStates(db: Database) -> dict[str, str]:
    """Each device with keys: C{"sealed"} (a live one) or C{"destroyed"}."""
    rows = db.execute(
        "SELECT device, count(wrapped) FROM kms_keys GROUP BY device"
    ).fetchall()
    return {str(d): "sealed" if live else "destroyed" for d, live in rows}


def lastKey(db: Database, device: str) -> KeyRow | None:
    """C{device}'s live key, else the key it lost last; L{None}: no key."""
    row = db.execute(
        f"{_SELECT} WHERE device = ? ORDER BY wrapped IS NOT NULL DESC,"
        " coalesce(destroyed_at, created_at) DESC, created_at DESC LIMIT 1",
        (device,),
    ).fetchone()
    return None if row is None else _row(row)


def keyState(db: Database, device: str) -> str:
    """C{device}'s disk key as C{fleetctl status} will say it: C{"sealed"}
    (a live key), C{"destroyed"} (keys, none live) or C{"none"}."""
    row = db.execute(
        "SELECT count(*), count(wrapped) FROM kms_keys WHERE device = ?", (device,)
    ).fetchone()
    total, live = int(row[0]), int(row[1])
    return "sealed" if live else "destroyed" if total else "none"
