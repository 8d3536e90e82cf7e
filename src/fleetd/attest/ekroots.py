"""
The TPM manufacturers' roots (C{attest.ek_roots}) and the EK certificate check.

The roots are read once, at start: self-signed certificates are the trust
anchors, any others are intermediates offered to every chain. Real EK
certificates break strict parsers (NV wrappers, trailing bytes, odd serials
and set orderings), so a certificate is only ever sliced, never re-encoded
(re-encoding changes the signed bytes), and the chain is checked by
OpenSSL, which is more tolerant than C{cryptography}'s strict parser.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from OpenSSL import crypto

from fleetd.config import ConfigError
from fleetd.nodes import EK_UNTRUSTED, Refused

_PEM = b"-----BEGIN CERTIFICATE-----"
# Some TPMs store the certificate behind a 4-byte header: 0x10 0x01 + length.
_NV_WRAPPER = b"\x10\x01"


def _der(data: bytes) -> bytes:
    """The DER certificate inside C{data}: unwrapped and sliced, never re-encoded."""
    if data[:2] == _NV_WRAPPER and len(data) > 4:
        data = data[4:]
    if len(data) < 4 or data[0] != 0x30:
        raise ValueError("not a DER certificate")
    first = data[1]
    if first < 0x80:
        length, header = first, 2
    else:
        count = first & 0x7F
        if not 1 <= count <= 4 or len(data) < 2 + count:
            raise ValueError("bad DER length")
        length, header = int.from_bytes(data[2 : 2 + count], "big"), 2 + count
    end = header + length
    if end > len(data):
        raise ValueError("truncated DER certificate")
    return data[:end]  # trailing bytes (NV padding) are dropped by slicing


def _selfSigned(cert: crypto.X509) -> bool:
    if cert.get_subject() != cert.get_issuer():
        return False
    store = crypto.X509Store()
    store.add_cert(cert)
    try:
        crypto.X509StoreContext(store, cert).verify_certificate()
    except crypto.X509StoreContextError:
        return False
    return True


def _loadFile(path: Path) -> list[crypto.X509]:
    data = path.read_bytes()
    if _PEM in data:
        return [
            crypto.load_certificate(crypto.FILETYPE_PEM, _PEM + chunk)
            for chunk in data.split(_PEM)[1:]
        ]
    return [crypto.load_certificate(crypto.FILETYPE_ASN1, _der(data))]


@dataclass(frozen=True)
class EKCertificate:
    """A verified EK certificate: its DER and its public key's SPKI."""

    der: bytes
    spki: bytes
    issuer: str
    serial: int

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.der).hexdigest()


class EKRoots:
    """Manufacturer roots and intermediates, parsed once."""

    def __init__(self, anchors: list[crypto.X509], intermediates: list[crypto.X509]):
        self._anchors = anchors
        self._intermediates = intermediates
        self._store = crypto.X509Store()
        for cert in anchors:
            self._store.add_cert(cert)

    @classmethod
    def load(cls, path: Path, key: str = "attest.ek_roots") -> EKRoots:
        """
        Read every certificate in C{path} (a file, or a directory of PEM or
        DER files). An empty set is allowed (nothing can attest).

        @raise ConfigError: a file cannot be read or parsed.
        """
        files = (
            sorted(p for p in path.iterdir() if p.is_file())
            if path.is_dir()
            else [path]
        )
        anchors: list[crypto.X509] = []
        intermediates: list[crypto.X509] = []
        for file in files:
            try:
                certs = _loadFile(file)
            except OSError as e:
                raise ConfigError(key, f"cannot read {file}: {e.strerror}") from e
            except (crypto.Error, ValueError) as e:
                raise ConfigError(key, f"{file} holds an unreadable certificate") from e
            for cert in certs:
                (anchors if _selfSigned(cert) else intermediates).append(cert)
        return cls(anchors, intermediates)

    def __len__(self) -> int:
        return len(self._anchors)

    def verify(self, data: bytes) -> EKCertificate:
        """
        Check that C{data} is an EK certificate chaining to a root.

        @raise Refused: C{ek-cert-untrusted}, saying why.
        """
        try:
            der = _der(data)
            cert = crypto.load_certificate(crypto.FILETYPE_ASN1, der)
        except (crypto.Error, ValueError) as e:
            raise Refused(EK_UNTRUSTED, f"EK certificate unreadable ({e})") from e
        context = crypto.X509StoreContext(
            self._store, cert, chain=self._intermediates or None
        )
        try:
            context.verify_certificate()
        except crypto.X509StoreContextError as e:
            reason = str(e.args[0] if e.args else e)[:120]
            raise Refused(
                EK_UNTRUSTED,
                f"EK certificate does not chain to a manufacturer root ({reason})",
            ) from e
        spki = crypto.dump_publickey(crypto.FILETYPE_ASN1, cert.get_pubkey())
        return EKCertificate(
            der=der,
            spki=spki,
            issuer=cert.get_issuer().CN or "",
            serial=cert.get_serial_number(),
        )
