"""
Build a L{KubeClient} from C{[kubernetes]}: TLS against the cluster CA
(system roots when C{ca} is absent), a bearer token file or a client
certificate. Reads files; called once at start-up (not on the reactor's
hot path).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import (
    Certificate,
    PrivateCertificate,
    optionsForClientTLS,
    platformTrust,
)
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from fleetd.config import ConfigError, KubernetesSettings
from fleetd.k8s.client import KubeClient
from fleetd.reactors import IHTTPClientReactor


@implementer(IPolicyForHTTPS)
class _ClusterTLS:
    """Verify the API server against the cluster CA; present our certificate."""

    def __init__(self, trust: Any, client: PrivateCertificate | None) -> None:
        self._trust = trust
        self._client = client

    def creatorForNetloc(
        self, hostname: bytes, port: int
    ) -> IOpenSSLClientConnectionCreator:
        return optionsForClientTLS(
            hostname.decode("ascii"),
            trustRoot=self._trust,
            clientCertificate=self._client,
        )


def _read(key: str, path: Any) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(
            f"kubernetes.{key}", f"cannot read {path}: {e.strerror}"
        ) from e


def clientFromSettings(
    reactor: IHTTPClientReactor, settings: KubernetesSettings
) -> KubeClient:
    """
    The client for the configured cluster.

    @raise ConfigError: a file cannot be read or holds no usable PEM.
    """
    import treq.client

    if urlsplit(settings.api).scheme != "https":
        raise ConfigError("kubernetes.api", "must be an https:// URL")
    try:
        trust = (
            platformTrust()
            if settings.ca is None
            else Certificate.loadPEM(_read("ca", settings.ca))
        )
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError("kubernetes.ca", f"not a PEM certificate: {e}") from e
    clientCert = None
    bearer = None
    if settings.token_file is not None:
        bearer = _read("token_file", settings.token_file).decode("ascii", "replace")
        bearer = bearer.strip()
        if not bearer or any(c.isspace() for c in bearer):
            raise ConfigError("kubernetes.token_file", "must hold one bearer token")
    else:
        assert settings.client_cert is not None and settings.client_key is not None
        pem = _read("client_cert", settings.client_cert)
        pem += b"\n" + _read("client_key", settings.client_key)
        try:
            clientCert = PrivateCertificate.loadPEM(pem)
        except Exception as e:
            raise ConfigError(
                "kubernetes.client_cert", f"cannot load the certificate and key: {e}"
            ) from e
    pool = HTTPConnectionPool(reactor, persistent=True)
    agent = Agent(reactor, _ClusterTLS(trust, clientCert), pool=pool)
    http = treq.client.HTTPClient(agent)
    return KubeClient(
        settings.api, http, reactor, bearer=bearer, timeout=settings.timeout, pool=pool
    )
