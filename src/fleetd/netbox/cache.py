"""
When NetBox cannot be asked: the NetBox inventory's cached device list
(table C{netbox_devices}, kept by L{fleetd.netbox.outbox.cacheDevices}),
the fleet as NetBox last described it, for lists people read while
NetBox is down; and L{Unanswered}, what lookups that decide on a
credential say and count instead of reading it.

The status fleetd itself writes overrides the cached one, in the
transaction of the change, so a list answered from the cache after the
change reached NetBox (and its outbox row went) does not show the status
from before it (issue 17 item 11). Lookups that decide on a credential
never read this cache.

The functions run on the database thread, inside the caller's
transaction.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import Device, DeviceStatus, validateDevice
from fleetd.logs import ThrottledLog
from fleetd.netbox.client import NetBoxError
from fleetd.store.db import Database

# NetBox error kinds that mean NetBox cannot be asked now: down or 5xx,
# hung, or refusing fleetd's token (401, 403).
NOT_ANSWERED = ("unavailable", "timeout", "forbidden")


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


class Unanswered:
    """
    Lookups that decide on a credential and that NetBox could not answer:
    counted by reason, logged (throttled: every node can cause one), a
    refused token under its own event name, naming C{[netbox] token_file}.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, metrics: CollectorRegistry | None) -> None:
        self._log = ThrottledLog(clock, self.log)
        self.count = Counter(
            "fleetd_netbox_lookups_failed_total",
            "Inventory lookups that decide on a credential (attestation, LDevID,"
            " provisioning, CSR renewals) NetBox could not answer, by reason"
            " (unavailable, timeout, forbidden: NetBox refuses the token).",
            ["reason"],
            registry=metrics,
        )
        for reason in NOT_ANSWERED:
            self.count.labels(reason)  # exposed at 0 from the start

    def noted(self, failure: Failure) -> Failure:
        """Count and log C{failure} if NetBox could not answer; pass it on."""
        error = failure.value
        if isinstance(error, NetBoxError) and error.kind in NOT_ANSWERED:
            self.count.labels(error.kind).inc()
            if error.kind == "forbidden":
                self._log.error(
                    "netbox.lookup.token-refused: {reason}", reason=str(error)
                )
            else:
                self._log.warn("netbox.lookup.unavailable: {reason}", reason=str(error))
        return failure
