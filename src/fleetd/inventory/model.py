"""
The inventory's values and the interface every backend implements.

A L{Device} is always valid and normalised: it is built by
L{validateDevice}, which turns operator input (fleetctl, CSV, the admin
API) into canonical names, UUIDs, MAC and IP addresses or raises an
L{InventoryError} naming the field.  L{IInventory} is the contract of the
embedded SQLite inventory and of the NetBox backend alike.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred

from fleetd.inventory.errors import ErrorKind as ErrorKind
from fleetd.inventory.errors import InventoryError as InventoryError
from fleetd.inventory.errors import nonEmptyString, shown
from fleetd.inventory.netaddr import validateAddress
from fleetd.inventory.netaddr import validateMAC as validateMAC

if TYPE_CHECKING:
    from fleetd.store.db import Database
    from fleetd.store.entries import Entry

MAX_SERIAL = 64
MAX_RUN = 128
MAX_PEER = 128
# Device classes fleetd never attests nor provisions (TPM 1.2 machines) [T2].
REFUSED_CLASSES = frozenset({"worker-g2"})

_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_TOKEN = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_SERIAL = re.compile(rf"[\x21-\x7e]{{1,{MAX_SERIAL}}}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NO_UUIDS = {
    "0" * 8 + "-0000-0000-0000-" + "0" * 12,
    "f" * 8 + "-ffff-ffff-ffff-" + "f" * 12,
}


class DeviceStatus(enum.StrEnum):
    """A device's lifecycle status, named as NetBox's C{DeviceStatusChoices}."""

    OFFLINE = "offline"
    ACTIVE = "active"
    PLANNED = "planned"
    STAGED = "staged"
    FAILED = "failed"
    INVENTORY = "inventory"
    DECOMMISSIONING = "decommissioning"


def releasedBefore(run: str, device: str, owner: str | None) -> bool:
    """
    Whether C{run}, released before to C{owner} (L{None}: never), was
    released to C{device} already: a release is once, for one device.

    @raise InventoryError: (C{"duplicate"}) it was released for another device.
    """
    if owner is None:
        return False
    if owner == device:
        return True
    raise InventoryError(f"run {run} was released for device {owner}", "duplicate")


@dataclass(frozen=True)
class Device:
    """One machine of the fleet; build it with L{validateDevice}."""

    name: str
    serial: str
    uuid: str
    macs: tuple[str, ...]
    device_class: str
    cluster: str | None
    status: DeviceStatus = DeviceStatus.INVENTORY
    desired_action: str | None = None
    # The node's own IPv4 or IPv6 address (L{validateAddress}), if known.
    address: str | None = None

    def toJSON(self) -> dict[str, Any]:
        """
        The device as the admin API and C{fleetctl --json} show it; the
        C{address} key only when the device has one (issue 30).
        """
        doc = {
            "name": self.name,
            "serial": self.serial,
            "uuid": self.uuid,
            "macs": list(self.macs),
            "class": self.device_class,
            "cluster": self.cluster,
            "status": self.status.value,
            "desired_action": self.desired_action,
        }
        return doc if self.address is None else {**doc, "address": self.address}


@dataclass(frozen=True)
class ServedRecord:
    """
    The record of one configuration delivery, released to the inventory
    after it (design.md, rules: a consumed run survives a reboot only if
    this record was released).
    """

    run: str
    device: str
    served_at: float
    peer: str


def validateName(value: object) -> str:
    """A device name: one hostname label, lower-cased."""
    name = nonEmptyString("name", value).lower()
    if _LABEL.fullmatch(name) is None:
        raise InventoryError(
            f"name: {shown(value)} is not a hostname label"
            " (a-z, 0-9 and inner '-', at most 63 characters)"
        )
    return name


def validateSerial(value: object) -> str:
    """A chassis serial: 1..64 printable ASCII characters, no spaces."""
    serial = nonEmptyString("serial", value)
    if _SERIAL.fullmatch(serial) is None:
        raise InventoryError(
            f"serial: {shown(value)} must be 1 to {MAX_SERIAL} printable"
            " ASCII characters without spaces"
        )
    return serial


def validateUUID(value: object) -> str:
    """An SMBIOS system UUID in canonical lowercase 8-4-4-4-12 form."""
    uuid = nonEmptyString("uuid", value).lower()
    if _UUID.fullmatch(uuid) is None:
        raise InventoryError(f"uuid: {shown(value)} is not an 8-4-4-4-12 hex UUID")
    if uuid in _NO_UUIDS:
        # SMBIOS: all zeros = not set, all ones = not present.
        raise InventoryError(f"uuid: {uuid} means the firmware has no UUID")
    return uuid


def validateToken(field: str, value: object) -> str:
    """A class, cluster or desired action: a short lowercase token."""
    token = nonEmptyString(field, value).lower()
    if _TOKEN.fullmatch(token) is None:
        raise InventoryError(
            f"{field}: {shown(value)} must be a-z, 0-9 and '-',"
            " starting with a letter or digit, at most 32 characters"
        )
    return token


def validateStatus(value: object) -> DeviceStatus:
    """A L{DeviceStatus}, or its lowercase name."""
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return DeviceStatus(value)
    except ValueError:
        known = ", ".join(s.value for s in DeviceStatus)
        raise InventoryError(f"status: {shown(value)} is not one of {known}") from None


def validateDevice(
    *,
    name: object,
    serial: object,
    uuid: object,
    macs: Iterable[object] = (),
    device_class: object,
    cluster: object = None,
    status: object = DeviceStatus.INVENTORY,
    desired_action: object = None,
    address: object = None,
) -> Device:
    """
    Check and normalise operator input into a L{Device}.

    @raise InventoryError: (C{"invalid"}) one line naming the first bad field.
    """
    if isinstance(macs, str | bytes):
        raise InventoryError("macs: must be a list of MAC addresses")
    canonical: list[str] = []
    for value in macs:
        mac = validateMAC(value)
        if mac in canonical:
            raise InventoryError(f"mac: {mac} is listed twice")
        canonical.append(mac)
    return Device(
        name=validateName(name),
        serial=validateSerial(serial),
        uuid=validateUUID(uuid),
        macs=tuple(canonical),
        device_class=validateToken("class", device_class),
        cluster=None if cluster is None else validateToken("cluster", cluster),
        status=validateStatus(status),
        desired_action=(
            None
            if desired_action is None
            else validateToken("desired_action", desired_action)
        ),
        address=None if address is None else validateAddress(address),
    )


def validateServedRecord(record: ServedRecord) -> ServedRecord:
    """Check a served-config record before it is made durable."""
    device = validateName(record.device)
    run = nonEmptyString("run", record.run)
    if len(run) > MAX_RUN or not run.isprintable() or not run.isascii():
        raise InventoryError(f"run: {shown(run)} is not a run id")
    at = record.served_at
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise InventoryError(f"served_at: {shown(record.served_at)} is not a time")
    peer = record.peer
    if not isinstance(peer, str) or len(peer) > MAX_PEER or not peer.isprintable():
        raise InventoryError(f"peer: {shown(peer)} is not a peer address")
    if device == record.device and at.__class__ is float:
        return record  # already as it would be rebuilt (it is frozen)
    return ServedRecord(run=run, device=device, served_at=float(at), peer=peer)


Identities = list[tuple[str, str, str]]
"""C{(name, uuid, serial)} of devices (L{IInventory.identities})."""


class IInventory(Protocol):
    """
    The inventory of record: embedded SQLite or NetBox.

    Every method returns a L{Deferred}; failures are L{InventoryError}s.
    Names given to lookups are case-insensitive (device names are
    lowercase hostname labels).

    Changes carry their journal entries [J1]: a method that changes
    something takes the entries to record with it, and the change and the
    entries commit together or not at all. The C{...In} methods do their
    part of a larger change inside the caller's transaction, on the
    database thread (see L{fleetd.store.journal.AsyncJournal.change}).
    """

    def add(self, device: Device, *, journal: Sequence[Entry]) -> Deferred[Device]:
        """
        Add one device; fire with it as stored.  A name, serial (compared
        case-insensitively), UUID, MAC or address already taken fails with
        C{"duplicate"}, naming the field and the device holding it. The
        NetBox backend refuses (C{"invalid"}): devices are created in NetBox.
        """

    def get(self, name: str) -> Deferred[Device | None]:
        """The device called C{name}, or L{None}."""

    def list(self) -> Deferred[list[Device]]:
        """Every device, ordered by name."""

    def identities(self) -> Deferred[Identities]:
        """
        C{(name, uuid, serial)} of every device, in no order: what a
        restart needs of each (L{fleetd.runs.recovery}), without building
        the rest of it.
        """

    def bySerial(self, serial: str) -> Deferred[Device | None]:
        """
        The device whose chassis serial is C{serial} (compared
        case-insensitively), or L{None} (also for a malformed serial).
        Several devices with that serial fail with C{"duplicate"}, naming
        them (design.md, State: serials are not unique in NetBox; the
        embedded inventory refuses a duplicate when it is added).
        """

    def importDevices(
        self, devices: Sequence[Device], *, journal: Sequence[Entry]
    ) -> Deferred[int]:
        """
        Add all of C{devices} or none of them (one transaction); fire with
        how many were added.  Failures are as for L{add}.
        """

    def setStatus(
        self, name: str, status: DeviceStatus, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        """Set the device's status; fire with the device as changed."""

    def setDesiredAction(
        self, name: str, action: str | None, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        """Set or clear the device's desired action (e.g. C{netboot})."""

    def release(
        self, record: ServedRecord, *, journal: Sequence[Entry]
    ) -> Deferred[None]:
        """
        Make the served-config record durable and move its device, if it
        is still C{planned}, to C{staged}, together.  Releasing the same
        run for the same device again changes nothing (retries after an
        unknown outcome are safe); the same run for another device fails
        with C{"duplicate"}.
        """

    def releasedRuns(self) -> Deferred[set[str]]:
        """The ids of every run whose served-config record was released."""

    def servedAt(self, names: Sequence[str]) -> Deferred[dict[str, float]]:
        """
        The C{served_at} of each of C{names}' newest released delivery, by
        name (none released: left out), from fleetd's own database with
        either backend (L{fleetd.inventory.census}).
        """

    def forgetIdentity(
        self, name: str, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        """
        Free a retired (C{decommissioning}) device's serial, uuid, MACs and
        address, so that the machine (or its address) can come back in a
        new device record; the record, its runs' records and its journal
        stay. Another status fails with C{"invalid"}; the NetBox backend
        refuses (the identity is NetBox's to change).
        """

    def setStatusIn(self, db: Database, name: str, status: DeviceStatus) -> None:
        """L{setStatus} as part of the caller's transaction."""

    def releaseIn(self, db: Database, record: ServedRecord) -> bool:
        """
        L{release} as part of the caller's transaction; whether the
        device moved to C{staged}. Only a C{planned} device does (as
        L{transitionIn}): one retired or approved since keeps its status.
        """

    def transitionIn(
        self,
        db: Database,
        name: str,
        from_: Iterable[DeviceStatus],
        to: DeviceStatus,
    ) -> bool:
        """
        Compare and set, in the caller's transaction: move the device to
        C{to} only if its status is one of C{from_}; whether it moved. A
        status written since the caller looked (a retirement, say) is
        never overwritten. The NetBox backend compares with the status
        fleetd last knew (its pending change, else NetBox's last answer)
        and decides again when it pushes (L{fleetd.netbox.outbox.decide}).

        @raise InventoryError: C{not-found}: no such device.
        """
