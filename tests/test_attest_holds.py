"""
LDevIDs, plans and disk checks only while the attestation still holds
(review H3, H2, M6, M7; regression tests for the review's probes).

A software node (no TPM: L{tests.softtpm.SoftNode}) attests against the
real services over a real database. Then: renewal carries the EK digest
forward and needs the binding to still name the serial [T1] [T3];
a legacy LDevID cuts over by attesting, never by renewal [T4]; a device
being decommissioned gets no challenge, LDevID, renewal, record, plan or
disk check [R1]; attestation refusals say why the binding is missing
[T1]; the plan withholds the META code until a target disk exists [D1].
Challenges per EK are in L{tests.test_attest_flood}.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from fleetd.attest.identity import Peer
from fleetd.device.disks import NodeDisksResource
from fleetd.device.resource import deviceRoot
from fleetd.logs import ThrottledLog
from fleetd.nodes import NodeIdentity
from fleetd.pki.ldevid import Subject, serialHex
from fleetd.pki.records import LDevIDRecord
from fleetd.trust.disks import DiskService
from fleetd.web.resources import Router
from tests.attestserver import WHY, HoldsTestCase


class RenewTests(HoldsTestCase):
    """Renewal needs the attestation to still hold [T1] [T3] [T4] [R1]."""

    def test_renew_carriesEKDigest(self) -> None:
        """
        [T3] [T1] Renewal carries the EK digest forward: the renewed record
        and its journal entry name the attested EK, so a second renewal
        still knows (and checks) it.
        """
        peer = self.attest()
        for _ in range(2):
            out = self.successResultOf(self.renew(peer))
            cert = x509.load_pem_x509_certificate(out["certificate"].encode())
            peer = self.server.identify.checkCertificate(cert)
            current = self.server.book.current("SER1")
            assert current is not None
            self.assertEqual(current.ek_sha256, self.digest)
        entries = self.server.entries("ldevid.issued")
        self.assertEqual(
            [e.fields["how"] for e in entries], ["attest", "renew", "renew"]
        )
        self.assertEqual(self.server.results(), {"accepted": 1, "renewed": 2})
        self.assertEqual({e.fields["ek_sha256"] for e in entries}, {self.digest})
        rows = self.server.db.execute("SELECT ek_sha256 FROM ldevids").fetchall()
        self.assertEqual(rows, [(self.digest,)] * 3)

    def test_renew_bindingWithdrawn_refusedSayingWhy(self) -> None:
        """
        [T1] A node whose binding was withdrawn or suspended since it
        attested cannot renew: ek-binding-not-approved with the binding's
        own reason, journaled; nothing issued.
        """
        peer = self.attest()
        self.server.bindings.approved.clear()
        refusal = self.refused(self.renew(peer), "ek-binding-not-approved")
        self.assertEqual(refusal.line(), WHY)
        self.assertEqual(self.reasons, [self.digest])
        self.assertEqual(self.issued(), ["attest"])

    def test_renew_reboundToOtherChassis_refused(self) -> None:
        """[T1] The EK now bound to another serial: serial-mismatch, no LDevID."""
        peer = self.attest()
        self.server.bindings.approved[self.digest] = "SER2"
        self.refused(self.renew(peer), "serial-mismatch")
        self.assertEqual(self.issued(), ["attest"])

    def test_renew_retired_refused(self) -> None:
        """
        [R1] A device being decommissioned cannot renew: device-retired,
        journaled with the device; nothing issued, the record unchanged.
        """
        peer = self.attest()
        before = self.server.book.current("SER1")
        self.retire()
        refusal = self.refused(self.renew(peer), "device-retired")
        self.assertIn("decommissioned", refusal.detail)
        self.assertEqual(self.server.results(), {"accepted": 1, "device-retired": 1})
        self.assertEqual(self.server.entries("attest.refused")[-1].device, "w1")
        self.assertEqual(self.issued(), ["attest"])
        self.assertEqual(self.server.book.current("SER1"), before)

    def test_renew_withoutAttestation_attestRequired(self) -> None:
        """
        [T4] [T3] The review's probe: an LDevID with no attested record (a
        legacy software key, or one renewed before EK digests were kept)
        is never renewed into an LDevID from the current issuer, whatever
        the binding says: attest-required, nothing issued.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        issuer = self.server.issuer
        cert = issuer.issue(key.public_key(), Subject("w1", "SER1"), 1.8e9)
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
            .sign(key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
            .decode()
        )
        peer = Peer(NodeIdentity("w1", "SER1"), cert, "CN=issuer", True)
        d = Deferred.fromCoroutine(self.server.service.renew(peer, {"csr": csr}))
        self.refused(d, "attest-required")
        # Renewed before EK digests were kept: current, but no EK on record.
        self.server.book.issued(
            LDevIDRecord(
                serialHex(cert), "SER1", "w1", issuer.name, 2e9, 1.8e9, "renew"
            )
        )
        peer = self.server.identify.checkCertificate(cert)
        d = Deferred.fromCoroutine(self.server.service.renew(peer, {"csr": csr}))
        self.refused(d, "attest-required")
        # A legacy certificate is never renewed, even beside an attested record.
        self.server.book.issued(
            LDevIDRecord(
                "01", "SER1", "w1", issuer.name, 2e9, 1.8e9, "attest", "ab" * 32
            )
        )
        self.server.bindings.approved["ab" * 32] = "SER1"
        peer = Peer(NodeIdentity("w1", "SER1"), cert, "CN=capsule", True)
        d = Deferred.fromCoroutine(self.server.service.renew(peer, {"csr": csr}))
        self.refused(d, "attest-required")
        self.assertEqual(self.issued(), [])


class AttestTests(HoldsTestCase):
    """Attestation refuses retired devices and re-checks the binding [T1] [R1]."""

    def test_begin_retired_refused(self) -> None:
        """[R1] A device being decommissioned gets no challenge: device-retired."""
        self.retire()
        self.refused(self.begin(self.node.claim()), "device-retired")
        self.assertEqual(len(self.server.service.challenges), 0)

    def test_prove_retiredAfterChallenge_refused(self) -> None:
        """[R1] Retired between challenge and proof: device-retired, no LDevID."""
        challenge = self.challenge()
        self.retire()
        self.refused(self.prove(self.node.proof(challenge)), "device-retired")
        self.assertEqual(self.issued(), [])
        self.assertIsNone(self.server.book.current("SER1"))

    def test_prove_bindingWithdrawnAfterChallenge_refused(self) -> None:
        """
        [T1] The binding withdrawn between challenge and proof: the proof is
        refused with the binding's reason in the issuing transaction;
        nothing recorded.
        """
        challenge = self.challenge()
        self.server.bindings.approved.clear()
        refusal = self.refused(
            self.prove(self.node.proof(challenge)), "ek-binding-not-approved"
        )
        self.assertEqual(refusal.line(), WHY)
        self.assertEqual(self.issued(), [])
        self.assertEqual(self.server.db.execute("SELECT * FROM ldevids").fetchall(), [])

    def test_begin_unapproved_saysWhy(self) -> None:
        """
        [T1] An EK without a usable binding is refused with the binding's
        reason (bindingRefusal), not a bare "no approved binding".
        """
        self.server.bindings.approved.clear()
        refusal = self.refused(self.begin(self.node.claim()), "ek-binding-not-approved")
        self.assertEqual(refusal.line(), WHY)

    def test_reportedSerial_boundedBeforeJournal(self) -> None:
        """A reported serial of any length is journaled cut to 64 characters."""
        self.server.bindings.approved.clear()
        self.begin(self.node.claim(serial="S" * 100)).addErrback(lambda f: None)
        self.begin(self.node.claim(serial="S" * 5000)).addErrback(lambda f: None)
        for entry in self.server.entries("attest.refused"):
            self.assertLessEqual(len(str(entry.fields["reported_serial"])), 64)

    def test_refusalLog_throttled(self) -> None:
        """A flood of refusals from anyone is a handful of log lines."""
        events: list[Any] = []
        observer: Any = events.append
        self.server.service.refusals._log = ThrottledLog(
            self.server.clock, Logger(observer=observer)
        )
        for _ in range(50):
            self.begin({"tpm_version": "1.2"}).addErrback(lambda f: None)
        self.assertTrue(1 <= len(events) <= 10, len(events))


class LookupTests(HoldsTestCase):
    """Record, plan and disk check of a retired or unbound node [R1] [T1] [D1]."""

    def plan(self, peer: Peer) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.lookups.plan(peer))

    def record(self, peer: Peer) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.lookups.record(peer))

    def readyRun(self) -> None:
        self.server.runs.ready["w1"] = "r-0123456789abcdef"
        self.server.vault.put("r-0123456789abcdef.code", b"ABCD-1234-code")
        config = b"machine:\n  install:\n    image: ghcr.io/x/installer:v1\n"
        self.server.vault.put("r-0123456789abcdef.yaml", config)

    def test_plan_retired_refused(self) -> None:
        """
        [R1] A retired device's plan and record are refused (device-retired,
        journaled): its ready run's code is never handed out.
        """
        peer = self.attest()
        self.readyRun()
        self.server.disks.targets["w1"] = "DISK-1"
        self.retire()
        self.refused(self.plan(peer), "device-retired")
        self.refused(self.record(peer), "device-retired")

    def test_plan_bindingWithdrawn_refused(self) -> None:
        """[T1] An attested node whose binding no longer holds gets no plan."""
        peer = self.attest()
        self.readyRun()
        self.server.disks.targets["w1"] = "DISK-1"
        self.server.bindings.approved.clear()
        refusal = self.refused(self.plan(peer), "ek-binding-not-approved")
        self.assertEqual(refusal.line(), WHY)

    def test_plan_noTargetDisk_codeWithheld(self) -> None:
        """
        [D1] With a ready run but no target disk the plan withholds the META
        code and says why (the disk check's reason); with a target it is
        handed out.
        """
        peer = self.attest()
        self.readyRun()
        self.server.lookups._diskRefusal = lambda db, device: (
            f"disks-not-reported: {device} has not reported"
        )
        plan = self.successResultOf(self.plan(peer))
        self.assertIsNone(plan["meta_0x0b"])
        self.assertIsNone(plan["run"])
        self.assertEqual(plan["image"], "ghcr.io/x/installer:v1")
        self.assertEqual(
            plan["meta_0x0b_withheld"], "disks-not-reported: w1 has not reported"
        )
        self.server.disks.targets["w1"] = "DISK-1"
        plan = self.successResultOf(self.plan(peer))
        self.assertEqual(plan["meta_0x0b"], "ABCD-1234-code")
        self.assertIsNone(plan["meta_0x0b_withheld"])

    def test_disks_retired_refused(self) -> None:
        """
        [R1] [D1] A device being decommissioned cannot report disks: 403
        device-retired, one line, journaled; no report stored.
        """
        self.retire()
        service = DiskService(
            self.server.runner, self.server.journal, self.server.clock
        )
        resource = NodeDisksResource(
            service,
            lambda request: NodeIdentity("w1", "SER1"),
            admit=self.server.lookups.admit,
        )
        node, v1 = Router(), Router()
        node.putChild(b"disks", resource)
        v1.putChild(b"node", node)
        stub: Any = StubTreq(deviceRoot(v1))
        d = stub.post(
            "https://device.test/v1/node/disks", data=json.dumps({"disks": []})
        )
        stub.flush()
        response = self.successResultOf(d)
        body = self.successResultOf(response.content())
        self.assertEqual(response.code, 403)
        self.assertTrue(body.startswith(b"device-retired: "), body)
        self.assertEqual(body.count(b"\n"), 1)
        self.assertEqual(self.server.entries("disks.reported"), [])
        self.assertEqual(self.server.entries("disks.refused"), [])
        self.assertEqual(self.server.entries("attest.refused")[-1].device, "w1")
