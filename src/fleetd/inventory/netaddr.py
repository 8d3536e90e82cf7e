"""
A device's network identities: its NICs' MAC addresses and its one
inventory address (the IPv4 or IPv6 address its node speaks from, which
the disk-key service may check a request's source against, issue 30).
Each validator gives the canonical text or raises an L{InventoryError}
naming the field.
"""

from __future__ import annotations

import ipaddress
import re

from fleetd.inventory.errors import InventoryError, nonEmptyString, shown

_MAC = re.compile(
    r"[0-9a-f]{12}|[0-9a-f]{2}(:[0-9a-f]{2}){5}|[0-9a-f]{2}(-[0-9a-f]{2}){5}"
)

# What a node's own address can never be, in the words of the refusal.
_NOT_A_NODES = (
    ("is_unspecified", "the unspecified address"),
    ("is_loopback", "a loopback address"),
    ("is_multicast", "a multicast address"),
    ("is_link_local", "a link-local address (it needs an interface to mean anything)"),
    ("is_reserved", "a reserved address"),
)


def validateMAC(value: object) -> str:
    """A unicast MAC address, in lowercase colon form."""
    text = nonEmptyString("mac", value).lower()
    if _MAC.fullmatch(text) is None:
        raise InventoryError(
            f"mac: {shown(value)} is not a MAC address"
            " (aa:bb:cc:dd:ee:ff, aa-bb-cc-dd-ee-ff or aabbccddeeff)"
        )
    digits = text.replace(":", "").replace("-", "")
    mac = ":".join(digits[i : i + 2] for i in range(0, 12, 2))
    if int(digits[:2], 16) & 1:
        raise InventoryError(f"mac: {mac} is a multicast address, not a NIC's")
    if digits == "0" * 12:
        raise InventoryError(f"mac: {mac} is the all-zero address")
    return mac


def validateAddress(value: object) -> str:
    """
    A node's IPv4 or IPv6 address, without a prefix length, in its
    canonical text (IPv6 compressed and lowercase; an IPv4-mapped IPv6
    address as the IPv4 address it maps, which is what a dual-stack socket
    reports for an IPv4 peer). An address no node can speak from is
    refused: unspecified, loopback, multicast, link-local, reserved (the
    IPv4 broadcast address among them).
    """
    text = nonEmptyString("address", value)
    if "/" in text:
        raise InventoryError(
            f"address: {shown(value)} has a prefix length; give the address alone"
        )
    if "%" in text:
        raise InventoryError(
            f"address: {shown(value)} has a zone; give a routable address"
        )
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise InventoryError(
            f"address: {shown(value)} is not an IPv4 or IPv6 address"
        ) from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    for attribute, what in _NOT_A_NODES:
        if getattr(address, attribute):
            raise InventoryError(
                f"address: {address} is {what}, not a node's own address"
            )
    return str(address)
