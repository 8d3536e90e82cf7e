"""
The owner's side in tests: certificates from the dev PKI, a device as the
owner API takes it (JSON and CSV), an offload that runs inline, and
requests to an admin site from a TLS peer holding an owner certificate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from OpenSSL import crypto
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Site

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
    extensions: Sequence[x509.ExtensionType] = (),
) -> tuple[x509.Certificate, Path, Path]:
    """
    A leaf for C{cn} signed by the dev PKI's C{ca}; C{NO_EKU}: no EKU;
    C{extensions} added (a role's policies, L{fleetd.pki.owners.rolePolicies}).
    """
    caCert = x509.load_pem_x509_certificate(getattr(pki, ca).read_bytes())
    caKey: Any = serialization.load_pem_private_key(
        getattr(pki, ca + "_key").read_bytes(), None
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = makeCertificate(
        cn, key, NOW, (caCert, caKey), None if eku is NO_EKU else eku,
        extensions=extensions,
    )  # fmt: skip
    where = directory or pki.directory
    marks = (cn, str(eku), ca, repr(extensions))
    certPath = where / f"leaf-{abs(hash(marks))}.pem"
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


class _Handle:
    """The TLS connection's verified chain, as pyOpenSSL gives it."""

    def __init__(self, chain: list[x509.Certificate] | None) -> None:
        self._chain = chain

    def get_verified_chain(self) -> list[crypto.X509] | None:
        if self._chain is None:
            return None
        return [crypto.X509.from_cryptography(c) for c in self._chain]


class CertTransport(StringTransport):
    """
    A transport whose TLS peer presented C{cert} (or nothing), verified as
    the chain C{[cert, *above]}.
    """

    def __init__(self, cert: x509.Certificate | None, *above: x509.Certificate) -> None:
        super().__init__()
        self._cert = cert
        self._chain = None if cert is None else [cert, *above]

    def getPeerCertificate(self) -> crypto.X509 | None:
        if self._cert is None:
            return None
        return crypto.X509.from_cryptography(self._cert)

    def getHandle(self) -> _Handle:
        return _Handle(self._chain)


if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object


class OwnerSiteMixin(_Base):
    """
    Requests to C{self.site} over a transport whose TLS peer is the owner
    certificate C{self.owner} (or C{cert}), verified up to the owner CA.
    """

    site: Site
    pki: DevPKIPaths
    owner: x509.Certificate

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        contentType: str | None = "application/json",
        cert: Any = None,
    ) -> tuple[int, bytes]:
        channel = self.site.buildProtocol(None)
        ownerCA = x509.load_pem_x509_certificate(self.pki.owner_ca.read_bytes())
        transport = CertTransport(self.owner if cert is None else cert, ownerCA)
        channel.makeConnection(transport)
        self.addCleanup(channel.connectionLost, None)
        headers = f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
        if contentType is not None:
            headers += f"Content-Type: {contentType}\r\n"
        if body or method != "GET":
            headers += f"Content-Length: {len(body)}\r\n"
        channel.dataReceived(headers.encode() + b"\r\n" + body)
        head, _, content = transport.value().partition(b"\r\n\r\n")
        if b"Transfer-Encoding: chunked" in head:
            chunks = b""
            while True:
                size, _, rest = content.partition(b"\r\n")
                if int(size, 16) == 0:
                    break
                chunks += rest[: int(size, 16)]
                content = rest[int(size, 16) + 2 :]
            content = chunks
        return int(head.split(b" ")[1]), content
