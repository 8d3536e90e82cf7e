"""
Every check of the server checklist against hand-made bad input (software
node, no TPM): truncated structures, trailing bytes, wrong attributes,
certificates that do not chain, garbage DER and PEM, bent certify and CSR.
Each is a 4xx with its reason code and a journal entry, never a 500 [T3].
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from tpm2_pytss.constants import TPM2_GENERATED, TPM2_ST, TPMA_OBJECT
from twisted.web.resource import getChildForRequest
from twisted.web.test.requesthelper import DummyRequest

from fleetd.attest.tpm import AK_MUST, ekDigest, spkiOf
from fleetd.device.attest import deviceAPI
from fleetd.device.refusals import statusOf
from fleetd.nodes import Refused
from fleetd.store.entries import JournalRefused
from tests.attestserver import ChecklistTestCase
from tests.softtpm import SoftNode, b64, publicArea

A = TPMA_OBJECT


class ClaimTests(ChecklistTestCase):
    def test_softwareNode_issued(self) -> None:
        """[T3] the happy path with a software node (the fixtures are right)."""
        issued = self.successResultOf(self.prove(self.node.proof(self.challenge())))
        self.assertIn("BEGIN CERTIFICATE", issued["certificate"])
        self.assertEqual(len(self.server.entries("ldevid.issued")), 1)

    def test_truncatedEKPublic(self) -> None:
        """A truncated TPM2B_PUBLIC is malformed (400)."""
        raw = self.node.ekPublic.marshal()[:-3]
        self.assertRefused(self.begin(self.node.claim(ek_public=b64(raw))), "malformed")

    def test_trailingBytesAKPublic(self) -> None:
        """Bytes after the AK's TPM2B_PUBLIC are refused, not ignored."""
        raw = self.node.akPublic.marshal() + b"\x00"
        self.assertRefused(self.begin(self.node.claim(ak_public=b64(raw))), "malformed")

    def test_notBase64(self) -> None:
        """Fields that are not base64 are malformed."""
        self.assertRefused(self.begin(self.node.claim(ek_cert="%%%")), "malformed")

    def test_missingField(self) -> None:
        """A claim without its EK public area is malformed."""
        claim = self.node.claim()
        del claim["ek_public"]
        self.assertRefused(self.begin(claim), "malformed")

    def test_garbageDER(self) -> None:
        """[T3] garbage where the EK certificate goes: ek-cert-untrusted."""
        claim = self.node.claim(ek_cert=b64(b"\x30\x82\x01\x00garbage"))
        self.assertRefused(self.begin(claim), "ek-cert-untrusted")

    def test_PEMInsteadOfDER(self) -> None:
        """[T3] PEM text where DER is expected: ek-cert-untrusted."""
        pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
        self.assertRefused(
            self.begin(self.node.claim(ek_cert=b64(pem))), "ek-cert-untrusted"
        )

    def test_selfSignedEKCert(self) -> None:
        """[T3] an EK certificate that does not chain to a root: ek-cert-untrusted."""
        other = SoftNode(self.caCert, self.node.ekKey)  # signed by the EK key itself
        claim = self.node.claim(ek_cert=b64(other.ekCert))
        self.assertRefused(self.begin(claim), "ek-cert-untrusted")

    def test_ekCertQuirks_wrapperAndTrailingBytes(self) -> None:
        """[T3] an NV-wrapped EK certificate with padding after it still verifies
        (sliced, never re-encoded)."""
        cert = self.node.ekCert
        wrapped = b"\x10\x01" + len(cert).to_bytes(2, "big") + cert + b"\xff" * 37
        self.successResultOf(self.begin(self.node.claim(ek_cert=b64(wrapped))))
        verified = self.server.service.ekRoots.verify(wrapped)
        self.assertEqual(verified.der, cert)  # the very bytes that were signed

    def test_ekPublicOtherKey(self) -> None:
        """[T3] an EK public area not the certificate's key: ek-public-mismatch."""
        other = SoftNode(self.caCert, self.caKey)
        claim = self.node.claim(ek_public=b64(other.ekPublic.marshal()))
        self.assertRefused(self.begin(claim), "ek-public-mismatch")

    def test_ekWithoutTemplateAttributes(self) -> None:
        """[T3] an 'EK' that can sign is not an EK: ek-attributes."""
        public = publicArea(
            self.node.ekKey, A.FIXEDTPM | A.FIXEDPARENT | A.SENSITIVEDATAORIGIN
            | A.RESTRICTED | A.DECRYPT | A.SIGN_ENCRYPT | A.ADMINWITHPOLICY, ek=True,
        )  # fmt: skip
        claim = self.node.claim(ek_public=b64(public.marshal()))
        self.assertRefused(self.begin(claim), "ek-attributes")

    def test_ekWithOtherPolicy(self) -> None:
        """[T3] an EK whose policy is not PolicyA/PolicyB: ek-attributes."""
        self.node.ekPublic.publicArea.authPolicy = bytes(32)
        claim = self.node.claim(ek_public=b64(self.node.ekPublic.marshal()))
        self.assertRefused(self.begin(claim), "ek-attributes")

    def test_unapprovedBinding(self) -> None:
        """[T1] no approved binding for the EK digest: ek-binding-not-approved."""
        self.server.bindings.approved.clear()
        self.assertRefused(self.begin(self.node.claim()), "ek-binding-not-approved")

    def test_akNotRestricted(self) -> None:
        """[T3] an AK that signs anything is refused: ak-attributes."""
        ak = publicArea(self.node.akKey, (AK_MUST & ~A.RESTRICTED) | A.USERWITHAUTH)
        claim = self.node.claim(ak_public=b64(ak.marshal()))
        self.assertRefused(self.begin(claim), "ak-attributes")

    def test_akNotFixedTPM(self) -> None:
        """[T3] an AK that may leave the TPM is refused: ak-attributes."""
        ak = publicArea(self.node.akKey, (AK_MUST & ~A.FIXEDTPM) | A.USERWITHAUTH)
        claim = self.node.claim(ak_public=b64(ak.marshal()))
        self.assertRefused(self.begin(claim), "ak-attributes")

    def test_smallRSAKey(self) -> None:
        """An RSA-1024 AK is refused as malformed (too small)."""
        small = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505
        ak = publicArea(small, AK_MUST | A.USERWITHAUTH)
        claim = self.node.claim(ak_public=b64(ak.marshal()))
        self.assertRefused(self.begin(claim), "malformed")

    def test_versions(self) -> None:
        """[T2] TPM 1.2 by version: tpm12-unsupported; an unknown version: malformed."""
        self.assertRefused(self.begin({"tpm_version": "1.2"}), "tpm12-unsupported")
        self.assertRefused(self.begin(self.node.claim(tpm_version="3.0")), "malformed")

    def test_journalRefuses_refusalStillOneLine(self) -> None:
        """[J1] the journal cannot take the refusal: the node still gets its line."""
        self.server.journalCore.failing = JournalRefused("journal unavailable")
        refusal = self.failureResultOf(
            self.begin({"tpm_version": "1.2"}), Refused
        ).value
        self.assertEqual(refusal.reason, "tpm12-unsupported")
        self.server.journalCore.failing = None
        self.assertEqual(self.server.entries("attest.refused"), [])


class ProofCheckTests(ChecklistTestCase):
    def certified(self, **kw: Any) -> dict[str, Any]:
        challenge = self.challenge()
        nonce = base64.b64decode(challenge["nonce"])
        info, sig = self.node.certify(nonce, **kw)
        return self.node.proof(
            challenge, certify_info=b64(info), certify_signature=b64(sig)
        )

    def test_wrongMagic(self) -> None:
        """[T3] a certify without TPM_GENERATED_VALUE: certify-invalid."""
        proof = self.certified(magic=TPM2_GENERATED.VALUE ^ 1)
        self.assertRefused(self.prove(proof), "certify-invalid")

    def test_wrongType(self) -> None:
        """[T3] a creation attestation (same shape) where a certify belongs:
        certify-invalid."""
        proof = self.certified(kind=TPM2_ST.ATTEST_CREATION)
        self.assertRefused(self.prove(proof), "certify-invalid")

    def test_otherName(self) -> None:
        """[T3] a certify of another object: certify-invalid."""
        proof = self.certified(name=bytes(self.node.akPublic.get_name()))
        self.assertRefused(self.prove(proof), "certify-invalid")

    def test_truncatedSignature(self) -> None:
        """A truncated TPMT_SIGNATURE is malformed."""
        proof = self.node.proof(self.challenge())
        sig = base64.b64decode(proof["certify_signature"])[:-5]
        proof["certify_signature"] = b64(sig)
        self.assertRefused(self.prove(proof), "malformed")

    def test_ldevidRestricted(self) -> None:
        """[T3] an LDevID key that is restricted: ldevid-attributes."""
        from fleetd.attest.tpm import LDEVID_MUST

        self.node.ldPublic = publicArea(
            self.node.ldKey, LDEVID_MUST | A.RESTRICTED | A.USERWITHAUTH
        )
        self.assertRefused(
            self.prove(self.node.proof(self.challenge())), "ldevid-attributes"
        )

    def test_ldevidNotFixedTPM(self) -> None:
        """[T3] an LDevID key that may leave the TPM (imported): ldevid-attributes."""
        from fleetd.attest.tpm import LDEVID_MUST

        self.node.ldPublic = publicArea(
            self.node.ldKey, (LDEVID_MUST & ~A.FIXEDTPM) | A.USERWITHAUTH
        )
        self.assertRefused(
            self.prove(self.node.proof(self.challenge())), "ldevid-attributes"
        )

    def test_garbageCSR(self) -> None:
        """[T3] a CSR that is not PEM: csr-invalid."""
        proof = self.node.proof(
            self.challenge(), csr="-----BEGIN CERTIFICATE REQUEST---"
        )
        self.assertRefused(self.prove(proof), "csr-invalid")

    def test_csrBadSignature(self) -> None:
        """[T3] a CSR whose self-signature fails (no possession): csr-invalid."""
        good = x509.load_pem_x509_csr(self.node.csr().encode())
        der = bytearray(good.public_bytes(serialization.Encoding.DER))
        der[-3] ^= 0xFF
        pem = x509.load_der_x509_csr(bytes(der)).public_bytes(
            serialization.Encoding.PEM
        )
        proof = self.node.proof(self.challenge(), csr=pem.decode())
        self.assertRefused(self.prove(proof), "csr-invalid")

    def test_csrOtherKey(self) -> None:
        """[T3] a CSR for another key than the certified one: csr-invalid."""
        proof = self.node.proof(
            self.challenge(), csr=self.node.csr(ec.generate_private_key(ec.SECP256R1()))
        )
        self.assertRefused(self.prove(proof), "csr-invalid")

    def test_unknownChallenge(self) -> None:
        """[T3] a proof for a challenge fleetd never made: challenge-unknown (404)."""
        proof = self.node.proof(self.challenge())
        proof["challenge"] = "nope"
        refusal = self.assertRefused(self.prove(proof), "challenge-unknown")
        self.assertEqual(statusOf(refusal), 404)

    def test_challengeForgottenAfterTwoTTLs(self) -> None:
        """Expired challenges are remembered one more TTL, then forgotten; no timer."""
        challenge = self.challenge()
        ttl = challenge["ttl"]
        self.server.clock.advance(ttl + 1)
        self.assertEqual(len(self.server.service.challenges), 1)
        self.server.clock.advance(ttl)
        self.assertEqual(len(self.server.service.challenges), 0)
        self.assertEqual(self.server.clock.getDelayedCalls(), [])

    def test_stop_cancelsTimers(self) -> None:
        """Stopping the service cancels every challenge timer."""
        self.challenge()
        self.server.service.stop()
        self.assertEqual(self.server.clock.getDelayedCalls(), [])

    def test_issuance_journalRefuses_nothingIssued(self) -> None:
        """[J1] the journal refuses ldevid.issued: no record, no certificate."""
        self.server.journalCore.failing = JournalRefused("journal full")
        self.server.journalCore.onlyEvents = frozenset({"ldevid.issued"})
        failure = self.failureResultOf(self.prove(self.node.proof(self.challenge())))
        self.assertIsInstance(failure.value, JournalRefused)
        self.server.journalCore.failing = None
        self.assertIsNone(self.server.book.current("SER1"))
        self.assertEqual(self.server.db.execute("SELECT * FROM ldevids").fetchall(), [])


class HTTPTests(ChecklistTestCase):
    def post(
        self, path: list[bytes], body: bytes, kind: bytes = b"application/json"
    ) -> Any:
        api = deviceAPI(self.server.service, self.server.identify, self.server.lookups)
        request = DummyRequest(path)
        request.method = b"POST"
        request.content = io.BytesIO(body)  # type: ignore[attr-defined]
        request.requestHeaders.setRawHeaders(b"content-type", [kind])
        resource = getChildForRequest(api, request)
        resource.render(request)
        return request.responseCode, b"".join(request.written).decode()

    def test_notJSON(self) -> None:
        """A body that is not JSON: 400 malformed, journaled."""
        code, body = self.post([b"attest", b"challenge"], b"{nope")
        self.assertEqual((code, body), (400, "malformed: body: not JSON\n"))
        self.assertEqual(
            self.server.entries("attest.refused")[-1].fields["reason"], "malformed"
        )

    def test_duplicateKeys(self) -> None:
        """A JSON body naming a key twice: 400."""
        code, body = self.post([b"attest", b"challenge"], b'{"a": 1, "a": 2}')
        self.assertEqual(code, 400)
        self.assertIn("appears twice", body)

    def test_wrongContentType(self) -> None:
        """Only application/json: 400 malformed."""
        code, _ = self.post([b"attest", b"proof"], b"{}", kind=b"text/plain")
        self.assertEqual(code, 400)

    def test_claimOverHTTP_refusalLine(self) -> None:
        """[T3] a refusal reaches the node as one line starting with its code."""
        claim = json.dumps(self.node.claim(ek_cert=b64(b"junk"))).encode()
        code, body = self.post([b"attest", b"challenge"], claim)
        self.assertEqual(code, 403)
        self.assertTrue(body.startswith("ek-cert-untrusted: "), body)
        self.assertEqual(body.count("\n"), 1)


class JournalThrottleTests(ChecklistTestCase):
    def test_anonymousRefusals_throttledPerReason(self) -> None:
        """[J1] refusals naming no device: one entry per reason per 10 s, the rest
        counted in the next entry; a known device's are throttled apart from
        them, per device and reason."""
        for _ in range(3):
            self.assertRefused(self.begin({"tpm_version": "1.2"}), "tpm12-unsupported")
        self.assertEqual(len(self.server.entries("attest.refused")), 1)
        self.server.clock.advance(10)
        self.assertRefused(self.begin({"tpm_version": "1.2"}), "tpm12-unsupported")
        entries = self.server.entries("attest.refused")
        self.assertEqual(len(entries), 2)
        self.assertEqual(entries[-1].fields["not_journaled"], 2)
        self.server.addDevice("old1", "SER9", "worker-g2")
        self.server.bindings.approved[ekDigest(spkiOf(self.node.ekPublic))] = "SER9"
        for _ in range(2):
            claim = self.node.claim(serial="SER9")
            self.assertRefused(self.begin(claim), "class-refused")
        entries = self.server.entries("attest.refused")
        self.assertEqual(len(entries), 3)
        self.assertEqual(entries[-1].device, "old1")
