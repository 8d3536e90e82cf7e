"""
The LDevID issuer and the trust bundle [T4].

One issuer (C{pki.issuer_cert}/C{pki.issuer_key}) signs every new LDevID;
the bundle (C{pki.bundle}) holds it and the legacy software CAs (capsule,
forge) whose LDevIDs are accepted until their node attests through spore
(a legacy software key is never renewed; docs/decisions.md).

The subject of an LDevID is set here from the inventory (device name as
CN, chassis serial as serialNumber), never copied from a CSR, so a
verified client certificate names its node.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleetd.config import ConfigError

BACKDATE = timedelta(minutes=5)
_SignKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def _loadPEMCerts(key: str, path: Path) -> list[x509.Certificate]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from e
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise ConfigError(key, f"{path} holds an unreadable certificate") from e
    return certs


def spkiDER(key: Any) -> bytes:
    """A public key's SubjectPublicKeyInfo, DER (what "the same key" compares)."""
    der: bytes = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _spki(cert: x509.Certificate) -> bytes:
    return spkiDER(cert.public_key())


def serialHex(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


@dataclass(frozen=True)
class Subject:
    """What an LDevID says about its node."""

    device: str
    serial: str


def subjectOf(cert: x509.Certificate) -> Subject | None:
    """The (device, chassis serial) an LDevID names, or L{None}."""
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    serials = cert.subject.get_attributes_for_oid(NameOID.SERIAL_NUMBER)
    if len(cns) != 1 or len(serials) != 1:
        return None
    device, serial = cns[0].value, serials[0].value
    if not isinstance(device, str) or not isinstance(serial, str):
        return None
    if not device or not serial:
        return None
    return Subject(device, serial)


class Issuer:
    """Signs LDevIDs with the one issuer key."""

    def __init__(self, cert: x509.Certificate, key: _SignKey, validity: timedelta):
        self.cert = cert
        self._key = key
        self.validity = validity
        self.name = cert.subject.rfc4514_string()

    @classmethod
    def load(cls, certPath: Path, keyPath: Path, validity: timedelta) -> Issuer:
        cert = _loadPEMCerts("pki.issuer_cert", certPath)[0]
        try:
            key = serialization.load_pem_private_key(keyPath.read_bytes(), None)
        except OSError as e:
            raise ConfigError(
                "pki.issuer_key", f"cannot read {keyPath}: {e.strerror}"
            ) from e
        except (ValueError, TypeError) as e:
            raise ConfigError(
                "pki.issuer_key", f"{keyPath} is not a PEM private key"
            ) from e
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ConfigError("pki.issuer_key", "must be an ECDSA or RSA key")
        mine = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        if mine != _spki(cert):
            raise ConfigError("pki.issuer_key", f"{keyPath} does not match {certPath}")
        return cls(cert, key, validity)

    def issue(
        self,
        public: ec.EllipticCurvePublicKey | rsa.RSAPublicKey,
        subject: Subject,
        now: float,
    ) -> x509.Certificate:
        """A client certificate for C{public} naming C{subject}."""
        start = datetime.fromtimestamp(now, UTC)
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, subject.device),
                x509.NameAttribute(NameOID.SERIAL_NUMBER, subject.serial),
            ]
        )
        ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        isRSA = isinstance(public, rsa.RSAPublicKey)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(self.cert.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start - BACKDATE)
            .not_valid_after(start + self.validity)
            .add_extension(x509.BasicConstraints(False, None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=isRSA,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                    ski.value
                ),
                False,
            )
        )
        return builder.sign(self._key, hashes.SHA256())


def _signedBy(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


class TrustBundle:
    """The issuer plus the legacy CAs whose LDevIDs are still accepted [T4]."""

    def __init__(self, certs: list[x509.Certificate], issuer: x509.Certificate):
        self.certs = certs
        self._issuerSPKI = _spki(issuer)
        if not any(_spki(c) == self._issuerSPKI for c in certs):
            raise ConfigError("pki.bundle", "the bundle must hold pki.issuer_cert")

    @classmethod
    def load(cls, path: Path, issuer: x509.Certificate) -> TrustBundle:
        return cls(_loadPEMCerts("pki.bundle", path), issuer)

    def issuerOf(self, cert: x509.Certificate) -> tuple[x509.Certificate, bool] | None:
        """The bundle CA that signed C{cert} and whether it is the current issuer."""
        for ca in self.certs:
            if ca.subject != cert.issuer:
                continue
            if _signedBy(cert, ca):
                return ca, _spki(ca) == self._issuerSPKI
        return None

    def pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.certs)
