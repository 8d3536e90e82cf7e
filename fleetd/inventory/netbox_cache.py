"""
The NetBox inventory's cached device list (table C{netbox_devices}, kept
by L{fleetd.netbox.outbox.cacheDevices}): the fleet as NetBox last
described it, for lists people read while NetBox is down.

The status fleetd itself writes overrides the cached one, in the
transaction of the change, so a list answered from the cache after the
change reached NetBox (and its outbox row went) does not show the status
from before it (issue 17 item 11). Lookups that decide on a credential
never read this cache.

Everything here runs on the database thread, inside the caller's
transaction.
"""

from __future__ import annotations

import json
from typing import Any

from fleetd.inventory.model import Device, DeviceStatus, validateDevice
from fleetd.store.db import Database


def noteWritten(db: Database, device: str, status: DeviceStatus) -> None:
    """C{device}'s cached status becomes C{status}, the one fleetd just wrote."""
    row = db.execute(
        "SELECT device FROM netbox_devices WHERE name = ?", (device,)
    ).fetchone()
    if row is None:
        return  # never listed: NetBox's next answer has it
    cached = json.loads(row[0])
    cached["status"] = status.value
    db.execute(
        "UPDATE netbox_devices SET device = ? WHERE name = ?",
        (json.dumps(cached, sort_keys=True), device),
    )


def toDevice(cached: dict[str, Any]) -> Device:
    """The L{Device} a cached entry (a L{Device.toJSON}) describes."""
    fields = dict(cached)
    fields["device_class"] = fields.pop("class")
    return validateDevice(**fields)
