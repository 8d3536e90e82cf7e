"""
The DNS fallback responder as a Twisted service: UDP and TCP on one port [A5].

Responses over UDP are rate limited per source prefix when C{rateLimit} is
enabled (L{fleetd.dns.ratelimit}); TCP connections are capped in total and
per source.

The topology given at construction was validated at start-up [A1];
L{DNSService.reloadTopology} (SIGHUP) swaps in a new one, or keeps the old
answers and logs why when the new file is bad.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.application.service import Service
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import (
    IListeningPort,
    IReactorTCP,
    IReactorTime,
    IReactorUDP,
)
from twisted.logger import Logger

from fleetd.config import ConfigError, DNSRateLimit, Settings, Topology, loadTopology
from fleetd.dns.metrics import DNSMetrics
from fleetd.dns.protocol import DNSDatagramProtocol, DNSStreamFactory
from fleetd.dns.ratelimit import ResponseRateLimiter
from fleetd.dns.responder import Responder
from fleetd.dns.udp import listenUDP

UDP_READ_BYTES = 1024
"""
At most this many bytes of datagrams are read in one reactor turn: some 30
queries, half a millisecond or so. Twisted's default is 256 KiB, some 8,000
queries, a tenth of a second and more of one turn under a flood, during
which the boot listener waits. Beyond it the reactor serves the other
listeners first, and when a flood outruns fleetd the kernel drops the
excess from the socket buffer, which costs fleetd nothing.
"""


def portNumber(port: IListeningPort) -> int:
    """The port number C{port} listens on."""
    host = port.getHost()
    assert isinstance(host, IPv4Address | IPv6Address)
    return host.port


class DNSService(Service):
    """
    Serve the enrollment name on UDP and TCP C{port} of C{interface}.

    With C{port} 0 the TCP listener takes the port UDP got when it is free,
    else another; C{udpPort} and C{tcpPort} tell which.

    @param clock: the rate limiter's and the TCP idle timers' clock; the
        reactor when not given.
    """

    log = Logger()

    def __init__(
        self,
        reactor: IReactorUDP,
        topology: Topology,
        *,
        port: int,
        interface: str,
        ttl: int,
        registry: CollectorRegistry,
        topologyLoader: Callable[[], Topology],
        maxConnections: int = 256,
        idleTimeout: float = 10.0,
        maxMessage: int = 4096,
        maxConnectionsPerSource: int | None = None,
        rateLimit: DNSRateLimit | None = None,
        clock: IReactorTime | None = None,
    ) -> None:
        self._udpReactor = reactor
        self._tcpReactor = IReactorTCP(reactor)
        self._clock = IReactorTime(reactor) if clock is None else clock
        self._port = port
        self._interface = interface
        self._ttl = ttl
        self._loader = topologyLoader
        metrics = DNSMetrics(registry)
        self.responder = self._responderFor(topology)
        rateLimit = DNSRateLimit() if rateLimit is None else rateLimit
        self.limiter = (
            ResponseRateLimiter(rateLimit, self._clock) if rateLimit.enabled else None
        )
        self._udp = DNSDatagramProtocol(
            self.responder, metrics.forTransport("udp"), self.limiter
        )
        self._tcp = DNSStreamFactory(
            self.responder,
            metrics.forTransport("tcp"),
            self._clock,
            maxConnections=maxConnections,
            idleTimeout=idleTimeout,
            maxMessage=maxMessage,
            maxPerSource=maxConnectionsPerSource,
        )
        self.udpPort: IListeningPort | None = None
        self.tcpPort: IListeningPort | None = None

    @classmethod
    def fromSettings(
        cls, reactor: IReactorUDP, settings: Settings, registry: CollectorRegistry
    ) -> DNSService:
        """The daemon's DNS service, named C{dns}: C{listen.dns_*}, C{dns_*}
        and the connection limits; the topology reloads from its file."""
        s = settings
        service = cls(
            reactor,
            s.topology,
            port=s.listen.dns_port,
            interface=s.listen.dns_interface,
            ttl=s.dns_ttl,
            registry=registry,
            topologyLoader=lambda: loadTopology(s.topology_file),
            maxConnections=s.limits.max_connections,
            idleTimeout=s.limits.idle_timeout,
            maxConnectionsPerSource=s.limits.max_connections_per_source,
            rateLimit=s.dns_rate_limit,
        )
        service.setName("dns")  # type: ignore[no-untyped-call]
        return service

    def _responderFor(self, topology: Topology) -> Responder:
        return Responder(topology, self._ttl, serial=int(self._clock.seconds()))

    @property
    def topology(self) -> Topology:
        """The topology currently answered from."""
        return self.responder.topology

    def startService(self) -> None:
        udpPort = listenUDP(
            self._udpReactor,
            self._port,
            self._udp,
            interface=self._interface,
            maxPacketSize=8192,
        )
        if hasattr(udpPort, "maxThroughput"):
            udpPort.maxThroughput = UDP_READ_BYTES
        try:
            tcpPort = self._tcpReactor.listenTCP(
                portNumber(udpPort), self._tcp, interface=self._interface
            )
        except CannotListenError:
            if self._port != 0:
                udpPort.stopListening()
                raise
            tcpPort = self._tcpReactor.listenTCP(
                0, self._tcp, interface=self._interface
            )
        self.udpPort, self.tcpPort = udpPort, tcpPort
        super().startService()  # type: ignore[no-untyped-call]
        self.log.info(
            "dns.listening {interface} udp {udp} tcp {tcp} for {name}",
            interface=self._interface or "*",
            udp=portNumber(udpPort),
            tcp=portNumber(tcpPort),
            name=self.topology.enrollment_name,
        )

    def stopService(self) -> Deferred[None]:
        """Close both ports and drop every TCP connection."""
        super().stopService()  # type: ignore[no-untyped-call]
        waiting: list[Deferred[Any]] = []
        for port in (self.udpPort, self.tcpPort):
            if port is not None:
                waiting.append(maybeDeferred(port.stopListening))
        self.udpPort = self.tcpPort = None
        waiting.append(self._tcp.dropAll())
        return gatherResults(waiting).addCallback(lambda _: None)

    def reloadTopology(self) -> None:
        """
        Answer from the topology C{topologyLoader} returns now.

        A file that does not load keeps the current answers; the reason is
        logged as C{dns.reload.rejected}.
        """
        try:
            topology = self._loader()
            responder = self._responderFor(topology)
        except ConfigError as e:
            self.log.warn(
                "dns.reload.rejected {problem}",
                problem=str(e),
                setting=e.key,  # "key" would be redacted as a secret name
                kept=self.topology.spore_bootstrap_ip,
            )
            return
        except Exception:
            self.log.failure("dns.reload.failed")
            return
        old = self.topology
        self.responder = self._udp.responder = self._tcp.responder = responder
        self.log.info(
            "dns.reload.accepted {name} {address}",
            name=topology.enrollment_name,
            address=topology.spore_bootstrap_ip,
            previous=old.spore_bootstrap_ip,
        )
