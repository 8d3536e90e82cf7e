"""
Build the NetBox client from C{[netbox]}: the token read from
C{token_file}, HTTPS checked against the system roots or C{[netbox] ca},
plain HTTP when the URL says so (a NetBox on the same host, say).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from OpenSSL import SSL
from treq.client import HTTPClient
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from fleetd.netbox.client import (
    DEFAULT_TIMEOUT,
    IHTTP,
    NetBoxClient,
    authorization,
    checkURL,
)
from fleetd.reactors import IHTTPClientReactor


class NetBoxSetupError(ValueError):
    """C{[netbox]} cannot be used as given; one line naming the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


@implementer(IPolicyForHTTPS)
class _PrivateCA:
    """Trust exactly the CA in C{[netbox] ca} (and check the host name)."""

    def __init__(self, pem: bytes) -> None:
        self._roots = ssl.trustRootFromCertificates(
            [ssl.Certificate.loadPEM(block) for block in _pemBlocks(pem)]
        )

    def creatorForNetloc(
        self, hostname: bytes, port: int
    ) -> IOpenSSLClientConnectionCreator:
        return ssl.optionsForClientTLS(hostname.decode("ascii"), trustRoot=self._roots)


def _pemBlocks(pem: bytes) -> list[bytes]:
    marker = b"-----END CERTIFICATE-----"
    blocks = [b + marker for b in pem.split(marker) if b"BEGIN CERTIFICATE" in b]
    if not blocks:
        raise ValueError("no PEM certificate in it")
    return blocks


def readToken(path: Path) -> str:
    """The token in C{path}; refuse an unreadable file or a malformed token."""
    try:
        token = path.read_text("ascii").strip()
        authorization(token)
    except (OSError, UnicodeError, ValueError) as e:
        raise NetBoxSetupError("netbox.token_file", f"{path}: {e}") from None
    return token


def tlsPolicy(ca: Path | None) -> IPolicyForHTTPS:
    if ca is None:
        return BrowserLikePolicyForHTTPS()
    try:
        return _PrivateCA(ca.read_bytes())
    except (OSError, ValueError, SSL.Error) as e:
        raise NetBoxSetupError("netbox.ca", f"{ca}: {e}") from None


def makeClient(
    reactor: IHTTPClientReactor,
    url: str,
    tokenFile: Path,
    ca: Path | None,
    timeout: float = DEFAULT_TIMEOUT,
) -> NetBoxClient:
    """The client for C{[netbox]}; L{NetBoxSetupError} names a bad key."""
    try:
        checkURL(url)
    except ValueError as e:
        raise NetBoxSetupError("netbox.url", str(e)) from None
    token = readToken(tokenFile)
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 2
    agent = Agent(reactor, contextFactory=tlsPolicy(ca), pool=pool)
    # treq's signature is wider than what the client passes (see IHTTP).
    http = cast(IHTTP, HTTPClient(agent))
    return NetBoxClient(
        http, reactor, url, token, timeout=timeout, closer=pool.closeCachedConnections
    )
