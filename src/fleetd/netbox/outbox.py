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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fleetd.inventory.model import (
    DeviceStatus,
    ServedRecord,
    releasedBefore,
)
from fleetd.netbox.devices import CF_RELEASE, RemoteDevice
from fleetd.store.db import Database

PENDING = "pending"
DONE = "done"  # NetBox holds what the row asked for
SKIPPED = "skipped"  # left alone: the device's status in NetBox overrode it
REFUSED = "refused"  # NetBox refused it (no such device, 400): needs a human

_COLUMNS = "id, device, status, run, served_at, digest"
# NetBox's own statuses (anything else is a site's addition).
_KNOWN = frozenset(s.value for s in DeviceStatus)
# Statuses a device keeps over a release, when fleetd itself set them first.
_KEPT = frozenset({DeviceStatus.ACTIVE, DeviceStatus.DECOMMISSIONING})


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
    waiting for NetBox, else NetBox's last answer (the device cache, as
    the last list or the last push found it); None when fleetd knows
    neither.
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
    if releasedBefore(record.run, record.device, None if row is None else row[0]):
        return False
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


def settle(
    db: Database,
    ident: int,
    state: str,
    outcome: str,
    attempts: int,
    found: str | None = None,
) -> None:
    """
    Record how an entry settled, and C{found}, the status NetBox holds
    after it, in the device cache (newer than the last list). A done
    entry records what NetBox then holds (a release may have moved a
    planned device to staged whatever its row said): the device's newest
    done entry is the status fleetd itself last wrote (L{lastWritten}).
    Older settled status changes go (their journal entries are their
    record); a release stays: it is the served record.
    """
    device = db.execute(
        "SELECT device FROM netbox_outbox WHERE id = ? AND state = ?",
        (ident, PENDING),
    ).fetchone()
    if device is None:
        return
    db.execute(
        "UPDATE netbox_outbox SET state = ?, outcome = ?, attempts = attempts + ?"
        " WHERE id = ?",
        (state, outcome, attempts, ident),
    )
    if state == DONE and found in _KNOWN:
        db.execute("UPDATE netbox_outbox SET status = ? WHERE id = ?", (found, ident))
    # Keep the device's newest done status row (it may be its last write).
    db.execute(
        "DELETE FROM netbox_outbox WHERE device = ? AND run IS NULL AND state != ?"
        " AND (state != ? OR id < (SELECT max(id) FROM netbox_outbox"
        "  WHERE device = ? AND state = ?))",
        (device[0], PENDING, DONE, device[0], DONE),
    )
    if found:
        _cacheStatus(db, device[0], found)


def _cacheStatus(db: Database, name: str, status: str) -> None:
    """The cached device's status as NetBox last answered it (if cached)."""
    row = db.execute(
        "SELECT device FROM netbox_devices WHERE name = ?", (name,)
    ).fetchone()
    if row is None or status not in _KNOWN:
        return
    cached = json.loads(row[0])
    if isinstance(cached, dict) and cached.get("status") != status:
        cached["status"] = status
        db.execute(
            "UPDATE netbox_devices SET device = ? WHERE name = ?",
            (json.dumps(cached, sort_keys=True), name),
        )


def lastWritten(db: Database, device: str) -> DeviceStatus | None:
    """
    The status fleetd itself last wrote to NetBox for C{device} (or found
    already so when it came to write it): its newest entry settled done.
    None when fleetd never wrote one.
    """
    row = db.execute(
        "SELECT status FROM netbox_outbox WHERE device = ? AND state = ?"
        " ORDER BY id DESC LIMIT 1",
        (device, DONE),
    ).fetchone()
    return None if row is None else DeviceStatus(row[0])


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


_NEWEST_SERVED = (
    "SELECT device, max(served_at) FROM netbox_outbox WHERE run IS NOT NULL"
    " AND device IN ({}) GROUP BY device"
)


def servedAt(db: Database, names: Sequence[str]) -> dict[str, float]:
    """The newest C{served_at} released for each of C{names} that has one."""
    found: dict[str, float] = {}
    keys = sorted(set(names))
    for i in range(0, len(keys), 500):  # host parameters per IN (...) list
        chunk = keys[i : i + 500]
        marks = ", ".join("?" * len(chunk))
        rows = db.execute(_NEWEST_SERVED.format(marks), tuple(chunk)).fetchall()
        found.update((device, float(at)) for device, at in rows)
    return found


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


def decide(
    entry: OutboxEntry,
    current: RemoteDevice,
    *,
    guarded: bool = True,
    written: DeviceStatus | None = None,
) -> Decision:
    """
    Decide, from the device as NetBox has it now (its detail, read right
    before the write), what this entry still needs. fleetd writes
    planned, staged, active and decommissioning; a status a site added is
    left alone, a decommissioning device stays so (only a retirement
    writes it), and a release moves only a C{planned} device to
    C{staged}, whatever status its row carries (what fleetd knew when the
    delivery committed, shown to readers until the push): an operator's
    edit since the change wins, and a release never writes an older status.

    @param guarded: the PATCH carries C{If-Match} (NetBox sent an ETag).
        Without one an operator's edit could land unseen between read and
        write, so C{status} is written only over the status fleetd itself
        last wrote (C{written}); a device fleetd never wrote a status to
        takes a provision's C{planned}, and a retirement is always written.
    """
    body: dict[str, Any] = {}
    release = entry.release()
    if release is not None and current.custom_fields.get(CF_RELEASE) != release:
        body["custom_fields"] = {CF_RELEASE: release}
    now = current.status
    target = entry.status
    if release is not None:
        if now == DeviceStatus.STAGED or (
            entry.status in _KEPT and now == entry.status
        ):
            return Decision(body)  # staged already, or the status fleetd kept
        target = DeviceStatus.STAGED
    leftAlone: str | None = None
    if now == target:
        pass
    elif now not in _KNOWN:
        leftAlone = f"status {now} is the site's own; fleetd leaves it alone"
    elif now == DeviceStatus.DECOMMISSIONING:
        leftAlone = "the device is decommissioning; fleetd leaves it so"
    elif release is not None and now != DeviceStatus.PLANNED:
        leftAlone = f"the device is {now}, not planned; the release leaves it so"
    elif not guarded and not _unguarded(target, now, written):
        leftAlone = (
            f"NetBox sent no ETag and status {now} was not set by fleetd;"
            " fleetd does not write over it"
        )
    else:
        body["status"] = target.value
    return Decision(body, leftAlone)


def _unguarded(target: DeviceStatus, now: str, written: DeviceStatus | None) -> bool:
    """Whether C{target} may be written over C{now} without C{If-Match}."""
    if target is DeviceStatus.DECOMMISSIONING:
        return True  # a retirement: the owner's order, never lost
    if written is None:  # fleetd never wrote one: a provision decided on it
        return target is DeviceStatus.PLANNED
    return now == written.value


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
