"""
TLS contexts and connection limits for fleetd's listeners.

Each TLS listener gets its own L{CertificateOptions} (TLS 1.2 or later,
forward-secret AEAD suites only); every stream listener is wrapped in
L{LimitedFactory}, which caps concurrent connections (in total and per
source, an IPv6 /64 counting as one source) and closes connections idle
(no byte in or out) for too long, TLS handshakes included.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from OpenSSL import SSL, crypto
from twisted.application.service import Service
from twisted.internet import ssl
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IListeningPort,
    IOpenSSLServerConnectionCreator,
    IReactorTime,
)
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.protocols import policies
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import directlyProvides, implementer, providedBy

from fleetd.config import ConfigError, TLSFiles
from fleetd.logs import ThrottledLog
from fleetd.sources import sourceKey

# TLS 1.2: ECDHE key exchange (forward secrecy) with an AEAD cipher only,
# for ECDSA and RSA certificates alike. No static RSA, no CBC, no SHA-1
# MACs, no DHE. TLS 1.3's suites are all AEAD with (EC)DHE and stay as
# OpenSSL offers them (this string does not touch them).
TLS12_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
)


def connectionSource(addr: IAddress | None) -> str:
    """
    The key under which a connection from C{addr} counts against the
    per-source cap: the IPv4 address, or the IPv6 /64 (an IPv4-mapped IPv6
    address counts as its IPv4 address).
    """
    return sourceKey(str(getattr(addr, "host", "")))


def _readPEM(key: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from e


def loadCertificates(key: str, path: Path) -> list[crypto.X509]:
    """Load every PEM certificate in C{path}; at least one must be there."""
    data = _readPEM(key, path)
    certs = []
    marker = b"-----BEGIN CERTIFICATE-----"
    for chunk in data.split(marker)[1:]:
        try:
            certs.append(crypto.load_certificate(crypto.FILETYPE_PEM, marker + chunk))
        except crypto.Error as e:
            raise ConfigError(key, f"{path} holds an unreadable certificate") from e
    if not certs:
        raise ConfigError(key, f"{path} holds no PEM certificate")
    return certs


def _sameKey(cert: crypto.X509, key: crypto.PKey) -> bool:
    """Whether C{key} is the private half of C{cert}'s public key."""
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
    )

    private = key.to_cryptography_key()
    public = getattr(private, "public_key", None)
    if public is None:
        return False
    der = (Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    mine: bytes = public().public_bytes(*der)
    theirs: bytes = cert.to_cryptography().public_key().public_bytes(*der)
    return mine == theirs


def loadTLSOptions(
    tls: TLSFiles,
    *,
    alpn: list[bytes] | None = None,
    clientCA: Path | None = None,
    clientCAKey: str = "owner.client_ca",
) -> ssl.CertificateOptions:
    """
    Build server TLS options from the configured public certificate.

    TLS 1.2 is the minimum and only L{TLS12_CIPHERS} (plus TLS 1.3's
    suites) are offered; ECDSA and RSA keys both work. With C{clientCA},
    clients are asked for a certificate issued by it but not required to
    send one: the resource decides per request [A3] (the owner CA on the
    admin listener, the LDevID trust bundle on the device listener).
    """
    leaf, *_ = loadCertificates("tls.cert", tls.cert)
    keyData = _readPEM("tls.key", tls.key)
    try:
        privateKey = crypto.load_privatekey(crypto.FILETYPE_PEM, keyData)
    except crypto.Error as e:
        raise ConfigError("tls.key", f"{tls.key} is not a PEM private key") from e
    if not _sameKey(leaf, privateKey):
        raise ConfigError("tls.key", f"{tls.key} does not match {tls.cert}")
    chain = [] if tls.chain is None else loadCertificates("tls.chain", tls.chain)
    kwargs: dict[str, Any] = {}
    if clientCA is not None:
        kwargs.update(
            verify=True,
            requireCertificate=False,
            caCerts=loadCertificates(clientCAKey, clientCA),
        )
    if alpn is not None:
        kwargs["acceptableProtocols"] = alpn
    return ssl.CertificateOptions(
        privateKey=privateKey,
        certificate=leaf,
        extraCertChain=[c for c in chain if c.get_subject() != c.get_issuer()],
        raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
        acceptableCiphers=ssl.AcceptableCiphers.fromOpenSSLCipherString(TLS12_CIPHERS),
        **kwargs,
    )


_PROVIDES: dict[tuple[type, Any], Any] = {}


def provideLike(wrapper: Any, transport: Any) -> None:
    """Declare that C{wrapper} provides what C{transport} provides, as
    Twisted's wrappers do, with the declaration built once per wrapper
    class and kind of transport instead of on every connection (zope's
    declarations are shared objects by design)."""
    key = (type(wrapper), providedBy(transport))
    provides = _PROVIDES.get(key)
    if provides is None:
        directlyProvides(wrapper, key[1])
        _PROVIDES[key] = getattr(wrapper, "__provides__")  # noqa: B009
    else:
        wrapper.__provides__ = provides


class LimitedProtocol(policies.ProtocolWrapper):
    """
    Counts towards its factory's limits and stamps the time of every byte
    in or out; the factory's idle sweep drops it after C{idleTimeout}
    seconds without one. The hot path costs an attribute store, and a
    connection no timer of its own.

    It sits right above the socket's transport (below TLS), so it also
    counts the bytes handed to that transport (C{bytesWritten}) and tells
    whoever asks (L{whenLost}) when the socket is gone: the transport's
    buffers then hold exactly what never reached the kernel.
    """

    factory: LimitedFactory
    _lost = False
    _aborted = False
    _active = 0.0
    _onLost: list[Callable[[], None]] | None = None
    bytesWritten = 0

    def whenLost(self, callback: Callable[[], None]) -> None:
        """Call C{callback} once the connection is lost (at once if it is)."""
        if self._lost:
            callback()
            return
        if self._onLost is None:
            self._onLost = []
        self._onLost.append(callback)

    def makeConnection(self, transport: Any) -> None:
        factory = self.factory
        self._active = factory.clock.seconds()
        factory.armSweep()
        # ProtocolWrapper.makeConnection, its declaration made once.
        provideLike(self, transport)
        Protocol.makeConnection(self, transport)
        factory.registerProtocol(self)
        wrapped: Any = self.wrappedProtocol
        wrapped.makeConnection(self)

    def idleAbort(self) -> None:
        """Drop the connection: it was idle for too long."""
        self._aborted = True
        self.factory.idleLog.info(
            "listen.idle-timeout {listener}", listener=self.factory.name
        )
        transport: Any = self.transport
        transport.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        self._active = self.factory.clock.seconds()
        super().dataReceived(data)

    def write(self, data: bytes) -> None:
        self._active = self.factory.clock.seconds()
        self.bytesWritten += len(data)
        transport: Any = self.transport
        transport.write(data)

    def writeSequence(self, data: Any) -> None:
        # One buffer, not a check and an append per piece (an HTTP head
        # arrives here as some thirty pieces when no TLS joins them first).
        self.write(b"".join(data))

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self._lost = True
        super().connectionLost(reason)
        callbacks, self._onLost = self._onLost, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:
                self.factory.log.failure(
                    "listen.lost-callback {listener}", listener=self.factory.name
                )


class LimitedFactory(policies.WrappingFactory):
    """
    Cap concurrent connections and drop idle ones.

    Idle connections are found by one sweep per listener, a single timer
    due when the connection that has been quiet longest reaches
    C{idleTimeout}: it drops every connection past its deadline and sleeps
    until the next one's, but at least C{idleTimeout / 16} (so staggered
    deadlines cannot make it run for every connection; a connection may
    then be dropped up to that much late). No connection, no timer.

    Connections over C{maxConnections}, or over C{maxPerSource} from one
    source (L{connectionSource}: an IPv6 /64 is one source), are closed as
    soon as they are accepted, before any TLS work, so a flood costs little.
    Refusals are counted; the warning about them is logged at most once per
    C{logEvery} seconds so a flood cannot drown the log. C{admit}, when
    given, may refuse a source for its own reasons the same way (the tink
    listener's sources told to calm down, issue 17).
    """

    logEvery = 10.0
    sweepSteps = 16

    protocol = LimitedProtocol
    log = Logger()
    noisy = False

    def __init__(
        self,
        wrappedFactory: Any,
        *,
        name: str,
        clock: IReactorTime,
        maxConnections: int,
        idleTimeout: float,
        maxPerSource: int | None = None,
        admit: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__(wrappedFactory)
        self.admit = admit
        self.name = name
        self.clock = clock
        self.maxConnections = maxConnections
        self.maxPerSource = maxPerSource or maxConnections
        self.idleTimeout = idleTimeout
        self.refused = 0
        self._perSource: dict[str, int] = {}
        self._sourceOf: dict[Any, str] = {}
        self._drained: list[Deferred[None]] = []
        self._lastWarning: float | None = None
        self._unreported = 0
        self._sweep: IDelayedCall | None = None
        # A client can open many connections and leave them idle: their
        # closes are logged at most ten per 10 s per listener.
        self.idleLog = ThrottledLog(clock, self.log)

    def armSweep(self) -> None:
        """A connection opens: make sure the idle sweep will look at it."""
        if self._sweep is None:
            self._sweep = self.clock.callLater(self.idleTimeout, self._sweepIdle)

    def _sweepIdle(self) -> None:
        self._sweep = None
        now, timeout = self.clock.seconds(), self.idleTimeout
        due: float | None = None
        for proto in list(self.protocols):
            if proto._lost or proto._aborted:
                continue
            deadline = proto._active + timeout
            if deadline <= now:
                proto.idleAbort()
            elif due is None or deadline < due:
                due = deadline
        if due is not None:
            wait = max(due - now, timeout / self.sweepSteps)
            self._sweep = self.clock.callLater(wait, self._sweepIdle)

    def buildProtocol(self, addr: IAddress | None) -> Any:
        source = connectionSource(addr)
        if len(self.protocols) >= self.maxConnections:
            return self._refuse("total", self.maxConnections)
        if self._perSource.get(source, 0) >= self.maxPerSource:
            return self._refuse("source", self.maxPerSource)
        if self.admit is not None and not self.admit(source):
            return self._refuse("penalty", 0)
        protocol = super().buildProtocol(addr)
        self._perSource[source] = self._perSource.get(source, 0) + 1
        self._sourceOf[protocol] = source
        return protocol

    def _refuse(self, why: str, limit: int) -> None:
        self.refused += 1
        self._unreported += 1
        now = self.clock.seconds()
        if self._lastWarning is None or now - self._lastWarning >= self.logEvery:
            self.log.warn(
                "listen.connection-refused {listener} {why} {limit} ({count} refused)",
                listener=self.name,
                why=why,
                limit=limit,
                count=self._unreported,
            )
            self._lastWarning = now
            self._unreported = 0
        return None

    def openConnections(self) -> int:
        return len(self.protocols)

    def unregisterProtocol(self, p: Any) -> None:
        super().unregisterProtocol(p)
        source = self._sourceOf.pop(p, None)
        if source is not None:
            left = self._perSource[source] - 1
            if left:
                self._perSource[source] = left
            else:
                del self._perSource[source]
        if not self.protocols:
            if self._sweep is not None:
                if self._sweep.active():
                    self._sweep.cancel()
                self._sweep = None
            waiters, self._drained = self._drained, []
            for d in waiters:
                d.callback(None)

    def closeAll(self) -> Deferred[None]:
        """Abort every open connection; fire once all of them are gone."""
        if not self.protocols:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._drained.append(d)
        for proto in list(self.protocols):
            proto.transport.abortConnection()
        return d


@implementer(IOpenSSLServerConnectionCreator)
class ServerConnections:
    """
    Server-side TLS connections from C{options}' context, as
    L{ssl.CertificateOptions} makes them minus its per-connection
    C{set_alpn_protos}: that sets the list a I{client} offers, which a
    server never sends (about 9 us a connection here). The server's ALPN
    choice is the context's select callback, which C{options} installs and
    which still asks the wrapped factory's C{acceptableProtocols}.
    """

    def __init__(self, options: ssl.CertificateOptions) -> None:
        self.options = options

    def serverConnectionForTLS(self, protocol: Any) -> SSL.Connection:
        return SSL.Connection(self.options.getContext(), None)


class _TLSProtocol(TLSMemoryBIOProtocol):
    """
    Twisted's TLS protocol, with its "provides what the transport provides"
    declaration built once per kind of transport. Twisted's makeConnection
    declares it once per interface and once more for all of them, on every
    connection (zope builds a declaration each time): some tens of µs of a
    boot storm's connection. The rest is Twisted's makeConnection as it is.
    """

    def makeConnection(self, transport: Any) -> None:
        provideLike(self, transport)
        self._tlsConnection = self.factory._creatorCallable(self)
        self._appSendBuffer = []
        Protocol.makeConnection(self, transport)
        self.factory.registerProtocol(self)
        if self._connectWrapped:
            # ProtocolWrapper.makeConnection, its declaration made above.
            Protocol.makeConnection(self, transport)
            self.factory.registerProtocol(self)
            self.wrappedProtocol.makeConnection(self)
        self._checkHandshakeStatus()


class _TLSFactory(TLSMemoryBIOFactory):
    protocol = _TLSProtocol


def tlsFactory(
    options: ssl.CertificateOptions,
    factory: Any,
    *,
    name: str,
    clock: IReactorTime,
    maxConnections: int,
    idleTimeout: float,
    maxPerSource: int | None = None,
) -> LimitedFactory:
    """Wrap C{factory} in TLS, then in connection limits (with
    C{factory.admits} as the admission check, when it has one)."""
    wrapped = _TLSFactory(ServerConnections(options), False, factory)
    wrapped.noisy = False
    return LimitedFactory(
        wrapped,
        name=name,
        clock=clock,
        maxConnections=maxConnections,
        idleTimeout=idleTimeout,
        maxPerSource=maxPerSource,
        admit=getattr(factory, "admits", None),
    )


class StartupError(Exception):
    """fleetd cannot start; the message is one line naming the cause."""


class ListenerService(Service):
    """Bind one stream endpoint in C{privilegedStartService}."""

    log = Logger()

    def __init__(self, reactor: Any, name: str, description: str, factory: Any):
        self.reactor = reactor
        self.setName(name)
        self.description = description
        self.factory = factory
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
            address=str(self.port.getHost()),
        )
        super().privilegedStartService()

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        port, self.port = self.port, None
        if port is None:
            return None
        stopped: list[Deferred[Any]] = [maybeDeferred(port.stopListening)]
        if isinstance(self.factory, LimitedFactory):
            stopped.append(self.factory.closeAll())
        return DeferredList(stopped, consumeErrors=True).addCallback(lambda _: None)
