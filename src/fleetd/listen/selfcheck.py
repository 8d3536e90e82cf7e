"""
fleetd as its own client: a TLS handshake with ALPN against each of its
TLS listeners, at start and then periodically, so that "ready" means a
client can connect (issue 27, item 2).

Each round connects to every listener's bound address (loopback of the
same family for a wildcard bind), offers the listener's protocol by ALPN
(C{h2} on tink, C{http/1.1} on the HTTP listeners), and passes when the
handshake completes, the listener chose that protocol and presented its
configured certificate; then it closes, having sent no request. The
result of each listener goes to C{report} (L{fleetd.readiness.Readiness}).
Rounds follow one another every L{INTERVAL} seconds while every listener
passes, every L{RETRY} seconds while one does not (and until the first
pass), each connection bounded by L{TIMEOUT}.

The client side uses no Python callback in OpenSSL (no verify, info or
ALPN hooks, which cffi would need writable and executable memory for):
a refusal names the listener, never the checker.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from OpenSSL import SSL, crypto
from twisted.application.service import Service
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import CancelledError, Deferred, DeferredList, TimeoutError
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import (
    IAddress,
    IHandshakeListener,
    IOpenSSLClientConnectionCreator,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from zope.interface import implementer

from fleetd.reactors import IHTTPClientReactor

INTERVAL = 60.0  # seconds between rounds while every listener passes
RETRY = 5.0  # seconds between rounds while one fails, and until the first pass
TIMEOUT = 10.0  # seconds for one connection and its handshake


@dataclass(frozen=True)
class Target:
    """
    One listener to check.

    @ivar address: where it is bound (its port's C{getHost()}), L{None}
        while it is not.
    @ivar protocol: what a client offers by ALPN and must be given.
    @ivar certificate: the DER of the certificate it must present.
    """

    address: IAddress | None
    protocol: bytes
    certificate: bytes


class SelfCheckFailed(Exception):
    """The listener did not complete the handshake a client expects."""


@implementer(IOpenSSLClientConnectionCreator)
class _Client:
    """TLS 1.2+ client connections offering one protocol by ALPN."""

    def __init__(self, protocol: bytes) -> None:
        self._context = SSL.Context(SSL.TLS_CLIENT_METHOD)
        self._context.set_min_proto_version(SSL.TLS1_2_VERSION)
        self._context.set_alpn_protos([protocol])

    def clientConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:
        return SSL.Connection(self._context, None)


@implementer(IHandshakeListener)
class _Handshake(Protocol):
    """Fire C{done} with (protocol chosen, peer certificate) and close."""

    def __init__(self, done: Deferred[tuple[bytes | None, bytes | None]]) -> None:
        self.done = done

    def handshakeCompleted(self) -> None:
        transport: Any = self.transport
        peer = transport.getPeerCertificate()
        der = (
            None
            if peer is None
            else crypto.dump_certificate(crypto.FILETYPE_ASN1, peer)
        )
        self.done.callback((transport.negotiatedProtocol, der))
        transport.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if not self.done.called:
            self.done.errback(reason)


def loopback(address: IAddress) -> str:
    """The host to connect to for C{address}: loopback for a wildcard bind."""
    host = getattr(address, "host", "")
    if isinstance(address, IPv6Address):
        return "::1" if host in ("::", "") else host
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _endpoint(
    reactor: IHTTPClientReactor, address: IAddress, timeout: float
) -> IStreamClientEndpoint:
    if isinstance(address, IPv4Address):
        return TCP4ClientEndpoint(reactor, loopback(address), address.port, timeout)
    if isinstance(address, IPv6Address):
        return TCP6ClientEndpoint(reactor, loopback(address), address.port, timeout)
    raise SelfCheckFailed(f"cannot connect to {address}")


def _why(f: Failure) -> str:
    """One line for a failed handshake."""
    if f.check(SSL.Error):
        args = getattr(f.value, "args", ())
        errors = args[0] if args else []
        reasons = [e[2] for e in errors if isinstance(e, tuple) and len(e) == 3]
        return "TLS error: " + (", ".join(reasons) or repr(f.value))
    if f.check(TimeoutError, CancelledError):
        return "no TLS handshake in time"
    if f.check(ConnectionDone, ConnectionLost):
        return "the connection closed during the TLS handshake"
    detail = " ".join(f.getErrorMessage().split())
    return f"{type(f.value).__name__}: {detail}"[:200]


async def checkListener(
    reactor: IHTTPClientReactor, target: Target, timeout: float = TIMEOUT
) -> None:
    """
    Complete one TLS handshake against C{target} as a client would.

    @raise SelfCheckFailed: with a one-line reason, when it does not.
    """
    if target.address is None:
        raise SelfCheckFailed("not listening")
    done: Deferred[tuple[bytes | None, bytes | None]] = Deferred()
    factory = TLSMemoryBIOFactory(
        _Client(target.protocol), True, Factory.forProtocol(lambda: _Handshake(done))
    )
    connecting = _endpoint(reactor, target.address, timeout).connect(factory)
    attempt: Deferred[Any] = connecting.addCallback(lambda protocol: (protocol, done))
    protocols: list[Any] = []

    def handshake(both: tuple[Any, Deferred[Any]]) -> Deferred[Any]:
        protocols.append(both[0])
        return both[1]

    attempt.addCallback(handshake)
    attempt.addTimeout(timeout, reactor)
    try:
        chosen, certificate = await attempt
    except SelfCheckFailed:
        raise
    except BaseException:
        for protocol in protocols:
            protocol.transport.abortConnection()
        raise SelfCheckFailed(_why(Failure())) from None
    if chosen != target.protocol:
        offered = target.protocol.decode("ascii", "replace")
        raise SelfCheckFailed(f"ALPN {offered!r} offered, {chosen!r} chosen")
    if certificate != target.certificate:
        raise SelfCheckFailed("presented a certificate that is not its configured one")


class SelfCheck(Service):
    """Check every listener in rounds; report each result; stop cleanly."""

    log = Logger()

    def __init__(
        self,
        reactor: IHTTPClientReactor,
        targets: Callable[[], Mapping[str, Target]],
        report: Callable[[str, str | None], object],
        *,
        interval: float = INTERVAL,
        retry: float = RETRY,
        timeout: float = TIMEOUT,
        check: Callable[
            [IHTTPClientReactor, Target, float], Coroutine[Any, Any, None]
        ] = checkListener,
    ) -> None:
        """
        @param targets: the listeners to check, asked at each round (a
            reloaded certificate is the one expected).
        @param report: told C{(listener, None)} when its check passed,
            C{(listener, reason)} when it failed.
        @param check: one listener's check (L{checkListener}).
        """
        self._reactor = reactor
        self._targets = targets
        self._report = report
        self._interval, self._retry, self._timeout = interval, retry, timeout
        self._check = check
        self._last: dict[str, str | None] = {}
        self._round: Deferred[Any] | None = None
        self._next: Any = None

    def startService(self) -> None:
        super().startService()
        self._start()

    def checkNow(self) -> None:
        """Start a round now (certificates reloaded), unless one runs."""
        if self.running and self._round is None:
            if self._next is not None and self._next.active():
                self._next.cancel()
            self._start()

    def _start(self) -> None:
        self._next = None
        checks = [
            Deferred.fromCoroutine(self._one(name, target))
            for name, target in self._targets().items()
        ]
        self._round = DeferredList(checks, consumeErrors=True)
        self._round.addCallback(self._schedule)

    async def _one(self, name: str, target: Target) -> bool:
        try:
            await self._check(self._reactor, target, self._timeout)
        except SelfCheckFailed as e:
            reason: str | None = str(e)
        else:
            reason = None
        if not self.running:
            return False  # stopped: the listeners close, nothing to tell
        previous = self._last.get(name)
        self._last[name] = reason
        if reason != previous:
            if reason is None:
                self.log.info("selfcheck.passed {listener}", listener=name)
            else:
                self.log.warn(
                    "selfcheck.failed {listener} {address}: {reason}",
                    listener=name, address=str(target.address), reason=reason,
                )  # fmt: skip
        self._report(name, reason)
        return reason is None

    def _schedule(self, results: list[tuple[bool, Any]]) -> None:
        self._round = None
        if not self.running:
            return
        passed = all(ok and value for ok, value in results)
        wait = self._interval if passed else self._retry
        self._next = self._reactor.callLater(wait, self._start)

    def stopService(self) -> None:
        super().stopService()
        if self._next is not None and self._next.active():
            self._next.cancel()
        self._next = None
        if self._round is not None:
            running, self._round = self._round, None
            running.cancel()
