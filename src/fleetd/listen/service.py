"""
One stream listener as a service: it binds in C{privilegedStartService}
and, on stop, stops what it serves (C{onStop}), stops listening and drops
the connections still open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from OpenSSL import crypto
from prometheus_client import CollectorRegistry
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IReactorCore
from twisted.internet.ssl import CertificateOptions
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.listen.connections import LimitedFactory
from fleetd.listen.selfcheck import Target
from fleetd.listen.tls import ServerConnections, tlsFactory
from fleetd.metrics import listenerGauges
from fleetd.reactors import IListenerReactor


class StartupError(Exception):
    """fleetd cannot start; the message is one line naming the cause."""


class ListenerService(Service):
    """Bind one stream endpoint in C{privilegedStartService}."""

    log = Logger()

    def __init__(
        self,
        reactor: IReactorCore,
        name: str,
        description: str,
        factory: LimitedFactory,
        onStop: Callable[[], object] = lambda: None,
        onListening: Callable[[IListeningPort], object] = lambda port: None,
    ):
        """
        @param onStop: stops the work behind the listener (timers, transfers
            in flight), called first when the listener stops.
        @param onListening: told the port once bound (its number is known).
        """
        self.reactor = reactor
        self.setName(name)
        self.description = description
        self.factory = factory
        self.onStop = onStop
        self.onListening = onListening
        self.port: IListeningPort | None = None

    def privilegedStartService(self) -> None:
        endpoint = serverFromString(self.reactor, self.description)
        outcome: list[Any] = []
        endpoint.listen(self.factory).addBoth(outcome.append)
        if not outcome or isinstance(outcome[0], Failure):
            reason = outcome[0].getErrorMessage() if outcome else "did not bind"
            raise StartupError(
                f"listen.{self.name}: cannot listen on {self.description}: {reason}"
            )
        self.port = outcome[0]
        self.log.info(
            "listen.started {listener} {address}",
            listener=self.name,
            address=self.port.getHost(),
        )
        self.onListening(self.port)
        super().privilegedStartService()

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        self.onStop()
        port, self.port = self.port, None
        if port is None:
            return None
        stopped: list[Deferred[Any]] = [
            maybeDeferred(port.stopListening),
            self.factory.closeAll(),
        ]
        return DeferredList(stopped, consumeErrors=True).addCallback(lambda _: None)


class Listeners:
    """
    fleetd's stream listeners, built alike: TLS, then the connection
    limits, the open/max gauges and one L{ListenerService} each.
    """

    def __init__(
        self,
        reactor: IListenerReactor,
        registry: CollectorRegistry,
        *,
        maxConnections: int,
        maxPerSource: int | None,
        idleTimeout: float,
    ) -> None:
        self.reactor = reactor
        self.maxConnections = maxConnections
        self.maxPerSource = maxPerSource
        self.idleTimeout = idleTimeout
        self.openGauge, self.maxGauge = listenerGauges(registry)
        self.services: dict[str, ListenerService] = {}
        self.tls: dict[str, ServerConnections] = {}
        self.protocols: dict[str, bytes] = {}

    def add(
        self,
        name: str,
        description: str,
        options: CertificateOptions,
        factory: IProtocolFactory,
        *,
        idleTimeout: float | None = None,
        protocol: bytes = b"http/1.1",
        onStop: Callable[[], object] = lambda: None,
        onListening: Callable[[IListeningPort], object] = lambda port: None,
    ) -> ListenerService:
        """The listener C{name} on C{description}, serving C{factory}
        behind TLS C{options} (C{protocol} chosen by ALPN); the caller
        gives it its parent."""
        connections = self.tls[name] = ServerConnections(options)
        self.protocols[name] = protocol
        limited = tlsFactory(
            connections,
            factory,
            name=name,
            clock=self.reactor,
            maxConnections=self.maxConnections,
            maxPerSource=self.maxPerSource,
            idleTimeout=idleTimeout or self.idleTimeout,
        )
        self.openGauge.labels(name).set_function(limited.openConnections)
        self.maxGauge.labels(name).set(limited.maxConnections)
        listener = ListenerService(
            self.reactor, name, description, limited, onStop, onListening
        )
        self.services[name] = listener
        return listener

    def reloadTLS(self, build: Callable[[str], CertificateOptions]) -> list[str]:
        """
        Read every TLS listener's certificate and key again (C{build(name)},
        which raises L{fleetd.config.ConfigError} on a bad file) and, only
        when all of them load, use them for new connections; return the
        listeners' names. Open connections keep theirs.
        """
        fresh = {name: build(name) for name in self.tls}
        for name, options in fresh.items():
            self.tls[name].replace(options)
        return list(fresh)

    def targets(self) -> dict[str, Target]:
        """Each listener as its self-check sees it now: where it is bound,
        what ALPN chooses there and the certificate it presents."""
        return {
            name: Target(
                None if listener.port is None else listener.port.getHost(),
                self.protocols[name],
                _der(self.tls[name].options.certificate),
            )
            for name, listener in self.services.items()
        }

    def unbind(self) -> None:
        """Start-up failed: close the listeners bound so far, last first."""
        for listener in reversed(self.services.values()):
            listener.stopService()


def _der(certificate: crypto.X509 | None) -> bytes:
    return (
        b""
        if certificate is None
        else crypto.dump_certificate(crypto.FILETYPE_ASN1, certificate)
    )
