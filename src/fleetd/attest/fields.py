"""
The fields of the attestation documents: reading a request's values (each
refusal names the field, never echoes it) and writing an answer's, and the
refusals made from a binding's line and a full challenge book.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from fleetd import nodes as E
from fleetd.attest.challenge import PER_KEY, NoRoom
from fleetd.nodes import Refused


def b64Field(doc: Mapping[str, Any], name: str, limit: int = 8192) -> bytes:
    """The base64 field C{name} of a request, decoded (refused if missing or long)."""
    value = doc.get(name)
    if not isinstance(value, str) or len(value) > limit * 2:
        raise Refused(E.MALFORMED, f"{name}: missing or not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise Refused(E.MALFORMED, f"{name}: not base64") from e


def textField(doc: Mapping[str, Any], name: str, limit: int = 128) -> str:
    """The short printable text field C{name} of a request."""
    value = doc.get(name)
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= limit
        or not value.isprintable()
    ):
        raise Refused(E.MALFORMED, f"{name}: missing or not a short string")
    return value


def noRoomRefusal(full: NoRoom) -> Refused:
    if not full.perKey:
        return Refused(E.BUSY, "too many outstanding challenges; retry later")
    seconds = max(1, math.ceil(full.retryAfter))
    return Refused(
        E.CHALLENGES_PENDING,
        f"{PER_KEY} challenges for this EK are pending (each ends when answered"
        f" or expired); retry in {seconds} s",
        retryAfter=seconds,
    )


def b64Text(data: bytes) -> str:
    """C{data} as base64 text, for an answer."""
    return base64.b64encode(data).decode("ascii")


def pemText(cert: x509.Certificate) -> str:
    """C{cert} as PEM text, for an answer."""
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def csrField(
    doc: Mapping[str, Any],
) -> tuple[
    x509.CertificateSigningRequest, ec.EllipticCurvePublicKey | rsa.RSAPublicKey
]:
    """The request's PEM CSR, signature-checked, and its (EC or RSA) key."""
    raw = doc.get("csr")
    if not isinstance(raw, str) or len(raw) > 16384:
        raise Refused(E.MALFORMED, "csr: missing or not PEM text")
    try:
        csr = x509.load_pem_x509_csr(raw.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as e:
        raise Refused(E.CSR_INVALID, "csr: not a PEM certificate request") from e
    if not csr.is_signature_valid:
        raise Refused(
            E.CSR_INVALID, "csr: its signature does not verify (no proof of possession)"
        )
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise Refused(E.CSR_INVALID, "csr: key type not allowed")
    return csr, key
