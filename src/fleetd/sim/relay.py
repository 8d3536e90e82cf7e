"""
A node's tink agent from the node's own loopback address.

grpcio cannot bind a client's source address (only a C++ socket mutator
can), so each node's grpc channel goes to a unix socket of its own, and
this relay opens, for each connection accepted there, a TCP connection to
fleetd's Tink listener bound to the node's address, relaying bytes both
ways: TLS stays end to end (the channel names fleetd's certificate with
C{grpc.ssl_target_name_override}), and fleetd's per-source limits see one
source per node, as in a rack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from twisted.internet.interfaces import IListeningPort
from twisted.protocols.portforward import ProxyFactory, ProxyServer

from fleetd.sim.daemon import ENROLLMENT, Fleetd
from fleetd.testing.tinkagent import OPTIONS


class _BoundProxyServer(ProxyServer):
    """Each accepted connection relayed from the factory's source address."""

    factory: Relay

    def connectionMade(self) -> None:
        self.transport.pauseProducing()  # nothing read until the peer is there
        self.factory.open.add(self)
        client = self.clientProtocolFactory()
        client.setServer(self)
        host, port = self.factory.upstream()
        self.factory.reactor.connectTCP(
            host, port, client, bindAddress=(self.factory.source, 0)
        )

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.open.discard(self)
        super().connectionLost(reason)  # type: ignore[no-untyped-call]


class Relay(ProxyFactory):
    """
    Listens on C{path}; relays to C{upstream()} (read per connection: a
    restarted fleetd may listen elsewhere) from C{source}.
    """

    protocol = _BoundProxyServer

    def __init__(
        self,
        reactor: Any,
        path: Path,
        upstream: Callable[[], tuple[str, int]],
        source: str,
    ) -> None:
        self.reactor = reactor
        self.path = path
        self.upstream = upstream
        self.target = f"unix:{path}"  # the grpc target
        self.source = source
        self.open: set[_BoundProxyServer] = set()
        self.listening: IListeningPort | None = None

    def start(self) -> None:
        """Listen on C{path} (grpc's C{target})."""
        self.listening = self.reactor.listenUNIX(str(self.path), self)

    async def stop(self) -> None:
        """Stop listening and drop what is still relayed."""
        for server in list(self.open):
            server.transport.loseConnection()
        listening, self.listening = self.listening, None
        if listening is not None:
            stopped = listening.stopListening()
            if stopped is not None:
                await stopped


def tinkRelay(rack: Any, directory: Path, source: str) -> Relay:
    """
    A node's relay to its C{rack}'s fleetd's Tink listener from C{source},
    listening in C{directory}; started (in the reactor's thread), stopped
    when the node is done (L{fleetd.sim.node.Node.run}).
    """
    fleetd: Fleetd = rack.fleetd
    relay = Relay(
        rack.clock, directory / "tink.sock", lambda: ("127.0.0.1", fleetd.tink), source
    )
    relay.start()
    return relay


def relayedChannel(
    relay: Relay,
    fleetd: Fleetd,
    extra: Sequence[tuple[str, Any]] = (),
    name: str = ENROLLMENT,
) -> grpc.Channel:
    """
    A TLS channel through C{relay} verifying C{fleetd}'s certificate for
    C{name} (by default the sim's enrollment name); C{extra}: more channel
    arguments.
    """
    credentials = grpc.ssl_channel_credentials(
        root_certificates=fleetd.pki.public_ca.read_bytes()
    )
    arguments = [*OPTIONS, ("grpc.ssl_target_name_override", name), *extra]
    return grpc.secure_channel(relay.target, credentials, options=arguments)
