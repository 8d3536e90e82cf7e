"""
The certificates each TLS listener uses right now, for
C{fleetd_certificate_not_after_seconds} (L{fleetd.certexpiry}): the chain
it serves (C{tls.cert}, then the C{tls.chain} certificates it sends; a
self-signed root there is never sent, so not watched) and the CAs whose
client certificates it asks for (C{pki.bundle} on C{device},
C{owner.client_ca} on C{admin}). Read from the listeners' current TLS
options, so a SIGHUP reload (L{fleetd.listen.reload}) shows at the next
scrape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from cryptography import x509
from OpenSSL import crypto
from prometheus_client import CollectorRegistry

from fleetd.certexpiry import CertificateExpiry, Watched
from fleetd.config import Settings
from fleetd.listen.policy import ListenerName, listenerPolicy
from fleetd.listen.service import Listeners


def _x509(certs: Iterable[crypto.X509]) -> tuple[x509.Certificate, ...]:
    return tuple(c.to_cryptography() for c in certs)


def listenerCertificates(listeners: Listeners, settings: Settings) -> list[Watched]:
    """What every TLS listener serves and trusts, as it does now."""
    watched: list[Watched] = []
    for name, connections in listeners.tls.items():
        options = connections.options
        served = [] if options.certificate is None else [options.certificate]
        watched.append(Watched("tls.cert", name, _x509(served)))
        if options.extraCertChain:
            chain = _x509(options.extraCertChain)
            watched.append(Watched("tls.chain", name, chain))
        policy = listenerPolicy(settings, cast(ListenerName, name))
        if policy.clientCA is not None and options.caCerts:
            trusted = _x509(options.caCerts)
            watched.append(Watched(policy.clientCAKey, name, trusted))
    return watched


def watchCertificates(
    registry: CollectorRegistry,
    listeners: Listeners,
    settings: Settings,
    others: Iterable[Watched],
) -> CertificateExpiry:
    """
    Register C{fleetd_certificate_not_after_seconds} on C{registry}: the
    listeners' certificates as they are at each scrape, and C{others}
    (read at start, as fleetd uses them until it restarts).
    """
    fixed = tuple(others)
    collector = CertificateExpiry(
        lambda: [*listenerCertificates(listeners, settings), *fixed]
    )
    registry.register(collector)
    return collector
