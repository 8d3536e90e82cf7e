"""
The attribute and structure checks of the server checklist, one bit and
one byte at a time (software node, hand-made TPM structures): every
required attribute of the EK, AK and LDevID public areas missing, the
forbidden ones present, certify structures truncated or followed by
bytes, keys of a disallowed size, curve or name algorithm. Each is a 4xx
with its reason code and a journal entry, never a 500 [T3].
"""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, rsa
from tpm2_pytss.constants import TPM2_ALG, TPMA_OBJECT

from fleetd.attest.tpm import AK_MUST, EK_MUST, LDEVID_MUST
from tests.attestserver import ChecklistTestCase
from tests.softtpm import b64, publicArea

A = TPMA_OBJECT


def bits(mask: int) -> list[int]:
    return [1 << i for i in range(32) if mask & (1 << i)]


class AttributeMatrixTests(ChecklistTestCase):
    def refusedEach(self, reason: str, attempts: list[tuple[str, Any]]) -> None:
        """
        Each attempt refused with C{reason} and journaled; the clock moves
        past the anonymous refusals' throttle between attempts.
        """
        for label, attempt in attempts:
            before = len(self.server.entries("attest.refused"))
            refusal = self.assertRefused(attempt(), reason)
            self.assertEqual(
                len(self.server.entries("attest.refused")), before + 1, label
            )
            self.assertIn(reason, refusal.line())
            self.server.clock.advance(11)

    def test_ek_eachTemplateAttribute(self) -> None:
        """
        [T3] An EK public area without any one of fixedTPM, fixedParent,
        sensitiveDataOrigin, adminWithPolicy, restricted, decrypt: ek-attributes.
        """
        attempts = []
        for bit in bits(EK_MUST):
            public = publicArea(self.node.ekKey, (EK_MUST & ~bit) | A.USERWITHAUTH,
                                ek=True)  # fmt: skip
            claim = self.node.claim(ek_public=b64(public.marshal()))
            attempts.append((hex(bit), lambda c=claim: self.begin(c)))
        self.assertEqual(len(attempts), 6)
        self.refusedEach("ek-attributes", attempts)

    def test_ak_eachAttribute(self) -> None:
        """
        [T3] An AK without any one of fixedTPM, fixedParent,
        sensitiveDataOrigin, restricted, sign, or with decrypt: ak-attributes.
        """
        attempts = []
        variants = [AK_MUST & ~bit for bit in bits(AK_MUST)] + [AK_MUST | A.DECRYPT]
        for attrs in variants:
            ak = publicArea(self.node.akKey, attrs | A.USERWITHAUTH)
            claim = self.node.claim(ak_public=b64(ak.marshal()))
            attempts.append((hex(attrs), lambda c=claim: self.begin(c)))
        self.assertEqual(len(attempts), 6)
        self.refusedEach("ak-attributes", attempts)

    def test_ldevid_eachAttribute(self) -> None:
        """
        [T3] An LDevID key without any one of fixedTPM, fixedParent,
        sensitiveDataOrigin, sign, or with restricted or decrypt:
        ldevid-attributes (its certify is otherwise right).
        """
        variants = [LDEVID_MUST & ~bit for bit in bits(LDEVID_MUST)]
        variants += [LDEVID_MUST | A.RESTRICTED, LDEVID_MUST | A.DECRYPT]
        attempts = []
        for attrs in variants:

            def attempt(attrs: int = attrs) -> Any:
                self.node.ldPublic = publicArea(self.node.ldKey, attrs | A.USERWITHAUTH)
                return self.prove(self.node.proof(self.challenge()))

            attempts.append((hex(attrs), attempt))
        self.assertEqual(len(attempts), 6)
        self.refusedEach("ldevid-attributes", attempts)

    def test_proofStructures_truncatedOrTrailing_malformed(self) -> None:
        """
        A truncated TPMS_ATTEST, bytes after it or after the TPMT_SIGNATURE,
        and bytes after the LDevID's TPM2B_PUBLIC are malformed, not ignored.
        """

        def bent(field: str, change: Any) -> Any:
            def attempt() -> Any:
                proof = self.node.proof(self.challenge())
                proof[field] = b64(change(base64.b64decode(proof[field])))
                return self.prove(proof)

            return attempt

        self.refusedEach(
            "malformed",
            [
                ("info-truncated", bent("certify_info", lambda b: b[:-4])),
                ("info-trailing", bent("certify_info", lambda b: b + b"\x00")),
                ("sig-trailing", bent("certify_signature", lambda b: b + b"\x00")),
                ("ldevid-trailing", bent("ldevid_public", lambda b: b + b"\x00")),
                ("ldevid-truncated", bent("ldevid_public", lambda b: b[:-2])),
            ],
        )

    def test_keyAlgorithms_malformed(self) -> None:
        """
        Keys outside the allowed algorithms: an RSA-1024 LDevID, a P-521 AK,
        an AK named with SHA-1: malformed.
        """

        def ldevid(key: Any) -> Any:
            def attempt() -> Any:
                self.node.ldPublic = publicArea(key, LDEVID_MUST | A.USERWITHAUTH)
                return self.prove(self.node.proof(self.challenge()))

            return attempt

        def ak(public: Any) -> Any:
            claim = self.node.claim(ak_public=b64(public.marshal()))
            return lambda: self.begin(claim)

        sha1 = publicArea(self.node.akKey, AK_MUST | A.USERWITHAUTH)
        sha1.publicArea.nameAlg = TPM2_ALG.SHA1
        small = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505
        self.refusedEach(
            "malformed",
            [
                ("ldevid-rsa1024", ldevid(small)),
                ("ak-p521", ak(publicArea(ec.generate_private_key(ec.SECP521R1()),
                                          AK_MUST | A.USERWITHAUTH))),
                ("ak-sha1-name", ak(sha1)),
            ],
        )  # fmt: skip
