"""
The NetBox outbox: status changes and releases waiting to be written to
NetBox, in fleetd's own database (migration 11).

A change to the NetBox inventory commits locally, together with its
journal entries, as one row here [J1]; L{fleetd.netbox.push} writes it
to NetBox afterwards. So NetBox being down or hung delays the push, never
the change (a delivery in particular), and the release row itself is the
durable served-config record: a spore reboot finds the run consumed
whether or not NetBox has heard of it yet.

Everything here runs on the database thread, inside the caller's
transaction.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fleetd.inventory.model import DeviceStatus, InventoryError, ServedRecord
from fleetd.netbox.devices import CF_RELEASE, RemoteDevice
from fleetd.store.db import Database

PENDING = "pending"
DONE = "done"  # NetBox holds what the row asked for
SKIPPED = "skipped"  # left alone: the device's status in NetBox overrode it
REFUSED = "refused"  # NetBox refused it (no such device, 400): needs a human

_COLUMNS = "id, device, status, run, served_at, digest"


@dataclass(frozen=True)
class OutboxEntry:
    """One change waiting for NetBox: a status, or a release (run set)."""

    id: int
    device: str
    status: DeviceStatus
    run: str | None = None
    served_at: float | None = None
    digest: str | None = None

    def release(self) -> dict[str, Any] | None:
        """The C{fleetd_release} value: never the body, never the code."""
        if self.run is None:
            return None
        at = datetime.fromtimestamp(self.served_at or 0.0, UTC)
        return {
            "run": self.run,
            "served_at": at.isoformat().replace("+00:00", "Z"),
            "digest": self.digest,
        }


def _entry(row: sqlite3.Row | tuple[Any, ...]) -> OutboxEntry:
    ident, device, status, run, servedAt, digest = row
    return OutboxEntry(
        int(ident), str(device), DeviceStatus(status), run, servedAt, digest
    )


def enqueueStatus(db: Database, device: str, status: DeviceStatus, at: float) -> None:
    db.execute(
        "INSERT INTO netbox_outbox (device, status, created_at) VALUES (?, ?, ?)",
        (device, status.value, at),
    )


def localStatus(db: Database, device: str) -> DeviceStatus | None:
    """
    The status fleetd last knew for C{device}: its last change still
    waiting for NetBox, else NetBox's last answer (the device cache);
    None when fleetd knows neither.
    """
    row = db.execute(
        "SELECT status FROM netbox_outbox WHERE device = ? AND state = ?"
        " ORDER BY id DESC LIMIT 1",
        (device, PENDING),
    ).fetchone()
    if row is not None:
        return DeviceStatus(row[0])
    row = db.execute(
        "SELECT device FROM netbox_devices WHERE name = ?", (device,)
    ).fetchone()
    if row is None:
        return None
    try:
        return DeviceStatus(json.loads(row[0])["status"])
    except (ValueError, KeyError, TypeError):
        return None


def enqueueRelease(
    db: Database,
    record: ServedRecord,
    digest: str | None,
    at: float,
    status: DeviceStatus = DeviceStatus.STAGED,
) -> bool:
    """
    Queue C{record}'s release, asking for C{status} (C{staged}, or the
    status the device keeps when it is no longer planned); False when
    this run was already released for this device (nothing to do).

    @raise InventoryError: (C{"duplicate"}) the run was released for another device.
    """
    row = db.execute(
        "SELECT device FROM netbox_outbox WHERE run = ?", (record.run,)
    ).fetchone()
    if row is not None:
        if row[0] == record.device:
            return False
        raise InventoryError(
            f"run {record.run} was released for device {row[0]}", "duplicate"
        )
    db.execute(
        "INSERT INTO netbox_outbox"
        " (device, status, run, served_at, peer, digest, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            record.device,
            status.value,
            record.run,
            record.served_at,
            record.peer,
            digest,
            at,
        ),
    )
    return True


def nextPending(db: Database) -> OutboxEntry | None:
    row = db.execute(
        f"SELECT {_COLUMNS} FROM netbox_outbox WHERE state = ?"  # noqa: S608
        " ORDER BY id LIMIT 1",
        (PENDING,),
    ).fetchone()
    return None if row is None else _entry(row)


def settle(db: Database, ident: int, state: str, outcome: str, attempts: int) -> None:
    """
    Record how an entry settled. A settled status change goes (its journal
    entries are its record); a release stays: it is the served record.
    """
    db.execute(
        "UPDATE netbox_outbox SET state = ?, outcome = ?, attempts = attempts + ?"
        " WHERE id = ? AND state = ?",
        (state, outcome, attempts, ident, PENDING),
    )
    db.execute("DELETE FROM netbox_outbox WHERE id = ? AND run IS NULL", (ident,))


def pendingStatuses(db: Database) -> dict[str, DeviceStatus]:
    """Each device's last status still waiting for NetBox."""
    rows = db.execute(
        "SELECT device, status FROM netbox_outbox WHERE state = ? ORDER BY id",
        (PENDING,),
    ).fetchall()
    return {device: DeviceStatus(status) for device, status in rows}


def pendingCount(db: Database) -> int:
    (count,) = db.execute(
        "SELECT count(*) FROM netbox_outbox WHERE state = ?", (PENDING,)
    ).fetchone()
    return int(count)


def releasedRuns(db: Database) -> set[str]:
    """Every run released, pushed to NetBox or not yet."""
    rows = db.execute("SELECT run FROM netbox_outbox WHERE run IS NOT NULL")
    return {run for (run,) in rows.fetchall()}


def desiredActions(db: Database) -> dict[str, str]:
    rows = db.execute(
        "SELECT device, desired_action FROM netbox_local"
        " WHERE desired_action IS NOT NULL"
    ).fetchall()
    return {device: action for device, action in rows}


def setDesiredAction(db: Database, device: str, action: str | None) -> None:
    db.execute(
        "INSERT INTO netbox_local (device, desired_action) VALUES (?, ?)"
        " ON CONFLICT (device) DO UPDATE SET desired_action = excluded.desired_action",
        (device, action),
    )


@dataclass(frozen=True)
class Decision:
    """What to PATCH (maybe nothing) and why a status was left alone."""

    body: dict[str, Any]
    leftAlone: str | None = None


def decide(entry: OutboxEntry, current: RemoteDevice) -> Decision:
    """
    Decide, from the device as NetBox has it now, what this entry still
    needs. fleetd writes planned, staged, active and decommissioning; a
    status a site added is left alone, a decommissioning device stays so
    (only a retirement writes it), and a release moves only a C{planned}
    device to C{staged}: an operator's edit since the change wins.
    """
    body: dict[str, Any] = {}
    release = entry.release()
    if release is not None and current.custom_fields.get(CF_RELEASE) != release:
        body["custom_fields"] = {CF_RELEASE: release}
    target = entry.status.value
    now = current.status
    leftAlone: str | None = None
    known = {s.value for s in DeviceStatus}
    if now == target:
        pass
    elif now not in known:
        leftAlone = f"status {now} is the site's own; fleetd leaves it alone"
    elif now == DeviceStatus.DECOMMISSIONING and target != now:
        leftAlone = "the device is decommissioning; fleetd leaves it so"
    elif release is not None and now != DeviceStatus.PLANNED:
        leftAlone = f"the device is {now}, not planned; the release leaves it so"
    else:
        body["status"] = target
    return Decision(body, leftAlone)


def cacheDevices(db: Database, devices: list[dict[str, Any]], replaceAll: bool) -> None:
    """Keep the devices NetBox last described (their L{Device.toJSON})."""
    with db.transaction() as conn:
        if replaceAll:
            conn.execute("DELETE FROM netbox_devices")
        conn.executemany(
            "INSERT INTO netbox_devices (name, device) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET device = excluded.device",
            [(d["name"], json.dumps(d, sort_keys=True)) for d in devices],
        )


def cachedDevices(db: Database) -> list[dict[str, Any]]:
    rows = db.execute("SELECT device FROM netbox_devices ORDER BY name").fetchall()
    return [json.loads(row) for (row,) in rows]
