"""
The owner's side in tests: certificates from the dev PKI, a device as the
owner API takes it (JSON and CSV), and an offload that runs inline.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.internet.defer import Deferred, maybeDeferred

from fleetd.pki.dev import DevPKIPaths, ensureDevPKI, makeCertificate
from tests.inventorysupport import UUID1, UUID2, UUID3

W1 = {
    "name": "w1",
    "serial": "SN-1",
    "uuid": UUID1,
    "macs": ["52:54:00:00:00:01"],
    "class": "worker-g3",
    "cluster": "folly",
}
CSV = f"""\
name,serial,uuid,mac,class,cluster
w2,SN-2,{UUID2},52:54:00:00:00:02 52:54:00:00:00:12,worker-g3,folly
w3,SN-3,{UUID3},,control-plane,
"""


def inline(work: Callable[[bytes], Any], data: bytes) -> Deferred[Any]:
    """An offload that runs the work at once, on the calling thread."""
    return maybeDeferred(work, data)


NOW = datetime(2026, 1, 1, tzinfo=UTC)
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH
SERVER_AUTH = ExtendedKeyUsageOID.SERVER_AUTH
NO_EKU = object()


def issue(
    pki: DevPKIPaths,
    cn: str,
    eku: Any = CLIENT_AUTH,
    ca: str = "owner_ca",
    directory: Path | None = None,
) -> tuple[x509.Certificate, Path, Path]:
    """A leaf for C{cn} signed by the dev PKI's C{ca}; C{NO_EKU}: no EKU."""
    caCert = x509.load_pem_x509_certificate(getattr(pki, ca).read_bytes())
    caKey: Any = serialization.load_pem_private_key(
        getattr(pki, ca + "_key").read_bytes(), None
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = makeCertificate(
        cn, key, NOW, (caCert, caKey), None if eku is NO_EKU else eku
    )
    where = directory or pki.directory
    certPath = where / f"leaf-{abs(hash((cn, str(eku), ca)))}.pem"
    keyPath = certPath.with_suffix(".key")
    certPath.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyPath.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, certPath, keyPath


class PKIMixin:
    pki: DevPKIPaths

    def makePKI(self) -> None:
        directory = Path(self.mktemp()).resolve()  # type: ignore[attr-defined]
        self.pki = ensureDevPKI(directory / "pki", "enroll.lolwtf.ca")
