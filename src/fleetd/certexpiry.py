"""
When the certificates fleetd serves, signs with or verifies with expire:
C{fleetd_certificate_not_after_seconds}, the notAfter of each as a Unix
time, read at every scrape from what fleetd uses at that moment (so a
certificate reloaded by SIGHUP shows at the next scrape).
C{FleetCertificateExpiring} watches it.

One series per certificate of the configured files, with bounded labels:

  - C{certificate}: the configuration key of the file it comes from
    (C{tls.cert}, C{tls.chain}, C{pki.issuer_cert}, C{pki.bundle},
    C{owner.client_ca}, C{kubernetes.ca}, C{kubernetes.client_cert},
    C{netbox.ca}, C{tink.upstream_ca}), so the alert names what to renew;
  - C{listener}: the TLS listener that serves it, or that asks clients
    for certificates issued by it; empty for the others;
  - C{index}: its place among those of its key that are in use, from 0;
  - C{subject}: its subject's common name, or the whole subject when it
    has none, at most 64 characters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

NAME = "fleetd_certificate_not_after_seconds"
LABELS = ("certificate", "listener", "index", "subject")
_PEM = b"-----BEGIN CERTIFICATE-----"


@dataclass(frozen=True)
class Watched:
    """
    Certificates of one configuration key, as one listener (or none) uses
    them, in the order used.
    """

    certificate: str
    listener: str
    certs: tuple[x509.Certificate, ...]


def subjectOf(cert: x509.Certificate) -> str:
    """The certificate's common name, else its whole subject, cut at 64."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    text = str(names[0].value) if names else cert.subject.rfc4514_string()
    return text[:64]


def readCertificates(
    path: Path, *, first: bool = False
) -> tuple[x509.Certificate, ...]:
    """
    The PEM certificates in C{path} (only the first with C{first}, as
    fleetd's loader for that key reads it); none when the file cannot be
    read or parsed: the part of fleetd that loads it says so at start.
    """
    try:
        data = path.read_bytes()
        found = [
            x509.load_pem_x509_certificate(_PEM + chunk)
            for chunk in data.split(_PEM)[1:]
        ]
    except (OSError, ValueError):
        return ()
    return tuple(found[:1] if first else found)


class CertificateExpiry(Collector):
    """The gauge, read from C{sources()} at every scrape."""

    def __init__(self, sources: Callable[[], Iterable[Watched]]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            NAME,
            "When each certificate fleetd serves, signs with or verifies with"
            " expires (notAfter, Unix time), by its configuration key"
            " (FleetCertificateExpiring).",
            labels=LABELS,
        )
        for watched in self._sources():
            for index, cert in enumerate(watched.certs):
                family.add_metric(
                    [
                        watched.certificate,
                        watched.listener,
                        str(index),
                        subjectOf(cert),
                    ],
                    cert.not_valid_after_utc.timestamp(),
                )
        yield family
