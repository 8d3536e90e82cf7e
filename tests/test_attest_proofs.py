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
from twisted.internet.defer import Deferred
from twisted.internet.threads import blockingCallFromThread, deferToThread

from fleetd.agent import tpm
from fleetd.agent.client import Refusal
from tests.softtpm import b64
from tests.swtpmsupport import Node, SWTPMTestCase

REACTOR: Any = reactor


class ProofTests(SWTPMTestCase):
    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        d = super().setUp()
        d.addCallback(lambda _: self.approve("w1", "SER1"))
        return d

    def inThread(self, f: Callable[[Node], Any]) -> Deferred[Any]:
        return deferToThread(f, Node(self))

    async def refusedWith(self, reason: str, f: Callable[[Node], Any]) -> None:
        failure = await self.assertFailure(self.inThread(f), Refusal)
        self.assertEqual(failure.reason, reason, failure.line)
        reasons = [e.fields["reason"] for e in self.server.entries("attest.refused")]
        self.assertEqual(reasons[-1], reason)
        self.assertEqual(self.server.entries("ldevid.issued"), [])

    async def test_proof_subjectFromInventory(self) -> None:
        """[T3] the LDevID names the inventory device and serial, not the CSR's CN."""

        def run(node: Node) -> dict[str, Any]:
            keys, challenge = node.begin("SER1")
            return node.post(
                "/v1/attest/proof", node.proof(keys, challenge, subject="evil")
            )

        issued = await self.inThread(run)
        cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
        names = {a.oid: a.value for a in cert.subject}
        self.assertEqual(
            names, {NameOID.COMMON_NAME: "w1", NameOID.SERIAL_NUMBER: "SER1"}
        )
        cert.verify_directly_issued_by(self.server.issuer.cert)

    async def test_proof_replay_refused(self) -> None:
        """[T3] a challenge answers once: the same proof again is challenge-used."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            node.post("/v1/attest/proof", proof)
            node.post("/v1/attest/proof", proof)

        failure = await self.assertFailure(self.inThread(run), Refusal)
        self.assertEqual((failure.reason, failure.status), ("challenge-used", 410))
        self.assertEqual(len(self.server.entries("ldevid.issued")), 1)

    async def test_proof_expired_refused(self) -> None:
        """[T3] a challenge older than its TTL (injected clock) is challenge-expired."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            advance = self.server.clock.advance
            blockingCallFromThread(REACTOR, advance, challenge["ttl"] + 1)
            node.post("/v1/attest/proof", node.proof(keys, challenge))

        await self.refusedWith("challenge-expired", run)

    async def test_proof_otherNonce_refused(self) -> None:
        """[T3] a certify over another nonce than the server's is certify-invalid."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge, nonce=b"\x00\xff\x55\xaa")
            node.post("/v1/attest/proof", proof)

        await self.refusedWith("certify-invalid", run)

    async def test_proof_tamperedCertify_refused(self) -> None:
        """[T3] one flipped byte in the certify structure: certify-invalid."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            info = bytearray(base64.b64decode(proof["certify_info"]))
            info[-1] ^= 1
            proof["certify_info"] = b64(bytes(info))
            node.post("/v1/attest/proof", proof)

        await self.refusedWith("certify-invalid", run)

    async def test_proof_uncertifiedLDevIDKey_refused(self) -> None:
        """[T3] an LDevID public area that is not the certified key: certify-invalid."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            other = node.otherKey(keys)
            proof["ldevid_public"] = b64(other.ldevidPublic.marshal())
            node.post("/v1/attest/proof", proof)

        await self.refusedWith("certify-invalid", run)

    async def test_proof_csrForOtherKey_refused(self) -> None:
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

        await self.refusedWith("csr-invalid", run)

    async def test_proof_wrongActivation_refused(self) -> None:
        """[T3] a secret that is not the activated credential: activation-failed."""

        def run(node: Node) -> None:
            keys, challenge = node.begin("SER1")
            proof = node.proof(keys, challenge)
            proof["secret"] = b64(bytes(32))
            node.post("/v1/attest/proof", proof)

        await self.refusedWith("activation-failed", run)
