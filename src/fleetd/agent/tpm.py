"""
The node's TPM work for C{fleetd-agent}, through tpm2-pytss ESAPI.

Every transient object and session is flushed as soon as its step is done
(resource managers are not always there: swtpm has none and only three
object slots). The EK certificate is read from the NV indices of the TCG
EK credential profile, low range first (RSA-2048, ECC P-256), then the
high range (H-1 ... H-7). Keys live under the owner hierarchy's standard
SRK (ECC P-256, AES-128-CFB, noDA): the LDevID is saved as a TSS2 PEM key
with that parent, the form TPM-aware TLS stacks (tpm2-openssl) load.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID
from tpm2_pytss import ESAPI, TSS2_Exception
from tpm2_pytss.constants import (
    ESYS_TR,
    TPM2_ALG,
    TPM2_CAP,
    TPM2_PT,
    TPM2_SE,
    TPMA_OBJECT,
)
from tpm2_pytss.types import (
    TPM2B_ENCRYPTED_SECRET,
    TPM2B_ID_OBJECT,
    TPM2B_PRIVATE,
    TPM2B_PUBLIC,
    TPML_DIGEST,
    TPMT_SIG_SCHEME,
    TPMT_SYM_DEF,
)
from tpm2_pytss.utils import NoSuchIndex, NVReadEK, create_ek_template

# TPM 1.2 answers a TPM 2.0 command with a 1.2 tag; the TSS reports it so.
TPM12_RC = 0x80001
OWNER = 0x40000001

EK_TYPES = {
    "rsa": ("EK-RSA2048", "EK-HIGH-RSA2048", "EK-HIGH-RSA3072", "EK-HIGH-RSA4096"),
    "ecc": ("EK-ECC256", "EK-HIGH-ECC256", "EK-HIGH-ECC384", "EK-HIGH-ECC521"),
}

# TCG EK Credential Profile, B.6: PolicyA (PolicySecret(endorsement)) and
# PolicyC (PolicyAuthorizeNV); a high-range EK's PolicyB is their OR.
_POLICY_A = {
    TPM2_ALG.SHA256: "837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa",
    TPM2_ALG.SHA384: "8bbf2266537c171cb56e403c4dc1d4b64f432611dc386e6f532050c3278c930e"
    "143e8bb1133824ccb431053871c6db53",
}
_POLICY_C = {
    TPM2_ALG.SHA256: "3767e2edd43ff45a3a7e1eaefcef78643dca964632e7aad82c673a30d8633fde",
    TPM2_ALG.SHA384: "d6032ce61f2fb3c240eb3cf6a33237ef2b6a16f4293c22b455e261cffd217ad5"
    "b4947c2d73e63005eed2dc2b3593d165",
}

SRK_ATTRS = TPMA_OBJECT.DEFAULT_TPM2_TOOLS_CREATEPRIMARY_ATTRS | TPMA_OBJECT.NODA
AK_ATTRS = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign"
LDEVID_ATTRS = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|sign"


class TPMError(Exception):
    """The TPM could not do what the agent asked; one line."""


class TPM12(Exception):
    """The TPM is a TPM 1.2 [T2]."""


@dataclass
class Keys:
    """What the node sends in step 1, and the blobs to load keys again."""

    ekType: str
    ekCert: bytes
    ekTemplate: TPM2B_PUBLIC
    ekPublic: TPM2B_PUBLIC
    akPrivate: TPM2B_PRIVATE
    akPublic: TPM2B_PUBLIC
    ldevidPrivate: TPM2B_PRIVATE
    ldevidPublic: TPM2B_PUBLIC


def openTPM(tcti: str) -> ESAPI:
    # Probing absent NV indices is expected; the TSS would log each miss.
    os.environ.setdefault("TSS2_LOG", "esys+none")
    try:
        ectx = ESAPI(tcti)
    except TSS2_Exception as e:
        if e.rc == TPM12_RC:
            raise TPM12() from e
        raise TPMError(f"cannot open the TPM at {tcti}: {e}") from e
    try:
        # The first command tells a TPM 1.2 (it answers with a 1.2 tag).
        ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, TPM2_PT.FIXED, 1)
    except TSS2_Exception as e:
        ectx.close()
        if e.rc == TPM12_RC:
            raise TPM12() from e
        raise TPMError(f"the TPM at {tcti} does not answer: {e}") from e
    return ectx


@contextmanager
def loaded(ectx: ESAPI, handle: Any) -> Iterator[Any]:
    """Flush C{handle} when the block ends, whatever happens."""
    try:
        yield handle
    finally:
        ectx.flush_context(handle)


def _srk(ectx: ESAPI) -> Any:
    template = TPM2B_PUBLIC.parse("ecc256:aes128cfb", objectAttributes=SRK_ATTRS)
    return ectx.create_primary(None, template, ESYS_TR.OWNER)[0]


def readEK(ectx: ESAPI, kind: str = "auto") -> tuple[str, bytes, TPM2B_PUBLIC]:
    """The first EK type (of C{kind}) whose certificate is in NV."""
    kinds = ("rsa", "ecc") if kind == "auto" else (kind,)
    reader = NVReadEK(ectx)
    for k in kinds:
        for ekType in EK_TYPES[k]:
            try:
                cert, template = create_ek_template(ekType, reader)
            except (ValueError, NoSuchIndex):
                continue
            if cert:
                return ekType, bytes(cert), template
    raise TPMError("no EK certificate in the TPM's NV indices")


def createKeys(ectx: ESAPI, kind: str = "auto") -> Keys:
    """Read the EK certificate, derive the EK, create AK and LDevID keys."""
    ekType, cert, template = readEK(ectx, kind)
    handle, ekPublic = ectx.create_primary(None, template, ESYS_TR.ENDORSEMENT)[:2]
    ectx.flush_context(handle)
    with loaded(ectx, _srk(ectx)) as srk:
        akTemplate = TPM2B_PUBLIC.parse(
            "ecc256:ecdsa-sha256:null", objectAttributes=AK_ATTRS
        )
        akPrivate, akPublic = ectx.create(srk, None, akTemplate)[:2]
        ldTemplate = TPM2B_PUBLIC.parse("ecc256", objectAttributes=LDEVID_ATTRS)
        ldPrivate, ldPublic = ectx.create(srk, None, ldTemplate)[:2]
    return Keys(
        ekType, cert, template, ekPublic, akPrivate, akPublic, ldPrivate, ldPublic
    )


def activate(ectx: ESAPI, keys: Keys, blob: bytes, encrypted: bytes) -> bytes:
    """ActivateCredential with the AK and EK: the secret MakeCredential sealed."""
    credential, _ = TPM2B_ID_OBJECT.unmarshal(blob)
    secret, _ = TPM2B_ENCRYPTED_SECRET.unmarshal(encrypted)
    nameAlg = keys.ekPublic.publicArea.nameAlg
    ek = ectx.create_primary(None, keys.ekTemplate, ESYS_TR.ENDORSEMENT)[0]
    with loaded(ectx, ek):
        with loaded(ectx, _srk(ectx)) as srk:
            ak = ectx.load(srk, keys.akPrivate, keys.akPublic)
        with loaded(ectx, ak):
            session = ectx.start_auth_session(
                ESYS_TR.NONE,
                ESYS_TR.NONE,
                TPM2_SE.POLICY,
                TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL),
                nameAlg,
            )
            with loaded(ectx, session):
                ectx.policy_secret(ESYS_TR.ENDORSEMENT, session)
                policy = bytes(keys.ekPublic.publicArea.authPolicy).hex()
                if policy != _POLICY_A.get(nameAlg):  # high range: PolicyB
                    branches = [
                        bytes.fromhex(_POLICY_A[nameAlg]),
                        bytes.fromhex(_POLICY_C[nameAlg]),
                    ]
                    ectx.policy_or(session, TPML_DIGEST(branches))
                digest = ectx.activate_credential(
                    ak, ek, credential, secret, session2=session
                )
    return bytes(digest)


def certifyAndCSR(
    ectx: ESAPI, keys: Keys, nonce: bytes, subject: str
) -> tuple[bytes, bytes, bytes]:
    """TPM2_Certify of the LDevID by the AK over C{nonce}, and a CSR it signs."""
    from tpm2_pytss.cryptography import tpm_ecc_private_key

    with loaded(ectx, _srk(ectx)) as srk:
        ak = ectx.load(srk, keys.akPrivate, keys.akPublic)
        with loaded(ectx, ak):
            ld = ectx.load(srk, keys.ldevidPrivate, keys.ldevidPublic)
            with loaded(ectx, ld):
                info, signature = ectx.certify(
                    ld, ak, nonce, TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL)
                )
                key = tpm_ecc_private_key(ectx, ld)
                name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
                csr = x509.CertificateSigningRequestBuilder().subject_name(name)
                pem = csr.sign(key, hashes.SHA256()).public_bytes(_PEM)
    return info.marshal()[2:], signature.marshal(), pem


def csrFor(
    ectx: ESAPI, private: TPM2B_PRIVATE, public: TPM2B_PUBLIC, subject: str
) -> bytes:
    """A CSR signed inside the TPM by a saved LDevID key (renewal)."""
    from tpm2_pytss.cryptography import tpm_ecc_private_key

    with loaded(ectx, _srk(ectx)) as srk:
        ld = ectx.load(srk, private, public)
        with loaded(ectx, ld):
            key = tpm_ecc_private_key(ectx, ld)
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
            csr = x509.CertificateSigningRequestBuilder().subject_name(name)
            return csr.sign(key, hashes.SHA256()).public_bytes(_PEM)


from cryptography.hazmat.primitives.serialization import Encoding  # noqa: E402

_PEM = Encoding.PEM


# TSS2 PRIVATE KEY (the tpm2-openssl / openssl_tpm2_engine format):
# SEQUENCE { type OID loadableKey, [0] EXPLICIT BOOLEAN emptyAuth,
#            INTEGER parent, OCTET STRING pubkey, OCTET STRING privkey }
_LOADABLE = bytes.fromhex("06066781050a0103")  # OID 2.23.133.10.1.3


def _tlv(tag: int, value: bytes) -> bytes:
    n = len(value)
    if n < 0x80:
        return bytes([tag, n]) + value
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + value


def _readTLV(data: bytes, at: int) -> tuple[int, bytes, int]:
    tag, first = data[at], data[at + 1]
    at += 2
    if first & 0x80:
        count = first & 0x7F
        length = int.from_bytes(data[at : at + count], "big")
        at += count
    else:
        length = first
    return tag, data[at : at + length], at + length


def tss2PEM(public: TPM2B_PUBLIC, private: TPM2B_PRIVATE) -> bytes:
    parent = _tlv(0x02, OWNER.to_bytes(5, "big").lstrip(b"\x00") or b"\x00")
    body = (
        _LOADABLE
        + _tlv(0xA0, _tlv(0x01, b"\xff"))
        + parent
        + _tlv(0x04, public.marshal())
        + _tlv(0x04, private.marshal())
    )
    b64 = base64.encodebytes(_tlv(0x30, body)).replace(b"\n", b"")
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return b"\n".join(
        [
            b"-----BEGIN TSS2 PRIVATE KEY-----",
            *lines,
            b"-----END TSS2 PRIVATE KEY-----",
            b"",
        ]
    )


def readTSS2PEM(pem: bytes) -> tuple[TPM2B_PUBLIC, TPM2B_PRIVATE]:
    lines = [line for line in pem.strip().splitlines() if not line.startswith(b"-----")]
    der = base64.b64decode(b"".join(lines))
    _, seq, _ = _readTLV(der, 0)
    at = 0
    fields = []
    while at < len(seq):
        tag, value, at = _readTLV(seq, at)
        fields.append((tag, value))
    octets = [v for t, v in fields if t == 0x04]
    if len(octets) != 2:
        raise TPMError("not a TSS2 private key")
    return TPM2B_PUBLIC.unmarshal(octets[0])[0], TPM2B_PRIVATE.unmarshal(octets[1])[0]
