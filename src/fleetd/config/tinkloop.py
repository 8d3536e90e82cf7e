"""
C{tink.upstream} must not be fleetd's own tink listener (issue 27, item 6).

When tink-server runs on the same host as fleetd, both want port 42113:
an upstream that names the address fleetd's C{listen.tink} accepts on
would make fleetd proxy every agent's call to itself. L{checkTinkLoop}
refuses that at start, with one line naming both keys.

The decision is made from the values alone (no name is resolved): an
upstream host is the listener's address when it is that address, or when
the listener binds a wildcard (C{tcp:42113} is every IPv4 address of the
host, C{tcp6:42113} every address) and the host is one of this host's
own: a loopback or unspecified address, C{localhost}, the host's name,
the topology's C{SPORE_IP} or C{SPORE_BOOTSTRAP_IP}, or the enrollment
name (which resolves to C{SPORE_BOOTSTRAP_IP} [A5]). Any other name could
be anywhere and is left alone.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from twisted.internet.endpoints import (
    TCP4ServerEndpoint,
    TCP6ServerEndpoint,
    serverFromString,
)

from fleetd.topology import ConfigError, Topology

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


@dataclass(frozen=True)
class Bound:
    """Where a TCP listener accepts: its port, its address (None: a wildcard)
    and whether it takes IPv6 as well (a C{tcp6:} wildcard takes both)."""

    port: int
    address: Address | None
    ipv6: bool


def bound(description: str) -> Bound | None:
    """A C{tcp:}/C{tcp6:} endpoint description's L{Bound}; None for others."""
    endpoint = serverFromString(None, description)
    if not isinstance(endpoint, TCP4ServerEndpoint | TCP6ServerEndpoint):
        return None
    port: int = getattr(endpoint, "_port")  # noqa: B009 (Twisted keeps it private)
    interface: str = getattr(endpoint, "_interface")  # noqa: B009
    ipv6 = isinstance(endpoint, TCP6ServerEndpoint)
    if interface in ("", "0.0.0.0", "::"):
        return Bound(port, None, ipv6)
    if interface.lower() == "localhost":
        return Bound(port, LOOPBACK[1] if ipv6 else LOOPBACK[0], ipv6)
    addresses = _addresses(interface, {})
    if not addresses:
        return None  # a name Twisted resolves when it listens: cannot tell
    return Bound(port, addresses.pop(), ipv6)


def _addresses(host: str, names: dict[str, set[Address]]) -> set[Address]:
    """The addresses C{host} stands for, from C{names} or as an address."""
    lowered = host.strip("[]").lower().rstrip(".")
    if lowered == "localhost":
        return set(LOOPBACK)
    if lowered in names:
        return names[lowered]
    try:
        address = ipaddress.ip_address(lowered)
    except ValueError:
        return set()
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return {address.ipv4_mapped}
    return {address}


def _local(address: Address, own: Iterable[Address]) -> bool:
    return address.is_loopback or address.is_unspecified or address in set(own)


def loops(
    listen: Bound, host: str, port: int, topology: Topology, hostname: str = ""
) -> bool:
    """Whether C{host}:C{port} reaches the listener C{listen} on this host."""
    if port != listen.port or listen.port == 0:
        return False
    own = {
        ipaddress.ip_address(a)
        for a in (topology.spore_ip, topology.spore_bootstrap_ip)
    }
    names: dict[str, set[Address]] = {
        topology.enrollment_name: {ipaddress.ip_address(topology.spore_bootstrap_ip)},
    }
    if hostname:
        names[hostname.lower()] = set(own) | set(LOOPBACK)
    targets = _addresses(host, names)
    if listen.address is None:
        return any(_local(t, own) and (listen.ipv6 or t.version == 4) for t in targets)
    return any(
        t == listen.address or (t.is_unspecified and listen.address.is_loopback)
        for t in targets
    )


def checkTinkLoop(
    listenTink: str, upstream: str, topology: Topology, hostname: str = ""
) -> None:
    """Refuse a C{tink.upstream} that is fleetd's own C{listen.tink}."""
    listen = bound(listenTink)
    if listen is None:
        return
    _, _, rest = upstream.strip().partition(":")
    host, _, port = rest.rpartition(":")
    if not port.isdigit():
        return
    if loops(listen, host, int(port), topology, hostname):
        raise ConfigError(
            "tink.upstream",
            f"{upstream} is fleetd's own tink listener (listen.tink ="
            f" {listenTink!r}): fleetd would proxy to itself; when tink-server"
            " runs on this host, move it to another port (docs/install.md,"
            ' "tink-server on the same host")',
        )
