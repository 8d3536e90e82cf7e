"""
TLS policy for fleetd's listeners.

Each TLS listener gets its own L{CertificateOptions} (TLS 1.2 or later,
forward-secret AEAD suites only), built from the public certificate and,
where a listener asks clients for a certificate, the CA it trusts for them
(L{fleetd.listen.policy} says which). L{tlsFactory} wraps a listener's
factory in TLS and then in the connection limits of
L{fleetd.listen.connections}.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from OpenSSL import SSL, crypto
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from zope.interface import implementer

from fleetd.config import ConfigError, TLSFiles
from fleetd.listen.connections import LimitedFactory, provideLike

# TLS 1.2: ECDHE key exchange (forward secrecy) with an AEAD cipher only,
# for ECDSA and RSA certificates alike. No static RSA, no CBC, no SHA-1
# MACs, no DHE. TLS 1.3's suites are all AEAD with (EC)DHE and stay as
# OpenSSL offers them (this string does not touch them).
TLS12_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
)


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

    def replace(self, options: ssl.CertificateOptions) -> None:
        """New connections use C{options} (a reloaded certificate); open
        ones keep the context they were made with."""
        self.options = options


def _bioLength() -> tuple[Callable[[Any, Any], int], Any] | None:
    """
    How to ask a memory BIO how many bytes it holds (C{BIO_get_mem_data},
    through pyOpenSSL's bindings, with a null pointer), checked on a new
    connection's outgoing BIO; L{None} where this pyOpenSSL does not let
    us (then Twisted's own flush is used).
    """
    try:
        from OpenSSL._util import ffi, lib

        probe = SSL.Connection(SSL.Context(SSL.TLS_METHOD), None)
        length: Callable[[Any, Any], int] = lib.BIO_get_mem_data
        if length(probe._from_ssl, ffi.NULL) != 0:
            return None
    except (ImportError, AttributeError, TypeError):
        return None
    return length, ffi.NULL


_BIO_LENGTH = _bioLength()


class _TLSProtocol(TLSMemoryBIOProtocol):
    """
    Twisted's TLS protocol, with its "provides what the transport provides"
    declaration built once per kind of transport. Twisted's makeConnection
    declares it once per interface and once more for all of them, on every
    connection (zope builds a declaration each time): some tens of µs of a
    boot storm's connection. The rest is Twisted's makeConnection as it is,
    but for the server side only: no handshake step before the client has
    said anything. Its flush of the outgoing BIO reads only what is there
    (L{_flushSendBIO}).
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
        # Twisted steps the handshake here, which for a client sends its
        # hello; a server (fleetd's listeners are servers) has nothing to
        # say before the client's hello arrives, and OpenSSL only answers
        # "want read" (an exception through pyOpenSSL): the first
        # dataReceived steps it instead.

    def _flushSendBIO(self) -> None:
        """
        Twisted's, without reading an empty BIO: Twisted reads up to 32 KiB
        and catches the C{WantReadError} pyOpenSSL raises when nothing is
        there, some five times a connection. Here the BIO is asked how much
        it holds, and all of it is written at once.
        """
        if _BIO_LENGTH is None:
            super()._flushSendBIO()
            return
        length, null = _BIO_LENGTH
        connection = self._tlsConnection
        held = length(connection._from_ssl, null)
        if held > 0:
            transport: Any = self.transport
            transport.write(connection.bio_read(held))


class _TLSFactory(TLSMemoryBIOFactory):
    protocol = _TLSProtocol


def tlsFactory(
    tls: ServerConnections | ssl.CertificateOptions,
    factory: Any,
    *,
    name: str,
    clock: IReactorTime,
    maxConnections: int,
    idleTimeout: float,
    maxPerSource: int | None = None,
) -> LimitedFactory:
    """Wrap C{factory} in TLS (C{tls}'s connections, or new ones from
    options), then in connection limits (with C{factory.admits} as the
    admission check, when it has one)."""
    connections = tls if isinstance(tls, ServerConnections) else ServerConnections(tls)
    wrapped = _TLSFactory(connections, False, factory)
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
