"""
What the inventory's answer means for a node: a device being retired is
refused, and so is every node while the inventory cannot be asked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from twisted.logger import Logger

from fleetd.inventory.model import Device, DeviceStatus, InventoryError
from fleetd.nodes import BUSY, INVENTORY_AMBIGUOUS, RETIRED, Refused


def refuseRetired(device: Device) -> None:
    """
    [R1] A device in status C{decommissioning} is refused attestation,
    renewal, its plan, its record and the disk check.

    @raise Refused: C{device-retired}.
    """
    if device.status is DeviceStatus.DECOMMISSIONING:
        raise Refused(
            RETIRED,
            f"{device.name[:64]} is being decommissioned; fleetd issues it"
            " nothing more (no LDevID, plan or disk check)",
        )


_log = Logger(namespace="fleetd.attest")

INVENTORY_BUSY = "the inventory cannot be asked now; retry later"
INVENTORY_AMBIGUOUS_LINE = (
    "the inventory holds more than one device for this machine;"
    " the owner must resolve it"
)


def busyWhileUnavailable(
    lookup: Callable[[str], Awaitable[Device | None]],
    *,
    bySerial: bool = False,
) -> Callable[[str], Awaitable[Device | None]]:
    """
    C{lookup} (the inventory's C{bySerial} or C{get}), refusing C{busy}
    while the inventory cannot be asked (NetBox down, hung, or refusing
    fleetd's token): a node's credential is never decided from a cache
    (issue 17 item 11). The line names no peer of fleetd's; the inventory
    logs and counts why. With C{bySerial}, several devices for the serial
    (a serial twice in NetBox) is refused with a line that names no
    device: the inventory's message names them all, and the other devices
    are none of the caller's business (issue 17 item 12). A name's
    duplicates share the caller's own name, so that line stays.

    @raise Refused: C{busy} (503, with Retry-After at the listener), or
        C{inventory-ambiguous} (409).
    """

    async def asked(key: str) -> Device | None:
        try:
            return await lookup(key)
        except InventoryError as e:
            if e.kind == "unavailable":
                raise Refused(BUSY, INVENTORY_BUSY) from e
            if bySerial and e.kind == "duplicate":
                _log.warn(
                    "attest.inventory-ambiguous {key}: {why}", key=key, why=str(e)
                )
                raise Refused(INVENTORY_AMBIGUOUS, INVENTORY_AMBIGUOUS_LINE) from e
            raise

    return asked
