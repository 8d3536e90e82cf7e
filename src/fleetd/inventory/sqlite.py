"""
The embedded inventory: L{IInventory} over fleetd's SQLite database.

Tables come from migration 2 (L{fleetd.store.migrations.MIGRATIONS}): C{devices},
C{device_macs} (one row per MAC, unique across the fleet) and
C{served_records}.  All work runs through an L{IRunner}, so on the
database thread in the daemon and inline in tests; every write is one
transaction, committed (C{synchronous=FULL}) before the Deferred fires.
The device rows' SQL is in L{fleetd.inventory.sqlite_rows}; the served
records' is here.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger

from fleetd.inventory.failures import storeFailure
from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    Identities,
    InventoryError,
    ServedRecord,
    releasedBefore,
    validateName,
    validateSerial,
    validateServedRecord,
    validateStatus,
    validateToken,
)
from fleetd.inventory.sqlite_rows import (
    DeviceListing,
    forgetDeviceIdentity,
    insertDevice,
    normalised,
    readDevice,
    readDeviceBySerial,
    transitionDevice,
    updateDevice,
)
from fleetd.store.db import Database
from fleetd.store.entries import Entry
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

_T = TypeVar("_T")

log = Logger()


def _release(conn: sqlite3.Connection, record: ServedRecord) -> bool:
    row = conn.execute(
        "SELECT device FROM served_records WHERE run = ?", (record.run,)
    ).fetchone()
    if releasedBefore(record.run, record.device, None if row is None else row[0]):
        return False
    # Only a planned device becomes staged: a retirement or an approval
    # that committed since the delivery keeps its status [J1].
    moved = transitionDevice(
        conn, record.device, (DeviceStatus.PLANNED,), DeviceStatus.STAGED
    )
    conn.execute(
        "INSERT INTO served_records (run, device, served_at, peer) VALUES (?, ?, ?, ?)",
        (record.run, record.device, record.served_at, record.peer),
    )
    return moved


_CHUNK = 500  # host parameters per IN (...) list
_NEWEST_SERVED = (
    "SELECT device, max(served_at) FROM served_records WHERE device IN ({})"
    " GROUP BY device"
)


def _pairs(conn: sqlite3.Connection, sql: str, keys: list[str]) -> dict[str, str]:
    """C{sql} (two columns, one C{IN ({})} list) for C{keys}, as a dict."""
    found: dict[str, str] = {}
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        found.update(conn.execute(sql.format(marks), tuple(chunk)).fetchall())
    return found


def _releaseMany(
    conn: sqlite3.Connection, records: Sequence[ServedRecord]
) -> list[bool | InventoryError]:
    """
    L{_release} for each of C{records} in order, with two reads and two
    writes for all of them: the same outcomes, a refusal per record
    instead of an exception, and nothing written for a refused one.
    """
    checked: list[ServedRecord | InventoryError] = []
    for record in records:
        try:
            checked.append(validateServedRecord(record))
        except InventoryError as e:
            checked.append(e)
    valid = [c for c in checked if isinstance(c, ServedRecord)]
    served = _pairs(
        conn,
        "SELECT run, device FROM served_records WHERE run IN ({})",
        [c.run for c in valid],
    )
    statuses = _pairs(
        conn,
        "SELECT name, status FROM devices WHERE name IN ({})",
        sorted({c.device for c in valid}),
    )
    planned, staged = DeviceStatus.PLANNED.value, DeviceStatus.STAGED.value
    outcomes: list[bool | InventoryError] = []
    moves: list[tuple[str, str]] = []
    inserts: list[tuple[str, str, float, str]] = []
    for c in checked:
        if isinstance(c, InventoryError):
            outcomes.append(c)
            continue
        owner = served.get(c.run)
        if owner is not None:
            try:  # released before, to this device: as _release
                outcomes.append(not releasedBefore(c.run, c.device, owner))
            except InventoryError as e:
                outcomes.append(e)
            continue
        status = statuses.get(c.device)
        if status is None:
            outcomes.append(InventoryError(f"no device named {c.device}", "not-found"))
            continue
        # Only a planned device becomes staged, as in _release.
        moved = status == planned
        if moved:
            moves.append((staged, c.device))
            statuses[c.device] = staged
        inserts.append((c.run, c.device, c.served_at, c.peer))
        served[c.run] = c.device
        outcomes.append(moved)
    conn.executemany(
        "UPDATE devices SET status = ? WHERE name = ? AND status = 'planned'", moves
    )
    conn.executemany(
        "INSERT INTO served_records (run, device, served_at, peer) VALUES (?, ?, ?, ?)",
        inserts,
    )
    return outcomes


class SQLiteInventory:
    """
    L{fleetd.inventory.model.IInventory} in fleetd's own database: every
    change and its journal entries are one transaction [J1].
    """

    def __init__(self, runner: IRunner, journal: AsyncJournal) -> None:
        self._runner = runner
        self._journal = journal
        self._listing = DeviceListing()

    def _run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        d = self._runner.run(f)
        d.addErrback(storeFailure)
        return d

    def _change(
        self, f: Callable[[Database], _T], journal: Sequence[Entry]
    ) -> Deferred[_T]:
        entries = list(journal)

        def change(db: Database, record: Recorder) -> _T:
            result = f(db)
            for entry in entries:
                record.add(entry)
            return result

        d = self._journal.change(change)
        d.addErrback(storeFailure)
        return d

    def add(self, device: Device, *, journal: Sequence[Entry]) -> Deferred[Device]:
        try:
            checked = normalised(device)
        except InventoryError:
            return fail()

        def add(db: Database) -> Device:
            with db.transaction() as conn:
                insertDevice(conn, checked)
            return checked

        return self._change(add, journal)

    def get(self, name: str) -> Deferred[Device | None]:
        try:
            key = validateName(name)
        except InventoryError:
            return succeed(None)

        def get(db: Database) -> Device | None:
            with db.transaction(write=False) as conn:
                return readDevice(conn, key)

        return self._run(get)

    def list(self) -> Deferred[list[Device]]:
        def readAll(db: Database) -> list[Device]:
            outermost = not db.connection.in_transaction
            with db.transaction(write=False) as conn:
                return self._listing.read(conn, keep=outermost)

        return self._run(readAll)

    def identities(self) -> Deferred[Identities]:
        def read(db: Database) -> Identities:
            with db.transaction(write=False) as conn:
                return conn.execute("SELECT name, uuid, serial FROM devices").fetchall()

        return self._run(read)

    def bySerial(self, serial: str) -> Deferred[Device | None]:
        try:
            key = validateSerial(serial)
        except InventoryError:
            return succeed(None)

        def find(db: Database) -> Device | None:
            with db.transaction(write=False) as conn:
                return readDeviceBySerial(conn, key)

        return self._run(find)

    def importDevices(
        self, devices: Sequence[Device], *, journal: Sequence[Entry]
    ) -> Deferred[int]:
        try:
            checked = [normalised(device) for device in devices]
        except InventoryError:
            return fail()

        def importAll(db: Database) -> int:
            with db.transaction() as conn:
                for device in checked:
                    try:
                        insertDevice(conn, device)
                    except InventoryError as e:
                        raise InventoryError(
                            f"device {device.name}: {e}", e.kind
                        ) from None
            return len(checked)

        return self._change(importAll, journal)

    def setStatus(
        self, name: str, status: DeviceStatus, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        try:
            key, value = validateName(name), validateStatus(status)
        except InventoryError:
            return fail()
        return self._change(
            lambda db: updateDevice(db, key, "status", value.value), journal
        )

    def setDesiredAction(
        self, name: str, action: str | None, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        try:
            key = validateName(name)
            value = None if action is None else validateToken("desired_action", action)
        except InventoryError:
            return fail()
        return self._change(
            lambda db: updateDevice(db, key, "desired_action", value), journal
        )

    def release(
        self, record: ServedRecord, *, journal: Sequence[Entry]
    ) -> Deferred[None]:
        try:
            checked = validateServedRecord(record)
        except InventoryError:
            return fail()

        def release(db: Database) -> None:
            self.releaseIn(db, checked)

        return self._change(release, journal)

    def forgetIdentity(
        self, name: str, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        try:
            key = validateName(name)
        except InventoryError:
            return fail()
        return self._change(lambda db: forgetDeviceIdentity(db, key), journal)

    def releasedRuns(self) -> Deferred[set[str]]:
        def released(db: Database) -> set[str]:
            rows = db.execute("SELECT run FROM served_records").fetchall()
            return {run for (run,) in rows}

        return self._run(released)

    def servedAt(self, names: Sequence[str]) -> Deferred[dict[str, float]]:
        keys = sorted(set(names))

        def read(db: Database) -> dict[str, float]:
            with db.transaction(write=False) as conn:
                newest = _pairs(conn, _NEWEST_SERVED, keys)
            return {name: float(at) for name, at in newest.items()}

        return self._run(read)

    # Parts of larger changes, on the database thread

    def setStatusIn(self, db: Database, name: str, status: DeviceStatus) -> None:
        updateDevice(db, validateName(name), "status", validateStatus(status).value)

    def releaseIn(self, db: Database, record: ServedRecord) -> bool:
        # No savepoint needed: _release refuses before it writes anything.
        return _release(db.connection, validateServedRecord(record))

    def releaseManyIn(
        self, db: Database, records: Sequence[ServedRecord]
    ) -> Sequence[bool | InventoryError]:
        """
        L{releaseIn} for each of C{records}, in order, in the caller's
        transaction: whether each device moved to C{staged}, or the
        L{InventoryError} refusing that record (which wrote nothing).
        """
        return _releaseMany(db.connection, records)

    def transitionIn(
        self,
        db: Database,
        name: str,
        from_: Iterable[DeviceStatus],
        to: DeviceStatus,
    ) -> bool:
        return transitionDevice(db.connection, validateName(name), from_, to)
