"""
LDevIDs, plans and disk checks only while the attestation still holds
(review H3, H2, M6, M7; regression tests for the review's probes).

A software node (no TPM: L{tests.softtpm.SoftNode}) attests against the
real services over a real database. Then: renewal carries the EK digest
forward and needs the binding to still name the serial [T1] [T3];
a legacy LDevID cuts over by attesting, never by renewal [T4]; a device
being decommissioned gets no challenge, LDevID, renewal, record, plan or
disk check [R1]; attestation refusals say why the binding is missing
[T1]; the plan withholds the META code until a target disk exists [D1];
an EK holds at most one outstanding challenge [T3].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.attest.errors import Refused
from fleetd.attest.identity import Peer
from fleetd.attest.tpm import ekDigest, spkiOf
from fleetd.inventory.model import DeviceStatus
from tests.attestserver import AttestServer
from tests.softtpm import SoftNode
from tests.test_attest_checks import pki

WHY = (
    "ek-binding-not-approved: the binding of serial SER1 to EK 0123456789abcdef..."
    " is suspended: its receiving-scan evidence was withdrawn"
)


class HoldsTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = AttestServer(Path(self.mktemp()), pki(Path(self.mktemp())))
        self.addCleanup(self.server.db.close)
        self.addCleanup(self.server.service.stop)
        caCert = x509.load_pem_x509_certificate(self.server.pki.ek_ca.read_bytes())
        caKey = serialization.load_pem_private_key(
            self.server.pki.ek_ca_key.read_bytes(), None
        )
        self.caCert, self.caKey = caCert, caKey
        self.node = SoftNode(caCert, caKey)
        self.server.addDevice("w1", "SER1")
        self.server.addDevice("w2", "SER2")
        self.digest = ekDigest(spkiOf(self.node.ekPublic))
        self.server.bindings.approved[self.digest] = "SER1"
        self.reasons: list[str] = []

        def why(db: Any, ek: str) -> str:
            self.reasons.append(ek)
            return WHY

        self.server.service._bindingRefusal = why

    def begin(self, doc: dict[str, Any]) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.service.begin(doc))

    def prove(self, doc: dict[str, Any]) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.service.prove(doc))

    def challenge(self, node: SoftNode | None = None) -> dict[str, Any]:
        node = node or self.node
        result: dict[str, Any] = self.successResultOf(self.begin(node.claim()))
        return result

    def attest(self) -> Peer:
        """Attest the software node; the peer its new LDevID makes it."""
        issued = self.successResultOf(self.prove(self.node.proof(self.challenge())))
        cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
        return self.server.identify.checkCertificate(cert)

    def renew(self, peer: Peer) -> Deferred[Any]:
        doc = {"csr": self.node.csr()}
        return Deferred.fromCoroutine(self.server.service.renew(peer, doc))

    def retire(self, name: str = "w1") -> None:
        self.successResultOf(
            self.server.inventory.setStatus(
                name, DeviceStatus.DECOMMISSIONING, journal=[]
            )
        )

    def refused(self, d: Deferred[Any], reason: str) -> Refused:
        """C{d} failed with C{reason}, journaled as the last refusal."""
        refusal: Refused = self.failureResultOf(d, Refused).value
        self.assertEqual(refusal.reason, reason, refusal.line())
        self.assertEqual(refusal.line().count("\n"), 0)
        entries = self.server.entries("attest.refused")
        self.assertEqual(entries[-1].fields["reason"], reason)
        return refusal

    def issued(self) -> list[str]:
        return [e.fields["how"] for e in self.server.entries("ldevid.issued")]


class ChallengePerEKTests(HoldsTestCase):
    """[T3] One outstanding challenge per EK digest, under a global cap."""

    def test_newChallenge_replacesOlder(self) -> None:
        """
        [T3] A second challenge for the same EK replaces the first: the book
        holds one entry, the old one is unknown, the new one is answered.
        """
        first = self.challenge()
        second = self.challenge()
        self.assertEqual(len(self.server.service.challenges), 1)
        self.refused(self.prove(self.node.proof(first)), "challenge-unknown")
        self.successResultOf(self.prove(self.node.proof(second)))
        self.assertEqual(self.issued(), ["attest"])

    def test_replay_cannotFillBook(self) -> None:
        """
        [T3] With the book at its cap, replaying a held EK still gets a
        (replacing) challenge, while a new EK is told busy; timers stay one
        per entry.
        """
        self.server.service.challenges.limit = 1
        other = SoftNode(self.caCert, self.caKey, serial="SER2")
        self.server.bindings.approved[ekDigest(spkiOf(other.ekPublic))] = "SER2"
        for _ in range(5):
            self.challenge()
        self.assertEqual(len(self.server.service.challenges), 1)
        self.assertEqual(len(self.server.clock.getDelayedCalls()), 1)
        self.refused(self.begin(other.claim()), "busy")
