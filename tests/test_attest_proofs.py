"""
The proof step against a real swtpm, with the node's answer bent on
purpose: replayed and expired challenges, a certify over another nonce or
of another key, a tampered certify, a wrong activation, a CSR for another
key or naming another node [T3].
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import blockingCallFromThread, deferToThread

from fleetd.agent import tpm
from fleetd.agent.client import Refusal, call, tlsContext
from tests.test_attest_swtpm import SWTPMTestCase


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


REACTOR: Any = reactor


class Node:
    """The agent's steps, one at a time, so a test can bend the proof."""

    def __init__(self, case: SWTPMTestCase) -> None:
        self.case = case
        self.context = tlsContext(str(case.pki.public_ca))

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return call(self.case.url, path, self.context, body)

    def begin(self, serial: str) -> tuple[tpm.Keys, dict[str, Any]]:
        ectx = tpm.openTPM(self.case.swtpm.tcti)
        try:
            keys = tpm.createKeys(ectx, "rsa")
        finally:
            ectx.close()
        challenge = self.post(
            "/v1/attest/challenge",
            {
                "tpm_version": "2.0",
                "serial": serial,
                "ek_cert": b64(keys.ekCert),
                "ek_public": b64(keys.ekPublic.marshal()),
                "ak_public": b64(keys.akPublic.marshal()),
            },
        )
        return keys, challenge

    def proof(
        self,
        keys: tpm.Keys,
        challenge: dict[str, Any],
        *,
        nonce: bytes | None = None,
        subject: str = "SER1",
    ) -> dict[str, Any]:
        ectx = tpm.openTPM(self.case.swtpm.tcti)
        try:
            secret = tpm.activate(
                ectx,
                keys,
                base64.b64decode(challenge["credential_blob"]),
                base64.b64decode(challenge["encrypted_secret"]),
            )
            info, signature, csr = tpm.certifyAndCSR(
                ectx,
                keys,
                base64.b64decode(challenge["nonce"]) if nonce is None else nonce,
                subject,
            )
        finally:
            ectx.close()
        return {
            "challenge": challenge["challenge"],
            "secret": b64(secret),
            "ldevid_public": b64(keys.ldevidPublic.marshal()),
            "certify_info": b64(info),
            "certify_signature": b64(signature),
            "csr": csr.decode("ascii"),
        }

    def otherKey(self, keys: tpm.Keys) -> tpm.Keys:
        """The same TPM's keys with a fresh LDevID key."""
        ectx = tpm.openTPM(self.case.swtpm.tcti)
        try:
            fresh = tpm.createKeys(ectx, "rsa")
        finally:
            ectx.close()
        keys2 = tpm.Keys(**vars(keys))
        keys2.ldevidPrivate, keys2.ldevidPublic = (
            fresh.ldevidPrivate,
            fresh.ldevidPublic,
        )
        return keys2


class ProofTests(SWTPMTestCase):
    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        d = super().setUp()
        d.addCallback(lambda _: self.approve("w1", "SER1"))
        return d

    def inThread(self, f: Callable[[Node], Any]) -> Deferred[Any]:
        return deferToThread(f, Node(self))

    def refusedWith(self, reason: str, f: Callable[[Node], Any]) -> Deferred[None]:
        async def check() -> None:
            failure = await self.assertFailure(self.inThread(f), Refusal)
            self.assertEqual(failure.reason, reason, failure.line)
            reasons = [
                e.fields["reason"] for e in self.server.entries("attest.refused")
            ]
            self.assertEqual(reasons[-1], reason)
            self.assertEqual(self.server.entries("ldevid.issued"), [])

        return ensureDeferred(check())

    def test_proof_subjectFromInventory(self) -> Deferred[None]:
        """[T3] the LDevID names the inventory device and serial, not the CSR's CN."""

        def run(node: Node) -> dict[str, Any]:
            keys, challenge = node.begin("SER1")
            return node.post(
                "/v1/attest/proof", node.proof(keys, challenge, subject="evil")
            )

        async def check() -> None:
            issued = await self.inThread(run)
            cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
            names = {a.oid: a.value for a in cert.subject}
            self.assertEqual(
                names, {NameOID.COMMON_NAME: "w1", NameOID.SERIAL_NUMBER: "SER1"}
            )
            cert.verify_directly_issued_by(self.server.issuer.cert)

        return ensureDeferred(check())

    def test_proof_replay_refused(self) -> Deferred[None]:
        """[T3] a challenge answers once: the same proof again is challenge-used."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            node.post("/v1/attest/proof", proof)
            node.post("/v1/attest/proof", proof)

        async def check() -> None:
            failure = await self.assertFailure(self.inThread(run), Refusal)
            self.assertEqual((failure.reason, failure.status), ("challenge-used", 410))
            self.assertEqual(len(self.server.entries("ldevid.issued")), 1)

        return ensureDeferred(check())

    def test_proof_expired_refused(self) -> Deferred[None]:
        """[T3] a challenge older than its TTL (injected clock) is challenge-expired."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            advance = self.server.clock.advance
            blockingCallFromThread(REACTOR, advance, challenge["ttl"] + 1)
            node.post("/v1/attest/proof", node.proof(keys, challenge))

        return self.refusedWith("challenge-expired", run)

    def test_proof_otherNonce_refused(self) -> Deferred[None]:
        """[T3] a certify over another nonce than the server's is certify-invalid."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge, nonce=b"\x00\xff\x55\xaa")
            node.post("/v1/attest/proof", proof)

        return self.refusedWith("certify-invalid", run)

    def test_proof_tamperedCertify_refused(self) -> Deferred[None]:
        """[T3] one flipped byte in the certify structure: certify-invalid."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            info = bytearray(base64.b64decode(proof["certify_info"]))
            info[-1] ^= 1
            proof["certify_info"] = b64(bytes(info))
            node.post("/v1/attest/proof", proof)

        return self.refusedWith("certify-invalid", run)

    def test_proof_uncertifiedLDevIDKey_refused(self) -> Deferred[None]:
        """[T3] an LDevID public area that is not the certified key: certify-invalid."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            other = node.otherKey(keys)
            proof["ldevid_public"] = b64(other.ldevidPublic.marshal())
            node.post("/v1/attest/proof", proof)

        return self.refusedWith("certify-invalid", run)

    def test_proof_csrForOtherKey_refused(self) -> Deferred[None]:
        """[T3] a CSR signed by another key than the certified LDevID: csr-invalid."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            other = node.otherKey(keys)
            ectx = tpm.openTPM(self.swtpm.tcti)
            try:
                csr = tpm.csrFor(ectx, other.ldevidPrivate, other.ldevidPublic, "x")
            finally:
                ectx.close()
            proof["csr"] = csr.decode("ascii")
            node.post("/v1/attest/proof", proof)

        return self.refusedWith("csr-invalid", run)

    def test_proof_wrongActivation_refused(self) -> Deferred[None]:
        """[T3] a secret that is not the activated credential: activation-failed."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            proof["secret"] = b64(bytes(32))
            node.post("/v1/attest/proof", proof)

        return self.refusedWith("activation-failed", run)
