"""
Checks on the TPM 2.0 structures a node sends, with no TPM on the server.

Every parser refuses truncated input and trailing bytes; names are
computed here from the public areas, never taken from the node. See the
server checklist in the TPM notes (EK template, AK and LDevID attributes,
TPM2_Certify over a server nonce).
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_der_public_key,
)
from tpm2_pytss.constants import (
    TPM2_ALG,
    TPM2_ECC,
    TPM2_GENERATED,
    TPM2_ST,
    TPMA_OBJECT,
)
from tpm2_pytss.types import (
    TPM2B_NAME,
    TPM2B_PUBLIC,
    TPMS_ATTEST,
    TPMT_SIGNATURE,
)
from tpm2_pytss.utils import make_credential

from fleetd.nodes import (
    AK_ATTRIBUTES,
    CERTIFY_INVALID,
    EK_MISMATCH,
    EK_TEMPLATE,
    LDEVID_ATTRIBUTES,
    MALFORMED,
    Refused,
)

A = TPMA_OBJECT
_RESIDENT = A.FIXEDTPM | A.FIXEDPARENT | A.SENSITIVEDATAORIGIN
EK_MUST = _RESIDENT | A.ADMINWITHPOLICY | A.RESTRICTED | A.DECRYPT
AK_MUST = _RESIDENT | A.RESTRICTED | A.SIGN_ENCRYPT
LDEVID_MUST = _RESIDENT | A.SIGN_ENCRYPT
ALLOWED_CURVES = frozenset({TPM2_ECC.NIST_P256, TPM2_ECC.NIST_P384})
MIN_RSA_BITS = 2048

# TCG EK Credential Profile: PolicyA (low range, SHA-256) and PolicyB
# (high range) for SHA-256/384/512.
EK_POLICIES = frozenset(
    bytes.fromhex(h)
    for h in (
        "837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa",
        "ca3d0a99a2b93906f7a3342414efcfb3a385d44cd1fd459089d19b5071c0b7a0",
        "b26e7d28d11a50bc53d882bcf5fd3a1a074148bb35d3b4e4cb1c0ad9bde419ca"
        "cb47ba09699646150f9fc000f3f80e12",
        "b8221ca69e8550a4914de3faa6a18c072cc01208073a928d5d66d59ef79e49a4"
        "29c41a6b269571d57edb25fbdb1838425608b413cd616a5f6db5b6071af99bea",
    )
)


def parsePublic(data: bytes, what: str) -> TPM2B_PUBLIC:
    """A TPM2B_PUBLIC with nothing missing and nothing after it."""
    try:
        public, used = TPM2B_PUBLIC.unmarshal(data)
    except Exception as e:  # the marshaller raises several kinds
        raise Refused(MALFORMED, f"{what}: not a TPM2B_PUBLIC") from e
    if used != len(data) or public.size == 0:
        raise Refused(
            MALFORMED, f"{what}: {len(data) - used} bytes after the structure"
        )
    _checkAlgorithm(public, what)
    return public


def _checkAlgorithm(public: TPM2B_PUBLIC, what: str) -> None:
    area = public.publicArea
    if area.type == TPM2_ALG.RSA:
        bits = area.parameters.rsaDetail.keyBits
        if bits < MIN_RSA_BITS:
            raise Refused(MALFORMED, f"{what}: RSA-{bits} is too small")
    elif area.type == TPM2_ALG.ECC:
        if area.parameters.eccDetail.curveID not in ALLOWED_CURVES:
            raise Refused(MALFORMED, f"{what}: curve not allowed (P-256, P-384)")
    else:
        raise Refused(MALFORMED, f"{what}: key type is neither RSA nor ECC")
    if area.nameAlg not in (TPM2_ALG.SHA256, TPM2_ALG.SHA384, TPM2_ALG.SHA512):
        raise Refused(MALFORMED, f"{what}: name algorithm not allowed")


def spkiOf(public: TPM2B_PUBLIC) -> bytes:
    """The canonical DER SubjectPublicKeyInfo of a TPM public area."""
    return canonicalSPKI(public.to_der())


def canonicalSPKI(der: bytes) -> bytes:
    key = load_der_public_key(der)
    return key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


def ekDigest(spki: bytes) -> str:
    """
    The EK digest (design.md, wire contract): lower-case hex SHA-256 of
    the EK's DER SubjectPublicKeyInfo.
    """
    return hashlib.sha256(spki).hexdigest()


def checkEK(ek: TPM2B_PUBLIC, certSPKI: bytes) -> bytes:
    """
    The EK public area must carry the TCG template attributes and the
    same key as the EK certificate; returns the canonical SPKI.
    """
    attrs = ek.publicArea.objectAttributes
    if attrs & EK_MUST != EK_MUST or attrs & A.SIGN_ENCRYPT:
        raise Refused(EK_TEMPLATE, "EK public area lacks the TCG EK attributes")
    if bytes(ek.publicArea.authPolicy) not in EK_POLICIES:
        raise Refused(EK_TEMPLATE, "EK policy is not the TCG EK policy (A or B)")
    spki = spkiOf(ek)
    try:
        certKey = canonicalSPKI(certSPKI)
    except ValueError as e:
        raise Refused(EK_MISMATCH, "EK certificate key unreadable") from e
    if not hmac.compare_digest(spki, certKey):
        raise Refused(EK_MISMATCH, "EK certificate key differs from the EK public area")
    return spki


def checkAK(ak: TPM2B_PUBLIC) -> None:
    """A restricted signing key that cannot leave the TPM [T3]."""
    attrs = ak.publicArea.objectAttributes
    if attrs & AK_MUST != AK_MUST or attrs & A.DECRYPT:
        raise Refused(
            AK_ATTRIBUTES,
            "AK must be fixedTPM, fixedParent, sensitiveDataOrigin, restricted,"
            " sign and not decrypt",
        )


def checkLDevID(ldevid: TPM2B_PUBLIC) -> None:
    """A TPM-resident, non-restricted signing key."""
    attrs = ldevid.publicArea.objectAttributes
    if attrs & LDEVID_MUST != LDEVID_MUST or attrs & (A.RESTRICTED | A.DECRYPT):
        raise Refused(
            LDEVID_ATTRIBUTES,
            "LDevID key must be fixedTPM, fixedParent, sensitiveDataOrigin, sign,"
            " and neither restricted nor decrypt",
        )


def nameOf(public: TPM2B_PUBLIC) -> bytes:
    return bytes(public.get_name())


def makeChallenge(
    ek: TPM2B_PUBLIC, ak: TPM2B_PUBLIC, secret: bytes
) -> tuple[bytes, bytes]:
    """MakeCredential to the EK for the AK's name: (blob, encrypted secret)."""
    blob, encrypted = make_credential(ek, secret, TPM2B_NAME(nameOf(ak)))
    return blob.marshal(), encrypted.marshal()


def verifyCertify(
    attest: bytes,
    signature: bytes,
    ak: TPM2B_PUBLIC,
    nonce: bytes,
    ldevid: TPM2B_PUBLIC,
) -> None:
    """
    TPM2_Certify of the LDevID key by the AK over the server's nonce:
    signature, magic, type, qualifying data and the certified name.
    """
    try:
        info, used = TPMS_ATTEST.unmarshal(attest)
        sig, sigUsed = TPMT_SIGNATURE.unmarshal(signature)
    except Exception as e:
        raise Refused(MALFORMED, "certify: not a TPMS_ATTEST and TPMT_SIGNATURE") from e
    if used != len(attest) or sigUsed != len(signature):
        raise Refused(MALFORMED, "certify: bytes after the structure")
    try:
        sig.verify_signature(ak, attest)
    except (InvalidSignature, ValueError, TypeError) as e:
        raise Refused(
            CERTIFY_INVALID, "certify signature does not verify with the AK"
        ) from e
    if info.magic != TPM2_GENERATED.VALUE:
        raise Refused(CERTIFY_INVALID, "certify was not generated by a TPM")
    if info.type != TPM2_ST.ATTEST_CERTIFY:
        raise Refused(CERTIFY_INVALID, "not a certify attestation")
    if not hmac.compare_digest(bytes(info.extraData), nonce):
        raise Refused(CERTIFY_INVALID, "certify is not over this challenge's nonce")
    if not hmac.compare_digest(bytes(info.attested.certify.name), nameOf(ldevid)):
        raise Refused(CERTIFY_INVALID, "certified key is not the LDevID key")
