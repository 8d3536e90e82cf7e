"""
A node's own record and install plan, for the device listener [T2].

The plan names the target disk by serial (the disk check's choice), the
installer image, and, when the node has a ready run and a target disk
[D1], the code to write to META 0x0b; without a target disk the code is
withheld and C{meta_0x0b_withheld} says why (the disk check's reason). A
device being decommissioned gets neither record nor plan [R1], and a
node whose LDevID came from attestation gets its plan only while that
EK's binding still holds [T1]. Codes are stored in the database only as
keyed digests; the plan reads the code from the volatile vault, where
the provision wrote it beside the run's configuration (the same secret
class, the same life: both go when the run is delivered, superseded, or
the host reboots).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import yaml

from fleetd import nodes as E
from fleetd.attest.identity import LDevIDBook, Peer
from fleetd.attest.inventory import busyWhileUnavailable, refuseRetired
from fleetd.attest.service import AttestationService
from fleetd.inventory.model import REFUSED_CLASSES, Device
from fleetd.nodes import NodeIdentity, Refused
from fleetd.runs.vaultnames import codeName, configName
from fleetd.store.runner import IRunner
from fleetd.vault import IVault, VaultError


class TargetDiskFor(Protocol):
    """The serial of the disk the node installs to, or L{None} (disk check)."""

    def __call__(self, db: sqlite3.Connection, device: str) -> str | None: ...


class DiskRefusal(Protocol):
    """Why the node has no target disk, C{"<code>: <why>"} (disk check)."""

    def __call__(self, db: sqlite3.Connection, device: str) -> str: ...


def _noDiskReason(db: sqlite3.Connection, device: str) -> str:
    return f"{E.NO_TARGET_DISK}: no target disk is known for {device}"


class ReadyRuns(Protocol):
    def readyRun(self, device: str) -> str | None: ...


def _image(config: bytes | None) -> str | None:
    """C{machine.install.image} of a rendered configuration, if it has one."""
    if not config:
        return None
    try:
        for doc in yaml.safe_load_all(config):
            image = ((doc or {}).get("machine") or {}).get("install", {}).get("image")
            if isinstance(image, str):
                return image
    except (yaml.YAMLError, AttributeError):
        return None
    return None


class LookupService:
    def __init__(
        self,
        *,
        runner: IRunner,
        attestation: AttestationService,
        book: LDevIDBook,
        getDevice: Callable[[str], Awaitable[Device | None]],
        runs: ReadyRuns,
        vault: IVault,
        targetDiskFor: TargetDiskFor,
        diskRefusal: DiskRefusal = _noDiskReason,
    ) -> None:
        self._runner = runner
        self._attestation = attestation
        self._book = book
        self._getDevice = busyWhileUnavailable(getDevice)
        self._runs = runs
        self._vault = vault
        self._targetDiskFor = targetDiskFor
        self._diskRefusal = diskRefusal

    async def _device(self, peer: Peer, asked: str | None) -> Device:
        ident = peer.identity
        if asked is not None and asked != ident.device:
            raise await self._attestation.refuse(
                Refused(E.NOT_YOURS, "a node may look up only its own record"),
                device=ident.device,
                asked=asked[:128],
            )
        return await self.admit(ident)

    async def admit(self, ident: NodeIdentity) -> Device:
        """
        The inventory device C{ident} names, unless it is being
        decommissioned (refused, journaled) [R1].

        @raise Refused: C{device-unknown} or C{device-retired}.
        """
        device = await self._getDevice(ident.device)
        if device is None or device.serial.lower() != ident.serial.lower():
            raise Refused(E.UNKNOWN_DEVICE, "no inventory device matches this LDevID")
        try:
            refuseRetired(device)
        except Refused as refusal:
            raise await self._attestation.refuse(
                refusal, device=device.name, serial=device.serial
            ) from None
        return device

    async def _bindingHolds(self, peer: Peer, device: Device) -> None:
        """[T1] An attested node's EK binding still names its serial."""
        current = self._book.current(device.serial)
        if peer.legacy or current is None or current.ek_sha256 is None:
            return  # legacy LDevIDs: accepted until the node attests [T4]
        ek = current.ek_sha256
        try:
            await self._runner.run(
                lambda db: self._attestation.bindingHolds(
                    db.connection, ek, device.serial
                )
            )
        except Refused as refusal:
            raise await self._attestation.refuse(
                refusal, device=device.name, serial=device.serial, ek_sha256=ek
            ) from None

    async def record(self, peer: Peer, asked: str | None = None) -> dict[str, Any]:
        """The node's inventory record and LDevID."""
        device = await self._device(peer, asked)
        current = self._book.current(device.serial)
        return {
            "device": device.toJSON(),
            "ldevid": {
                "issuer": peer.issuer,
                "legacy": peer.legacy,
                "not_after": peer.cert.not_valid_after_utc.timestamp(),
                "record": None if current is None else current.toJSON(),
            },
        }

    async def plan(self, peer: Peer, asked: str | None = None) -> dict[str, Any]:
        """The install plan; refuses classes that cannot install [T2]."""
        device = await self._device(peer, asked)
        if device.device_class in REFUSED_CLASSES:
            raise await self._attestation.refuse(
                Refused(E.CLASS_REFUSED, f"class {device.device_class} cannot install"),
                device=device.name,
            )
        await self._bindingHolds(peer, device)
        name = device.name

        def disks(db: Any) -> tuple[str | None, str | None]:
            disk = self._targetDiskFor(db.connection, name)
            why = None if disk is not None else self._diskRefusal(db.connection, name)
            return disk, why

        disk, noDisk = await self._runner.run(disks)
        run = self._runs.readyRun(name)
        code = config = None
        withheld = None
        if run is not None and disk is None:
            # [D1] No code before the node has a disk it can be installed to.
            withheld = (noDisk or E.NO_TARGET_DISK)[:300]
            try:
                config = self._vault.get(configName(run))
            except VaultError:
                config = None
        elif run is not None:
            try:
                raw = self._vault.get(codeName(run))
                config = self._vault.get(configName(run))
            except VaultError:
                raw = None
            code = None if raw is None else raw.decode("ascii", "replace")
        return {
            "device": name,
            "serial": device.serial,
            "target_disk_serial": disk,
            "image": _image(config),
            "run": run if code is not None else None,
            "meta_0x0b": code,
            "meta_0x0b_withheld": withheld,
        }
