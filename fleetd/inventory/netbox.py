"""
The NetBox inventory: L{IInventory} over a NetBox's C{dcim.device}s
(DESIGN section 4, "NetBox as the inventory"; mapping in
L{fleetd.netbox.devices}).

Reads go to NetBox. Changes commit locally first, as one transaction
with their journal entries [J1]: a status change or a release becomes a
row of the NetBox outbox (L{fleetd.netbox.outbox}), and the outbox worker
writes it to NetBox afterwards. Until it has, reads show the status fleetd
set (the row overlays NetBox's answer). The release row is the durable
served-config record, so L{releasedRuns} answers from fleetd's database
alone. Devices are created in NetBox, not through fleetd: C{add} and
C{importDevices} refuse, saying so.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    ErrorKind,
    InventoryError,
    ServedRecord,
    validateDevice,
    validateName,
    validateSerial,
    validateServedRecord,
    validateStatus,
    validateToken,
)
from fleetd.netbox import outbox
from fleetd.netbox.client import NetBoxClient, NetBoxError
from fleetd.netbox.devices import (
    DEVICES,
    INTERFACES,
    findByName,
    findBySerial,
    interfacesOf,
    isFleetDevice,
    missingCustomFields,
    remote,
    toDevice,
)
from fleetd.store.db import Database, StoreError
from fleetd.store.journal import AsyncJournal, Entry, JournalRefused, Recorder
from fleetd.store.runner import IRunner

_T = TypeVar("_T")

# NetBox error kinds for which reads answer from the cached device list.
_DOWN = ("unavailable", "timeout", "forbidden")

ADD_REFUSED = (
    "with [netbox] set, devices are added in NetBox: create the dcim.device"
    " (serial, interfaces with their MACs, cluster) and fill in its custom"
    " fields fleetd_uuid and fleetd_class"
)


def digestOf(body: bytes | None) -> str | None:
    """The digest C{fleetd_release} carries for a configuration body."""
    return None if body is None else "sha256:" + hashlib.sha256(body).hexdigest()


def _translate(failure: Failure) -> Failure:
    """NetBox and store trouble as L{InventoryError}s with one-line messages."""
    if failure.check(InventoryError):
        return failure
    error = failure.value
    if isinstance(error, NetBoxError):
        kind: ErrorKind = "unavailable"
        if error.kind == "not-found":
            kind = "not-found"
        elif error.kind == "invalid":
            kind = "invalid"
        return Failure(InventoryError(f"NetBox: {error}", kind))
    if isinstance(error, JournalRefused):
        return Failure(InventoryError(f"the journal refused it: {error}", "invalid"))
    if failure.check(StoreError, sqlite3.Error):
        return Failure(
            InventoryError(f"inventory database unavailable: {error}", "unavailable")
        )
    return failure


class NetBoxInventory:
    """L{fleetd.inventory.model.IInventory} with NetBox as the inventory of record."""

    log = Logger()

    def __init__(
        self,
        client: NetBoxClient,
        runner: IRunner,
        journal: AsyncJournal,
        clock: IReactorTime,
        *,
        configDigest: Callable[[str], str | None] = lambda run: None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """
        @param configDigest: the digest of a run's configuration (for
            C{fleetd_release}), read on the database thread.
        @param wake: tell the outbox worker a row was queued; called on
            the database thread, inside the transaction (so it must only
            schedule, e.g. C{reactor.callFromThread(worker.kick)}).
        """
        self.client = client
        self._runner = runner
        self._journal = journal
        self._clock = clock
        self._configDigest = configDigest
        self._wake = wake

    async def checkCustomFields(self) -> list[str]:
        """fleetd's custom fields missing for C{dcim.device} (start-up check)."""
        return await missingCustomFields(self.client)

    def _wrap(self, d: Deferred[_T]) -> Deferred[_T]:
        return d.addErrback(_translate)

    # Reads

    async def _local(self) -> tuple[dict[str, DeviceStatus], dict[str, str]]:
        return await self._runner.run(
            lambda db: (outbox.pendingStatuses(db), outbox.desiredActions(db))
        )

    def _overlay(
        self,
        device: Device,
        local: tuple[dict[str, DeviceStatus], dict[str, str]],
    ) -> Device:
        statuses, actions = local
        return replace(
            device,
            status=statuses.get(device.name, device.status),
            desired_action=actions.get(device.name),
        )

    async def _get(self, name: str) -> Device | None:
        data = await findByName(self.client, name)
        if data is None or not isFleetDevice(data):
            return None
        interfaces = await interfacesOf(self.client, remote(data).id)
        return self._overlay(toDevice(data, interfaces), await self._local())

    def get(self, name: str) -> Deferred[Device | None]:
        try:
            key = validateName(name)
        except InventoryError:
            return Deferred.fromCoroutine(_none())
        return self._wrap(Deferred.fromCoroutine(self._get(key)))

    async def _bySerial(self, serial: str) -> Device | None:
        try:
            data = await findBySerial(self.client, serial)
        except InventoryError as e:
            if e.kind == "not-found":
                return None
            raise
        except NetBoxError as e:
            if e.kind not in _DOWN:
                raise
            # NetBox down: the fleet as NetBox last described it, as list does.
            self.log.warn("netbox.serial.cached: {reason}", reason=str(e))
            return await self._cachedBySerial(serial)
        if not isFleetDevice(data):
            return None
        interfaces = await interfacesOf(self.client, remote(data).id)
        return self._overlay(toDevice(data, interfaces), await self._local())

    async def _cachedBySerial(self, serial: str) -> Device | None:
        cached = await self._runner.run(outbox.cachedDevices)
        matches = [c for c in cached if str(c.get("serial")).lower() == serial.lower()]
        if len(matches) > 1:
            names = ", ".join(sorted(str(c.get("name")) for c in matches))
            raise InventoryError(
                f"{len(matches)} devices have serial {serial} ({names})", "duplicate"
            )
        if not matches:
            return None
        return self._overlay(validateDevice(**_fields(matches[0])), await self._local())

    def bySerial(self, serial: str) -> Deferred[Device | None]:
        try:
            key = validateSerial(serial)
        except InventoryError:
            return Deferred.fromCoroutine(_none())
        return self._wrap(Deferred.fromCoroutine(self._bySerial(key)))

    async def _list(self) -> list[Device]:
        devices = [d for d in await self.client.listAll(DEVICES) if isFleetDevice(d)]
        byId: dict[int, list[dict[str, Any]]] = {}
        if devices:
            for interface in await self.client.listAll(INTERFACES):
                owner = interface.get("device")
                if isinstance(owner, dict) and isinstance(owner.get("id"), int):
                    byId.setdefault(owner["id"], []).append(interface)
        local = await self._local()
        found: dict[str, Device] = {}
        twice: set[str] = set()
        for data in devices:
            try:
                device = toDevice(data, byId.get(remote(data).id, []))
            except InventoryError as e:
                self.log.error("netbox.device.invalid: {reason}", reason=str(e))
                continue
            if device.name in found:
                twice.add(device.name)
            found[device.name] = self._overlay(device, local)
        for name in sorted(twice):
            self.log.error(
                "netbox.device.duplicate {device}: several NetBox devices carry"
                " this name; fleetd ignores them until one remains",
                device=name,
            )
            del found[name]
        return [found[name] for name in sorted(found)]

    async def _listOrCached(self) -> list[Device]:
        try:
            devices = await self._list()
        except (NetBoxError, InventoryError) as e:
            if getattr(e, "kind", None) not in _DOWN:
                raise
            # NetBox down (a start after a reboot, say): the fleet as NetBox
            # last described it, with fleetd's own pending changes.
            self.log.warn("netbox.list.cached: {reason}", reason=str(e))
            cached = await self._runner.run(outbox.cachedDevices)
            local = await self._local()
            return [self._overlay(validateDevice(**_fields(c)), local) for c in cached]
        await self._runner.run(
            lambda db: outbox.cacheDevices(db, [d.toJSON() for d in devices], True)
        )
        return devices

    def list(self) -> Deferred[list[Device]]:
        return self._wrap(Deferred.fromCoroutine(self._listOrCached()))

    def releasedRuns(self) -> Deferred[set[str]]:
        return self._wrap(self._runner.run(outbox.releasedRuns))

    # Changes: local first [J1], NetBox from the outbox

    def add(self, device: Device, *, journal: Sequence[Entry]) -> Deferred[Device]:
        return fail(InventoryError(ADD_REFUSED, "invalid"))

    def importDevices(
        self, devices: Sequence[Device], *, journal: Sequence[Entry]
    ) -> Deferred[int]:
        return fail(InventoryError(ADD_REFUSED, "invalid"))

    async def _existing(self, name: str) -> Device:
        device = await self._get(name)
        if device is None:
            raise InventoryError(f"no device named {name}", "not-found")
        return device

    async def _commit(
        self, work: Callable[[Database], _T], journal: Sequence[Entry]
    ) -> _T:
        entries = list(journal)

        def change(db: Database, record: Recorder) -> _T:
            result = work(db)
            for entry in entries:
                record.add(entry)
            return result

        return await self._journal.change(change)

    def setStatus(
        self, name: str, status: DeviceStatus, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        try:
            key, value = validateName(name), validateStatus(status)
        except InventoryError:
            return fail()

        async def work() -> Device:
            device = await self._existing(key)
            await self._commit(lambda db: self.setStatusIn(db, key, value), journal)
            return replace(device, status=value)

        return self._wrap(Deferred.fromCoroutine(work()))

    def setDesiredAction(
        self, name: str, action: str | None, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        try:
            key = validateName(name)
            value = None if action is None else validateToken("desired_action", action)
        except InventoryError:
            return fail()

        async def work() -> Device:
            device = await self._existing(key)
            await self._commit(
                lambda db: outbox.setDesiredAction(db, key, value), journal
            )
            return replace(device, desired_action=value)

        return self._wrap(Deferred.fromCoroutine(work()))

    def release(
        self, record: ServedRecord, *, journal: Sequence[Entry]
    ) -> Deferred[None]:
        try:
            checked = validateServedRecord(record)
        except InventoryError:
            return fail()

        async def work() -> None:
            await self._existing(checked.device)
            await self._commit(lambda db: void(self.releaseIn(db, checked)), journal)

        return self._wrap(Deferred.fromCoroutine(work()))

    # Parts of larger changes, on the database thread

    def setStatusIn(self, db: Database, name: str, status: DeviceStatus) -> None:
        outbox.enqueueStatus(
            db, validateName(name), validateStatus(status), self._clock.seconds()
        )
        self._wake()

    def releaseIn(self, db: Database, record: ServedRecord) -> bool:
        # As decide() at push time: only a planned device becomes staged;
        # one fleetd knows to be otherwise keeps its status in the row, so
        # reads do not show staged meanwhile.
        checked = validateServedRecord(record)
        digest = self._configDigest(checked.run)
        known = outbox.localStatus(db, checked.device)
        moved = known in (None, DeviceStatus.PLANNED)
        status = DeviceStatus.STAGED if moved or known is None else known
        if outbox.enqueueRelease(db, checked, digest, self._clock.seconds(), status):
            self._wake()
            return moved
        return False

    def transitionIn(
        self,
        db: Database,
        name: str,
        from_: Iterable[DeviceStatus],
        to: DeviceStatus,
    ) -> bool:
        key, target = validateName(name), validateStatus(to)
        allowed = {validateStatus(s) for s in from_}
        known = outbox.localStatus(db, key)
        # Unknown locally: queue it; decide() compares with NetBox's
        # status at push time (decommissioning and site statuses stay).
        if known is not None and known not in allowed:
            return False
        self.setStatusIn(db, key, target)
        return True


def _fields(cached: dict[str, Any]) -> dict[str, Any]:
    fields = dict(cached)
    fields["device_class"] = fields.pop("class")
    return fields


async def _none() -> None:
    return None


def void(_: object) -> None:
    return None
