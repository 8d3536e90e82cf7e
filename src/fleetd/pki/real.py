"""
The site's real PKI, as C{fleetd-pki} (L{fleetd.pki.cli}) makes it on spore.

Three things fleetd trusts are made here, and one is gathered:

  - the owner CA (C{owner.client_ca}): it signs operators' client
    certificates and nothing else [O1];
  - one clientAuth certificate per operator, whose CN is the operator's
    name in the journal and whose role (owner or reader [O4]) is fixed in
    it (L{fleetd.pki.owners});
  - the LDevID issuer (C{pki.issuer_cert}, C{pki.issuer_key}) and the trust
    bundle (C{pki.bundle}) that must hold it [T4];
  - the TPM vendors' EK roots (C{attest.ek_roots}), imported byte for byte
    from the files the vendors publish [T3].

Certificates come from L{fleetd.pki.dev.makeCertificate}, the same builder
as the dev PKI. Nothing here overwrites a file unless asked to, and every
private key is written mode 0600. The public certificate of the enrollment
name is not made here: it comes from a public CA.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from OpenSSL import crypto

from fleetd.pki.dev import (
    CERT_MODE,
    KEY_MODE,
    PrivateKey,
    certPEM,
    keyPEM,
    makeCertificate,
    newKey,
    writeAtomic,
)
from fleetd.pki.ldevid import spkiDER
from fleetd.pki.owners import OWNER, OWNER_NAME, OWNER_NAME_RULE, ROLES, rolePolicies

__all__ = [
    "EKRoot",
    "PKIError",
    "Pair",
    "makeIssuer",
    "makeOperator",
    "makeOwnerCA",
    "ownerConflict",
    "readCertificates",
    "readEKRoots",
    "readPair",
    "writeFiles",
]

Pair = tuple[x509.Certificate, PrivateKey]
_PEM_BLOCK = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL
)


class PKIError(Exception):
    """One line saying what cannot be done and why."""


def makeOwnerCA(cn: str, now: datetime, days: int, keyType: str = "ecdsa") -> Pair:
    """A new owner CA: its own key, self-signed, signing leaves only."""
    key = newKey(keyType)
    return makeCertificate(cn, key, now, validity=timedelta(days=days)), key


def makeOperator(
    name: str,
    ca: Pair,
    now: datetime,
    days: int,
    keyType: str = "ecdsa",
    role: str = OWNER,
) -> Pair:
    """
    One operator's certificate: CN C{name}, clientAuth, C{role} fixed in
    it as a certificate policy (L{fleetd.pki.owners.rolePolicies}) [O4],
    signed directly by the owner CA C{ca}.

    @raise PKIError: C{name} is not a usable owner name, or C{role} no role.
    """
    if OWNER_NAME.fullmatch(name) is None:
        raise PKIError(
            f"operator name {name[:70]!r} is not a usable owner name "
            f"({OWNER_NAME_RULE}): it is the CN and the journal's actor"
        )
    if role not in ROLES:
        raise PKIError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    key = newKey(keyType)
    cert = makeCertificate(
        name,
        key,
        now,
        ca,
        ExtendedKeyUsageOID.CLIENT_AUTH,
        validity=timedelta(days=days),
        extensions=(rolePolicies(role),),
    )
    return cert, key


def makeIssuer(cn: str, now: datetime, days: int, keyType: str = "ecdsa") -> Pair:
    """A new LDevID issuer CA: its own key, nothing else's."""
    key = newKey(keyType)
    return makeCertificate(cn, key, now, validity=timedelta(days=days)), key


def readCertificates(path: Path) -> list[x509.Certificate]:
    """Every PEM certificate in C{path}; L{PKIError} when there is none."""
    try:
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except OSError as e:
        raise PKIError(f"cannot read {path}: {e.strerror}") from e
    except ValueError as e:
        raise PKIError(f"{path} holds no readable PEM certificate") from e
    return certs


def readPair(certPath: Path, keyPath: Path) -> Pair:
    """A CA's certificate and private key, checked to belong together."""
    cert = readCertificates(certPath)[0]
    try:
        key = serialization.load_pem_private_key(keyPath.read_bytes(), None)
    except OSError as e:
        raise PKIError(f"cannot read {keyPath}: {e.strerror}") from e
    except (ValueError, TypeError) as e:
        raise PKIError(f"{keyPath} is not an unencrypted PEM private key") from e
    if not isinstance(key, PrivateKey):
        raise PKIError(f"{keyPath} is not an ECDSA or RSA key")
    if spkiDER(key.public_key()) != spkiDER(cert.public_key()):
        raise PKIError(f"{keyPath} is not the key of {certPath}")
    return cert, key


def ownerConflict(
    owner: x509.Certificate, what: str, others: Iterable[x509.Certificate]
) -> str | None:
    """
    [O1] Why the owner CA cannot sit beside C{others} (C{what}: which file),
    or L{None}: the same key, or a certificate the owner CA signed. The
    same test as fleetd's start-up (L{fleetd.prepare.checkOwnerCA}).
    """
    key = spkiDER(owner.public_key())
    for cert in others:
        if spkiDER(cert.public_key()) == key:
            return f"the owner CA is also {what}"
        try:
            cert.verify_directly_issued_by(owner)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return f"{what} holds a certificate the owner CA issued"
    return None


def writeFiles(files: Sequence[tuple[Path, bytes, int]], force: bool) -> list[str]:
    """
    Write every C{(path, data, mode)} atomically, or none: an existing file
    is refused unless C{force}. Missing directories are made mode 0755
    (the keys inside are 0600). Returns one line per file written.
    """
    if not force:
        existing = [str(path) for path, _, _ in files if path.exists()]
        if existing:
            verb = "exists" if len(existing) == 1 else "exist"
            raise PKIError(
                f"{', '.join(existing)} already {verb}; nothing written "
                "(--force replaces)"
            )
    lines = []
    for path, data, mode in files:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        writeAtomic(path, data, mode)
        kind = "private key" if mode == KEY_MODE else "certificate"
        lines.append(f"wrote {path} ({kind}, mode {mode:04o})")
    return lines


def certFile(cert: x509.Certificate, path: Path) -> tuple[Path, bytes, int]:
    """A certificate's PEM to write at C{path}."""
    return path, certPEM(cert), CERT_MODE


def keyFile(key: PrivateKey, path: Path) -> tuple[Path, bytes, int]:
    """A private key's PEM (PKCS#8, unencrypted) to write at C{path}, 0600."""
    return path, keyPEM(key), KEY_MODE


@dataclass(frozen=True)
class EKRoot:
    """A TPM vendor's certificate, exactly as published (its DER bytes)."""

    der: bytes
    subject: str
    selfSigned: bool
    notAfter: datetime
    isCA: bool | None  # None: cryptography's strict parser could not read it

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.der).hexdigest()

    def pem(self) -> bytes:
        """The same DER in PEM armour (base64 of the bytes, never re-encoded)."""
        body = base64.encodebytes(self.der).replace(b"\n", b"")
        lines = [body[i : i + 64] for i in range(0, len(body), 64)]
        return b"".join(
            [b"-----BEGIN CERTIFICATE-----\n", *(x + b"\n" for x in lines),
             b"-----END CERTIFICATE-----\n"]
        )  # fmt: skip


def readEKRoots(path: Path) -> list[EKRoot]:
    """
    The certificates in one vendor file, PEM (one or more) or DER. Parsed by
    OpenSSL, as fleetd's loader does (L{fleetd.attest.ekroots}), so a
    certificate fleetd would accept is never refused here.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PKIError(f"cannot read {path}: {e.strerror}") from e
    if b"-----BEGIN CERTIFICATE-----" in data:
        try:
            ders = [
                base64.b64decode(b"".join(m.split())) for m in _PEM_BLOCK.findall(data)
            ]
        except ValueError as e:
            raise PKIError(f"{path} holds a damaged PEM block") from e
    else:
        ders = [data]
    if not ders:
        raise PKIError(f"{path} holds no certificate")
    return [_ekRoot(path, der) for der in ders]


def _ekRoot(path: Path, der: bytes) -> EKRoot:
    try:
        cert = crypto.load_certificate(crypto.FILETYPE_ASN1, der)
    except crypto.Error as e:
        raise PKIError(f"{path} holds an unreadable certificate") from e
    selfSigned = False
    if cert.get_subject() == cert.get_issuer():
        store = crypto.X509Store()
        store.add_cert(cert)
        try:
            crypto.X509StoreContext(store, cert).verify_certificate()
            selfSigned = True
        except crypto.X509StoreContextError:
            pass
    strict = cert.to_cryptography()
    try:
        basic = strict.extensions.get_extension_for_class(x509.BasicConstraints)
        isCA: bool | None = basic.value.ca
    except x509.ExtensionNotFound:
        isCA = False
    except ValueError:
        isCA = None
    return EKRoot(
        der=der,
        subject=strict.subject.rfc4514_string()[:120],
        selfSigned=selfSigned,
        notAfter=strict.not_valid_after_utc,
        isCA=isCA,
    )


def slug(root: EKRoot) -> str:
    """A file name for C{root} in an C{attest.ek_roots} directory."""
    words = re.sub(r"[^A-Za-z0-9]+", "-", root.subject).strip("-").lower()
    return f"{words[:60] or 'ek-root'}-{root.sha256[:12]}.pem"


def existingDigests(target: Path) -> set[str]:
    """SHA-256 of every certificate already in C{target} (file or directory)."""
    if not target.exists():
        return set()
    files = (
        sorted(p for p in target.iterdir() if p.is_file())
        if target.is_dir()
        else [target]
    )
    return {root.sha256 for f in files for root in readEKRoots(f)}


def appendFile(path: Path, data: bytes) -> None:
    """Append C{data} to C{path} (made 0644 when new, its directory 0755)."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, CERT_MODE
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
