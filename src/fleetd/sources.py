"""
What counts as one source: the key a peer's address is counted under.

Every per-source limit in fleetd keys peers here, so the prefix lengths
are named once:

  - the listeners (connection caps, boot and device-flow rate limits, the
    tink listener's admission) and DNS's TCP connection cap count an IPv4
    address, or an IPv6 /64 (L{HOST_IPV4_BITS}, L{HOST_IPV6_BITS}): one
    host, or one subnet's worth of addresses a single host may hold;
  - DNS response-rate limiting counts an IPv4 /24 or an IPv6 /56 by
    default (L{RRL_IPV4_BITS}, L{RRL_IPV6_BITS}; C{[dns_rate_limit]}
    C{ipv4_prefix} and C{ipv6_prefix} change them): spoofed sources spread
    over a network count as one (issue 8, item 12; design.md, Listeners).

An IPv4-mapped IPv6 address always counts as its IPv4 address, and text
that is not an address (a UNIX socket path, a test's fake address) as
itself. No I/O here.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from typing import Final

__all__ = [
    "HOST_IPV4_BITS",
    "HOST_IPV6_BITS",
    "RRL_IPV4_BITS",
    "RRL_IPV6_BITS",
    "SourcePrefix",
    "sourceKey",
]

HOST_IPV4_BITS: Final = 32
HOST_IPV6_BITS: Final = 64
RRL_IPV4_BITS: Final = 24
RRL_IPV6_BITS: Final = 56


@functools.lru_cache(maxsize=4096)
def sourceKey(host: str) -> str:
    """
    The source key of the peer address C{host}, as text (it shows in logs).

    IPv4 addresses are their own key, IPv6 addresses are grouped by /64
    (L{HOST_IPV6_BITS}; IPv4-mapped ones count as IPv4), anything else is
    used as given. Every connection and every boot request asks, so recent
    answers are remembered (a pure function of a string; 4,096 entries
    bound the memory).
    """
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, HOST_IPV6_BITS), strict=False))
    return str(address)


def _masker(bits: int, size: int) -> tuple[int, bytes]:
    """How many leading bytes to keep, and the mask for the one after them."""
    whole, rest = divmod(bits, 8)
    if rest == 0 or whole >= size:
        return min(whole, size), b""
    return whole, bytes([(0xFF << (8 - rest)) & 0xFF])


class SourcePrefix:
    """
    Map a peer's address text to the prefix it is counted under, as packed
    bytes (cheaper than L{sourceKey}'s text, for DNS's per-packet path).

    An IPv4-mapped IPv6 address counts as its IPv4 address. Text that is
    not an address (never from the kernel) counts as itself.
    """

    _MAPPED: Final = bytes(10) + b"\xff\xff"

    def __init__(self, ipv4Bits: int, ipv6Bits: int) -> None:
        self._v4 = _masker(ipv4Bits, 4)
        self._v6 = _masker(ipv6Bits, 16)

    @staticmethod
    def _cut(packed: bytes, keep: tuple[int, bytes]) -> bytes:
        whole, mask = keep
        if not mask:
            return packed[:whole]
        return packed[:whole] + bytes([packed[whole] & mask[0]])

    def __call__(self, host: str) -> bytes | str:
        try:
            if ":" not in host:
                return self._cut(socket.inet_pton(socket.AF_INET, host), self._v4)
            packed = socket.inet_pton(socket.AF_INET6, host.partition("%")[0])
        except OSError:
            return host
        if packed[:12] == self._MAPPED:
            return self._cut(packed[12:], self._v4)
        return b"6" + self._cut(packed, self._v6)
