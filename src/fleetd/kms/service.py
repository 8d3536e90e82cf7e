"""
fleetd as the site's Talos KMS: Seal and Unseal [E1] [E2] [E3].

L{DiskKeys.seal} answers a node's Seal: the node is checked [E1]
(L{fleetd.kms.access}), its key for the generation of its last delivery
is found, or made, wrapped by the master key and stored with its
C{kms.key-created} entry in one transaction [J1]; the keys of its older
generations are destroyed in that same transaction (a new install sealed
its own). L{DiskKeys.unseal} checks the node the same way, finds the key
the blob's header names and opens the blob; anything that does not open
is a refusal, never a guess. Database work runs on the database thread
(one call per Seal or Unseal past the inventory's lookup); the AES-GCM of
32 bytes is cheap enough for either thread.

Every refusal is a L{Refused} with a reason of L{fleetd.kms.reasons},
counted, and journaled as C{kms.refused} at most once per source and
reason every L{REFUSAL_EVERY} seconds (the next entry says how many were
not). Until the start-up sweep of decommissioned devices' keys has run
(L{fleetd.kms.retire.sweepDecommissioned}), every call is refused
C{starting}.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import Device, DeviceStatus, IInventory, InventoryError
from fleetd.kms import blob, store
from fleetd.kms.access import Allowed, Approved, allowed, normalHost, normalUUID
from fleetd.kms.reasons import (
    BLOB_REJECTED,
    KEY_DESTROYED,
    RETIRED,
    SEAL,
    SEALED,
    STARTING,
    UNKNOWN_KEY,
    UNKNOWN_NODE,
    UNSEAL,
    KMSMetrics,
)
from fleetd.kms.record import Destroyed, DestructionRecord, destroyedRow
from fleetd.kms.throttle import REFUSAL_EVERY, SourceThrottle
from fleetd.kms.watch import KeyWatch
from fleetd.refused import BUSY, MALFORMED, Refused
from fleetd.sources import sourceKey
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.keys import deriveKey
from fleetd.store.runner import IRunner

__all__ = ["REFUSAL_EVERY", "DiskKeys", "IUUIDs"]

SUPERSEDED = "superseded"
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Key:
    """A Seal's key, and what its transaction did."""

    keyId: bytes
    kek: bytes
    created: bool = False
    superseded: list[Destroyed] = field(default_factory=list)


class IUUIDs(Protocol):
    """Which device holds a uuid now (the run index's identities)."""

    def deviceByUUID(self, uuid: str) -> str | None:
        "The device with this uuid, if any."


class DiskKeys:
    """Seal and Unseal for the nodes of the inventory."""

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        runner: IRunner,
        journal: AsyncJournal,
        inventory: IInventory,
        uuids: IUUIDs,
        approved: Approved,
        masterKey: bytes,
        metrics: KMSMetrics,
        record: DestructionRecord,
    ) -> None:
        """
        @param record: the destruction record outside the database, where
            the keys a new install supersedes are appended after their
            commit [E3].
        """
        self.clock = clock
        self.runner = runner
        self.journal = journal
        self.inventory = inventory
        self.uuids = uuids
        self.approved = approved
        self._wrapping = deriveKey(masterKey, blob.WRAP_PURPOSE)
        self.metrics = metrics
        self.record = record
        self.watch = KeyWatch(metrics)  # last unlocks, refusals, key states
        self.throttle = SourceThrottle(clock)
        self.ready = False  # set once the start-up sweep ran

    async def seal(self, uuid: str, data: bytes, peer: str) -> bytes:
        """[E2] C{data} (Talos's passphrase) sealed for the node.

        @raise Refused: see L{fleetd.kms.reasons}.
        """
        return await self._answer(SEAL, uuid, data, peer)

    async def unseal(self, uuid: str, data: bytes, peer: str) -> bytes:
        """The passphrase of a blob fleetd sealed for this node [E1] [E3].

        @raise Refused: see L{fleetd.kms.reasons}.
        """
        started = self.clock.seconds()
        try:
            return await self._answer(UNSEAL, uuid, data, peer)
        finally:
            self.metrics.unlock.observe(max(0.0, self.clock.seconds() - started))

    async def _answer(self, method: str, uuid: str, data: bytes, peer: str) -> bytes:
        host = normalHost(peer)
        device: str | None = None
        try:
            if not self.ready:
                raise Refused(STARTING, "fleetd is starting; retry shortly")
            uuid = normalUUID(uuid)
            node = await self._device(uuid)
            device = node.name
            if node.status is DeviceStatus.DECOMMISSIONING:
                raise Refused(
                    RETIRED, "this node is retired; its disk key is destroyed"
                )
            if method == SEAL:
                answer = await self._seal(node, data, host)
            else:
                answer = await self._unseal(node, data, host)
        except Refused as refused:
            self._refused(method, refused, host, device, uuid)
            raise
        self.metrics.answered.labels(method).inc()
        return answer

    async def _device(self, uuid: str) -> Device:
        name = self.uuids.deviceByUUID(uuid)
        try:
            device = None if name is None else await self.inventory.get(name)
        except InventoryError as e:
            if e.kind == "unavailable":
                raise Refused(BUSY, "the inventory cannot be asked now") from e
            raise
        if device is None or device.uuid != uuid:
            raise Refused(UNKNOWN_NODE, "no device of the inventory has this uuid")
        return device

    async def _seal(self, device: Device, data: bytes, peer: str) -> bytes:
        if len(data) != blob.PASSPHRASE_SIZE:
            raise Refused(
                MALFORMED,
                f"data: a passphrase of {blob.PASSPHRASE_SIZE} bytes, not {len(data)}",
            )
        at = self.clock.seconds()

        def work(db: Database, record: Recorder) -> _Key:
            node = allowed(db, device, peer, self.approved)
            return self._keyFor(db, record, node, peer, at)

        key = await self._database(self.journal.change(work))
        if key.created:
            self.watch.state(device.name, SEALED)
        if key.superseded:  # after their commit, outside the database [E3]
            self.metrics.destroyed.labels(SUPERSEDED).inc(len(key.superseded))
            self.record.add(key.superseded)
        return blob.seal(key.kek, key.keyId, device.uuid, data)

    def _keyFor(
        self, db: Database, record: Recorder, node: Allowed, peer: str, at: float
    ) -> _Key:
        """The node's key for its generation, made if it has none; the
        older generations' keys destroyed with it [E3]."""
        live = store.liveKeys(db, node.device)
        for row in live:
            if row.generation == node.generation and row.uuid == node.uuid:
                keyId = bytes.fromhex(row.id)
                assert row.wrapped is not None
                return _Key(keyId, self._unwrap(keyId, row))
        keyId, kek = blob.newKeyId(), blob.newKey()
        name = keyId.hex()
        store.insertKey(
            db,
            keyId=name,
            device=node.device,
            uuid=node.uuid,
            generation=node.generation,
            wrapped=blob.wrap(self._wrapping, keyId, node.device, node.uuid, kek),
            at=at,
        )
        record(
            "kms.key-created",
            actor=f"node:{node.device}",
            device=node.device,
            run=node.generation or None,
            fields={"kek_id": name, "peer": peer},
        )
        for old in live:
            store.destroyKey(db, old.id, at, SUPERSEDED)
            record(
                "kms.key-destroyed",
                actor="fleetd",
                device=node.device,
                run=old.generation or None,
                fields={"kek_id": old.id, "why": SUPERSEDED, "by_kek": name},
            )
        superseded = [destroyedRow(old, SUPERSEDED, at) for old in live]
        return _Key(keyId, kek, created=True, superseded=superseded)

    def _unwrap(self, keyId: bytes, row: store.KeyRow) -> bytes:
        assert row.wrapped is not None
        try:
            return blob.unwrap(self._wrapping, keyId, row.device, row.uuid, row.wrapped)
        except blob.BlobError as e:
            # Another master key, or a row moved: the key cannot be used.
            raise Refused(BLOB_REJECTED, str(e)) from None

    async def _unseal(self, device: Device, data: bytes, peer: str) -> bytes:
        try:
            header = blob.header(data)
        except blob.BlobError as e:
            raise Refused(BLOB_REJECTED, str(e)) from None

        def read(db: Database) -> store.KeyRow | None:
            allowed(db, device, peer, self.approved)
            return store.keyById(db, header.keyName)

        row = await self._database(self.runner.run(read))
        if row is None or row.device != device.name or row.uuid != device.uuid:
            raise Refused(UNKNOWN_KEY, "the sealed blob names no key of this node")
        if row.wrapped is None:
            raise Refused(KEY_DESTROYED, "this node's disk key was destroyed")
        kek = self._unwrap(header.keyId, row)
        try:
            answer = blob.unseal(kek, device.uuid, data)
        except blob.BlobError as e:
            raise Refused(BLOB_REJECTED, str(e)) from None
        self.watch.unlocked(device.name, self.clock.seconds())
        return answer

    async def view(self, device: str) -> dict[str, Any]:
        """
        C{device}'s disk key for its status report (issue 30, item 6):
        the state (none, sealed, destroyed) and since when, its last
        unlock and its refusals.
        """
        key = await self.runner.run(lambda db: store.lastKey(db, device))
        return self.watch.view(device, key)

    async def _database(self, d: Deferred[_T]) -> _T:
        """Await database work; a refusal decided there passes, any other
        failure (the database or journal down) is C{busy}."""
        try:
            return await d
        except Refused:
            raise
        except Exception as e:
            self.log.failure("kms.database-failed", failure=Failure())
            raise Refused(BUSY, "fleetd cannot use its database now") from e

    def _refused(
        self, method: str, refused: Refused, peer: str, device: str | None, uuid: str
    ) -> None:
        self.metrics.refusals.labels(refused.reason).inc()
        if device is not None:
            self.watch.refused(device, refused.reason, self.clock.seconds())
        skipped = self.throttle.admit(sourceKey(peer), refused.reason)
        if skipped is None:
            return
        self.log.info(
            "kms.refused {method} {reason} {peer}",
            method=method, reason=refused.reason, peer=peer, device=device,
        )  # fmt: skip
        self.journal.append(
            "kms.refused",
            actor=f"node:{device}" if device else "kms",
            device=device,
            fields={
                "method": method,
                "reason": refused.reason,
                "detail": refused.detail,
                "peer": peer,
                "node_uuid": "".join(c for c in uuid[:64] if c.isprintable()),
                "not_journaled": skipped,
            },
        ).addErrback(self._notJournaled)

    def _notJournaled(self, failure: Failure) -> None:
        self.log.failure("kms.refusal-not-journaled", failure=failure)
