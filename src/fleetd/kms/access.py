"""
Who may Seal and Unseal [E1], decided inside the caller's database call.

Only an inventory device whose uuid is the request's C{node_uuid}, that is
not retired (C{decommissioning}), asking from its own address (the source
of its last delivery, or its inventory address when the inventory has
one) and whose EK binding is approved [T1]. The uuid and the status are
the caller's to check (the run index and the inventory answer them); the
address and the binding are read here, with the generation a new key
belongs to: the run of the node's last delivery.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from fleetd.inventory.model import Device, InventoryError, validateUUID
from fleetd.kms.reasons import NO_ADDRESS, NOT_APPROVED, RETIRED, WRONG_ADDRESS
from fleetd.kms.store import lastDelivery, retiredSince
from fleetd.refused import MALFORMED, Refused
from fleetd.store.db import Database

Approved = Callable[[Database, str], bool]
"""Whether the chassis serial's EK binding is approved and holds now."""


@dataclass(frozen=True)
class Allowed:
    """A node allowed to ask, and the generation its key belongs to."""

    device: str
    uuid: str
    generation: str  # the run of its last delivery; "" when none


def normalUUID(text: str) -> str:
    """
    The uuid as the inventory holds it (lowercase 8-4-4-4-12): Talos sends
    the SMBIOS system uuid as text (docs/decisions.md, issue 30).

    @raise Refused: C{malformed}.
    """
    try:
        return validateUUID(text.strip())
    except InventoryError as e:
        raise Refused(MALFORMED, f"node_uuid: {e}") from None


def normalHost(text: str) -> str:
    """An address as one text: IPv4-mapped IPv6 as IPv4, IPv6 compressed."""
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return text
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return str(address)


def inventoryAddress(device: Device) -> str | None:
    """The device's address in the inventory, when the inventory has one."""
    address = getattr(device, "address", None)
    return address if isinstance(address, str) and address else None


def allowed(db: Database, device: Device, peer: str, approved: Approved) -> Allowed:
    """
    [E1] the address and the binding, for a device the caller found by
    uuid and not retired.

    @raise Refused: C{retired} (a retirement that committed since the
        caller read the device's status), C{no-address}, C{wrong-address}
        or C{ek-binding-not-approved}.
    """
    if retiredSince(db, device.name):
        raise Refused(RETIRED, "this node is retired; its disk key is destroyed")
    delivery = lastDelivery(db, device.name)
    addresses = set()
    if delivery is not None:
        addresses.add(normalHost(delivery[1]))
    address = inventoryAddress(device)
    if address is not None:
        addresses.add(normalHost(address))
    if not addresses:
        raise Refused(
            NO_ADDRESS,
            # The line names no device: the caller may be anyone.
            "this node has no delivery and no inventory address to ask from",
        )
    if normalHost(peer) not in addresses:
        # The line names no device: the caller may be anyone.
        raise Refused(WRONG_ADDRESS, "a node is answered from its own address only")
    if not approved(db, device.serial):
        raise Refused(
            NOT_APPROVED,
            f"{device.name}'s EK binding is not approved (fleetctl binding approve)",
        )
    return Allowed(device.name, device.uuid, "" if delivery is None else delivery[0])
