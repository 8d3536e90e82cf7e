"""
The NetBox inventory: L{IInventory} over a NetBox's C{dcim.device}s
(design.md, NetBox; mapping in
L{fleetd.netbox.devices}).

Reads go to NetBox. Changes commit locally first, as one transaction
with their journal entries [J1]: a status change or a release becomes a
row of the NetBox outbox (L{fleetd.netbox.outbox}), and the outbox worker
writes it to NetBox afterwards. Until it has, reads show the status fleetd
set (the row overlays NetBox's answer). The release row is the durable
served-config record, so L{releasedRuns} answers from fleetd's database
alone. Devices are created in NetBox, not through fleetd: C{add} and
C{importDevices} refuse, saying so.

The device list NetBox last gave is kept for lists people read while
NetBox is down (L{fleetd.netbox.cache}); C{get} and C{bySerial},
which decide on credentials, never answer from it (issue 17 item 11).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.failures import storeFailure
from fleetd.inventory.model import (
    Device,
    DeviceStatus,
    ErrorKind,
    Identities,
    InventoryError,
    ServedRecord,
    validateName,
    validateSerial,
    validateServedRecord,
    validateStatus,
    validateToken,
)
from fleetd.netbox import cache, outbox
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
from fleetd.store.db import Database
from fleetd.store.entries import Entry
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

_T = TypeVar("_T")

# NetBox down, hung or refusing the token: lists for people answer from
# the cached device list (a start must still load its runs); lookups that
# decide on a credential fail.
_CACHED_FOR_LISTS = cache.NOT_ANSWERED

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
        elif error.kind == "forbidden":
            # Not "down": the operator has a token to fix (item 11).
            line = f"NetBox refuses fleetd's token: {error}"
            return Failure(InventoryError(line, "unavailable"))
        return Failure(InventoryError(f"NetBox: {error}", kind))
    return storeFailure(failure)


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
        metrics: CollectorRegistry | None = None,
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
        self.unanswered = cache.Unanswered(clock, metrics)

    async def checkCustomFields(self) -> list[str]:
        """fleetd's custom fields missing for C{dcim.device} (start-up check)."""
        return await missingCustomFields(self.client)

    def _wrap(self, d: Deferred[_T]) -> Deferred[_T]:
        return d.addErrback(_translate)

    def _asked(self, d: Deferred[_T]) -> Deferred[_T]:
        """A lookup that decides on a credential: NetBox's answer or an error."""
        return self._wrap(d.addErrback(self.unanswered.noted))

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
            return succeed(None)
        return self._asked(Deferred.fromCoroutine(self._get(key)))

    async def _bySerial(self, serial: str) -> Device | None:
        # Never from the cache: a device NetBox decommissioned since it was
        # listed would get an LDevID (item 11). NetBox down is an error.
        try:
            data = await findBySerial(self.client, serial)
        except InventoryError as e:
            if e.kind == "not-found":
                return None
            raise
        if not isFleetDevice(data):
            return None
        interfaces = await interfacesOf(self.client, remote(data).id)
        return self._overlay(toDevice(data, interfaces), await self._local())

    def bySerial(self, serial: str) -> Deferred[Device | None]:
        try:
            key = validateSerial(serial)
        except InventoryError:
            return succeed(None)
        return self._asked(Deferred.fromCoroutine(self._bySerial(key)))

    async def _list(self) -> list[Device]:
        # A row pending now may settle (and go) before NetBox's answer is
        # read, an answer given before its PATCH: keep its status then.
        before = await self._local()
        devices = [d for d in await self.client.listAll(DEVICES) if isFleetDevice(d)]
        byId: dict[int, list[dict[str, Any]]] = {}
        if devices:
            for interface in await self.client.listAll(INTERFACES):
                owner = interface.get("device")
                if isinstance(owner, dict) and isinstance(owner.get("id"), int):
                    byId.setdefault(owner["id"], []).append(interface)
        statuses, actions = await self._local()
        local = ({**before[0], **statuses}, actions)
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
            kind = getattr(e, "kind", None)
            if kind not in _CACHED_FOR_LISTS:
                raise
            # NetBox down (a start after a reboot, say): the fleet as NetBox
            # last described it, with the last status fleetd itself wrote
            # and its pending changes.
            if kind == "forbidden":
                self.log.error(
                    "netbox.list.cached-token-refused: {reason}", reason=str(e)
                )
            else:
                self.log.warn("netbox.list.cached: {reason}", reason=str(e))
            cached = await self._runner.run(outbox.cachedDevices)
            local = await self._local()
            return [self._overlay(cache.toDevice(c), local) for c in cached]
        await self._runner.run(
            lambda db: outbox.cacheDevices(db, [d.toJSON() for d in devices], True)
        )
        return devices

    def list(self) -> Deferred[list[Device]]:
        return self._wrap(Deferred.fromCoroutine(self._listOrCached()))

    def forgetIdentity(
        self, name: str, *, journal: Sequence[Entry]
    ) -> Deferred[Device]:
        return fail(
            InventoryError(
                "the device's serial, uuid and MACs are NetBox's: delete the"
                " retired device in NetBox, or clear its serial there",
                "invalid",
            )
        )

    def identities(self) -> Deferred[Identities]:
        return self.list().addCallback(
            lambda devices: [(d.name, d.uuid, d.serial) for d in devices]
        )

    def releasedRuns(self) -> Deferred[set[str]]:
        return self._wrap(self._runner.run(outbox.releasedRuns))

    def servedAt(self, names: Sequence[str]) -> Deferred[dict[str, float]]:
        return self._wrap(self._runner.run(lambda db: outbox.servedAt(db, names)))

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
        key, value = validateName(name), validateStatus(status)
        outbox.enqueueStatus(db, key, value, self._clock.seconds())
        cache.noteWritten(db, key, value)
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
            cache.noteWritten(db, checked.device, status)
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


def void(_: object) -> None:
    return None
