"""
A node's attestation messages made in software, for unit tests and the
benchmark: EK, AK and LDevID keys are ordinary keys wrapped in TPM public
areas, the certify structure is marshalled and signed by the AK key. Each
piece can be bent to test one check at a time.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from tpm2_pytss.constants import TPM2_ALG, TPM2_GENERATED, TPM2_ST, TPMA_OBJECT
from tpm2_pytss.types import (
    TPM2B_ENCRYPTED_SECRET,
    TPM2B_ID_OBJECT,
    TPM2B_PUBLIC,
    TPMS_ATTEST,
    TPMT_SIGNATURE,
    TPMT_SYM_DEF_OBJECT,
    TPMU_SYM_KEY_BITS,
    TPMU_SYM_MODE,
)

from fleetd.attest.tpm import AK_MUST, EK_MUST, LDEVID_MUST

A = TPMA_OBJECT
POLICY_A = bytes.fromhex(
    "837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa"
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _pem(key: Any) -> bytes:
    data: bytes = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return data


def publicArea(key: Any, attrs: int, *, ek: bool = False) -> TPM2B_PUBLIC:
    symmetric = None
    if ek:
        symmetric = TPMT_SYM_DEF_OBJECT(
            algorithm=TPM2_ALG.AES,
            keyBits=TPMU_SYM_KEY_BITS(aes=128),
            mode=TPMU_SYM_MODE(aes=TPM2_ALG.CFB),
        )
    public = TPM2B_PUBLIC.from_pem(
        _pem(key), objectAttributes=attrs, symmetric=symmetric
    )
    if ek:
        public.publicArea.authPolicy = POLICY_A
    return public


class SoftNode:
    """One software 'TPM' and the messages it sends."""

    def __init__(self, caCert: Any, caKey: Any, serial: str = "SER1") -> None:
        self.serial = serial
        self.ekKey = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.akKey = ec.generate_private_key(ec.SECP256R1())
        self.ldKey = ec.generate_private_key(ec.SECP256R1())
        self.ekPublic = publicArea(self.ekKey, EK_MUST | A.USERWITHAUTH, ek=True)
        self.akPublic = publicArea(self.akKey, AK_MUST | A.USERWITHAUTH)
        self.ldPublic = publicArea(self.ldKey, LDEVID_MUST | A.USERWITHAUTH)
        now = datetime.now(UTC)
        self.ekCert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(caCert.subject)
            .public_key(self.ekKey.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=3650))
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DirectoryName(
                            x509.Name(
                                [
                                    x509.NameAttribute(
                                        x509.ObjectIdentifier("2.23.133.2.1"),
                                        "id:00001014",
                                    ),
                                ]
                            )
                        )
                    ]
                ),
                critical=True,
            )
            .sign(caKey, hashes.SHA256())
            .public_bytes(serialization.Encoding.DER)
        )

    def claim(self, **changes: Any) -> dict[str, Any]:
        doc = {
            "tpm_version": "2.0",
            "serial": self.serial,
            "ek_cert": b64(self.ekCert),
            "ek_public": b64(self.ekPublic.marshal()),
            "ak_public": b64(self.akPublic.marshal()),
        }
        doc.update(changes)
        return doc

    def activate(self, challenge: dict[str, Any]) -> bytes:
        """ActivateCredential in software with the EK private key."""
        return _activate(self, challenge)

    def certify(
        self, nonce: bytes, *, name: bytes | None = None, magic: int | None = None,
        kind: int | None = None,
    ) -> tuple[bytes, bytes]:  # fmt: skip
        att = TPMS_ATTEST()
        att.magic = TPM2_GENERATED.VALUE if magic is None else magic
        att.type = TPM2_ST.ATTEST_CERTIFY
        att.extraData = nonce
        att.attested.certify.name = (
            bytes(self.ldPublic.get_name()) if name is None else name
        )
        att.qualifiedSigner = bytes(self.akPublic.get_name())
        data = att.marshal()
        if kind is not None:  # magic (4 bytes), then the type
            data = data[:4] + kind.to_bytes(2, "big") + data[6:]
        der = self.akKey.sign(data, ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        sig = TPMT_SIGNATURE()
        sig.sigAlg = TPM2_ALG.ECDSA
        sig.signature.ecdsa.hash = TPM2_ALG.SHA256
        sig.signature.ecdsa.signatureR = r.to_bytes(32, "big")
        sig.signature.ecdsa.signatureS = s.to_bytes(32, "big")
        return data, sig.marshal()

    def csr(self, key: Any = None, cn: str = "whatever") -> str:
        builder = x509.CertificateSigningRequestBuilder().subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        )
        signed = builder.sign(key or self.ldKey, hashes.SHA256())
        return signed.public_bytes(serialization.Encoding.PEM).decode("ascii")

    def proof(self, challenge: dict[str, Any], **changes: Any) -> dict[str, Any]:
        nonce = base64.b64decode(challenge["nonce"])
        info, sig = self.certify(nonce)
        doc = {
            "challenge": challenge["challenge"],
            "secret": b64(self.activate(challenge)),
            "ldevid_public": b64(self.ldPublic.marshal()),
            "certify_info": b64(info),
            "certify_signature": b64(sig),
            "csr": self.csr(),
        }
        doc.update(changes)
        return doc


def _activate(node: SoftNode, challenge: dict[str, Any]) -> bytes:
    """The TPM's ActivateCredential (RSA EK), done with the software EK key."""
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
    from cryptography.hazmat.primitives import hmac as chmac
    from cryptography.hazmat.primitives.asymmetric import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    from tpm2_pytss.internal.crypto import _kdfa  # type: ignore[import-not-found, unused-ignore]

    blob, _ = TPM2B_ID_OBJECT.unmarshal(base64.b64decode(challenge["credential_blob"]))
    enc, _ = TPM2B_ENCRYPTED_SECRET.unmarshal(
        base64.b64decode(challenge["encrypted_secret"])
    )
    seed = node.ekKey.decrypt(
        bytes(enc),
        padding.OAEP(
            mgf=padding.MGF1(hashes.SHA256()),
            algorithm=hashes.SHA256(),
            label=b"IDENTITY\x00",
        ),
    )
    name = bytes(node.akPublic.get_name())
    raw = bytes(blob)
    hmacSize = int.from_bytes(raw[:2], "big")
    integrity, encIdentity = raw[2 : 2 + hmacSize], raw[2 + hmacSize :]
    hmacKey = _kdfa(TPM2_ALG.SHA256, seed, b"INTEGRITY", b"", b"", 256)
    check = chmac.HMAC(hmacKey, hashes.SHA256())
    check.update(encIdentity + name)
    check.verify(integrity)
    symKey = _kdfa(TPM2_ALG.SHA256, seed, b"STORAGE", name, b"", 128)
    plain = Cipher(algorithms.AES(symKey), CFB(b"\x00" * 16)).decryptor()
    cred = plain.update(encIdentity) + plain.finalize()
    size = int.from_bytes(cred[:2], "big")
    return cred[2 : 2 + size]
