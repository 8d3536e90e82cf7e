"""
The embedded inventory's device rows: SQL over tables C{devices} and
C{device_macs} (migration 2; C{devices.address} from migration 14), run on
the database thread inside the caller's transaction
(L{fleetd.inventory.sqlite} runs them).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    InventoryError,
    validateDevice,
    validateStatus,
)
from fleetd.store.db import Database

__all__ = [
    "BY_SERIAL",
    "DeviceListing",
    "insertDevice",
    "normalised",
    "readDevice",
    "readDeviceBySerial",
    "readDevices",
    "transitionDevice",
    "updateDevice",
]

SELECT_DEVICE = (
    "SELECT name, serial, uuid, class, cluster, status, desired_action, address"
    " FROM devices"
)
INSERT_DEVICE = (
    "INSERT INTO devices"
    " (name, serial, uuid, class, cluster, status, desired_action, address)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_MAC = "INSERT INTO device_macs (mac, device, position) VALUES (?, ?, ?)"
BY_SERIAL = "SELECT name FROM devices WHERE serial = ?"
UNIQUE_COLUMNS = (
    ("name", "name"),
    ("serial", "serial"),
    ("uuid", "uuid"),
    ("address", "address"),
)


def normalised(device: Device) -> Device:
    """Check a device again: the backend never stores an invalid one."""
    if not isinstance(device, Device):
        raise InventoryError(f"not a Device: {type(device).__name__}")
    return validateDevice(
        name=device.name,
        serial=device.serial,
        uuid=device.uuid,
        macs=device.macs,
        device_class=device.device_class,
        cluster=device.cluster,
        status=device.status,
        desired_action=device.desired_action,
        address=device.address,
    )


def insertDevice(conn: sqlite3.Connection, device: Device) -> None:
    """Insert one device, naming the first unique field already taken."""
    for column, field in UNIQUE_COLUMNS:
        value = getattr(device, field)
        if value is None:
            continue  # no address: nothing to share
        # Constant column names only; serial compares with NOCASE.
        row = conn.execute(
            f"SELECT name FROM devices WHERE {column} = ?",  # noqa: S608
            (value,),
        ).fetchone()
        if row is not None:
            if column == "name":
                raise InventoryError(
                    f"name {value} is already in the inventory", "duplicate"
                )
            raise InventoryError(
                f"{column} {value} already belongs to device {row[0]}", "duplicate"
            )
    for mac in device.macs:
        row = conn.execute(
            "SELECT device FROM device_macs WHERE mac = ?", (mac,)
        ).fetchone()
        if row is not None:
            raise InventoryError(
                f"mac {mac} already belongs to device {row[0]}", "duplicate"
            )
    conn.execute(
        INSERT_DEVICE,
        (
            device.name,
            device.serial,
            device.uuid,
            device.device_class,
            device.cluster,
            device.status.value,
            device.desired_action,
            device.address,
        ),
    )
    for position, mac in enumerate(device.macs):
        conn.execute(INSERT_MAC, (mac, device.name, position))


def deviceFromRow(row: Sequence[object], macs: Sequence[str]) -> Device:
    name, serial, uuid, deviceClass, cluster, status, action, address = row
    return Device(
        name=str(name),
        serial=str(serial),
        uuid=str(uuid),
        macs=tuple(macs),
        device_class=str(deviceClass),
        cluster=None if cluster is None else str(cluster),
        status=DeviceStatus(str(status)),
        desired_action=None if action is None else str(action),
        address=None if address is None else str(address),
    )


def readDevice(conn: sqlite3.Connection, name: str) -> Device | None:
    row = conn.execute(f"{SELECT_DEVICE} WHERE name = ?", (name,)).fetchone()
    if row is None:
        return None
    macs = conn.execute(
        "SELECT mac FROM device_macs WHERE device = ? ORDER BY position", (name,)
    ).fetchall()
    return deviceFromRow(row, [mac for (mac,) in macs])


def readDeviceBySerial(conn: sqlite3.Connection, serial: str) -> Device | None:
    # devices.serial is COLLATE NOCASE UNIQUE (migration 2): this equality
    # compares case-insensitively and is answered from that unique index.
    row = conn.execute(BY_SERIAL, (serial,)).fetchone()
    return None if row is None else readDevice(conn, str(row[0]))


def readDevices(conn: sqlite3.Connection) -> list[Device]:
    macs: dict[str, list[str]] = {}
    for device, mac in conn.execute(
        "SELECT device, mac FROM device_macs ORDER BY device, position"
    ):
        macs.setdefault(device, []).append(mac)
    rows = conn.execute(f"{SELECT_DEVICE} ORDER BY name").fetchall()
    return [deviceFromRow(row, macs.get(row[0], [])) for row in rows]


class DeviceListing:
    """
    The last full listing of the devices and the state of the database it
    was read at: the connection, the rows it has changed so far
    (C{total_changes}, which never goes down, rollbacks included) and
    what other connections have committed (C{PRAGMA data_version}). While
    these stay the same the devices are the same, and the listing is
    given again without reading 10,000 rows (the owner console's fleet
    view lists them for every page). Used on the database thread only.
    """

    def __init__(self) -> None:
        self._key: tuple[sqlite3.Connection, int, int] | None = None
        self._devices: tuple[Device, ...] = ()

    def read(self, conn: sqlite3.Connection, keep: bool) -> list[Device]:
        """
        Every device, by name, in a read transaction on C{conn}. C{keep}
        the listing only when that transaction is the outermost one: a
        read inside a group commit sees writes that may yet be rolled back.
        """
        # The key is read first: a change that lands before the rows are
        # read changes the key too, and only costs the next read a miss.
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        key = (conn, conn.total_changes, int(version))
        if key == self._key:
            return list(self._devices)
        devices = readDevices(conn)
        if keep:
            self._key, self._devices = key, tuple(devices)
        return devices


def updateDevice(db: Database, name: str, column: str, value: str | None) -> Device:
    """Set one column of one device; fire with the device as changed."""
    with db.transaction() as conn:
        # Constant column names only (status, desired_action).
        cursor = conn.execute(
            f"UPDATE devices SET {column} = ? WHERE name = ?",  # noqa: S608
            (value, name),
        )
        if cursor.rowcount == 0:
            raise InventoryError(f"no device named {name}", "not-found")
        device = readDevice(conn, name)
    assert device is not None
    return device


def transitionDevice(
    conn: sqlite3.Connection,
    name: str,
    from_: Iterable[DeviceStatus],
    to: DeviceStatus,
) -> bool:
    """Compare and set one device's status; whether it moved."""
    allowed = sorted({validateStatus(s).value for s in from_})
    if allowed:
        marks = ", ".join("?" * len(allowed))
        cursor = conn.execute(
            f"UPDATE devices SET status = ? WHERE name = ? AND status IN ({marks})",  # noqa: S608
            (validateStatus(to).value, name, *allowed),
        )
        if cursor.rowcount:
            return True
    if conn.execute("SELECT 1 FROM devices WHERE name = ?", (name,)).fetchone() is None:
        raise InventoryError(f"no device named {name}", "not-found")
    return False


FORGOTTEN = "forgotten:"
"""What a forgotten identity's serial and uuid start with (never valid input)."""


def forgetDeviceIdentity(db: Database, name: str) -> Device:
    """
    L{IInventory.forgetIdentity} in the caller's transaction: the serial
    and uuid become C{forgotten:NAME}, the MACs and the address go; only a
    retired device.
    """
    with db.transaction() as conn:
        device = readDevice(conn, name)
        if device is None:
            raise InventoryError(f"no device named {name}", "not-found")
        if device.status is not DeviceStatus.DECOMMISSIONING:
            raise InventoryError(
                f"{name} is {device.status.value}, not retired: only a retired"
                " device's serial, uuid and MACs can be forgotten"
            )
        if device.serial.startswith(FORGOTTEN):
            raise InventoryError(f"{name}'s identity is already forgotten")
        conn.execute(
            "UPDATE devices SET serial = ?, uuid = ?, address = NULL WHERE name = ?",
            (FORGOTTEN + name, FORGOTTEN + name, name),
        )
        conn.execute("DELETE FROM device_macs WHERE device = ?", (name,))
        forgotten = readDevice(conn, name)
    assert forgotten is not None
    return forgotten
