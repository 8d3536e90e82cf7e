"""
A refused attestation is visible where the owner looks (issue 27, item 4).

Where the EK's evidence, the reported serial or the uuid maps to a device
fleetd knows, C{attest.refused} names it (the journal's device field,
with C{named_by}), throttled so that claiming every serial of the fleet
journals no more than before [J1].
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd import nodes as E
from fleetd.attest.naming import Claim
from fleetd.attest.recorder import RefusalRecorder
from fleetd.attest.results import AttestResults
from fleetd.attest.service import AttestationService
from fleetd.attest.throttle import ANONYMOUS_EVERY, CLAIMED_BURST, NAMED_EVERY
from fleetd.attest.tpm import ekDigest, spkiOf
from fleetd.nodes import Refused
from fleetd.runs.identities import IdentityIndex
from fleetd.trust.bindings import serialsForEK
from fleetd.trust.model import evidence
from fleetd.trust.service import TrustService
from tests.attestserver import AttestServer, serverAndNode

EK = "ab" * 32
EK2 = "cd" * 32


def named(server: AttestServer, reason: str) -> list[tuple[str | None, Any]]:
    """(device, named_by) of each attest.refused entry of C{reason}."""
    return [
        (e.device, e.fields.get("named_by"))
        for e in server.entries("attest.refused")
        if e.fields["reason"] == reason
    ]


class NamingTests(SynchronousTestCase):
    """[J1] The entry names the device the node's claim maps to."""

    def setUp(self) -> None:
        self.server, self.caCert, self.caKey, self.node = serverAndNode(self)
        self.known = IdentityIndex()
        w1 = self.successResultOf(self.server.inventory.get("w1"))
        w2 = self.server.addDevice("w2", "SER2")
        assert w1 is not None
        for d in (w1, w2):
            self.known[d.name] = (d.uuid, d.serial)
        self.uuid = w1.uuid
        self.serials: dict[str, list[str]] = {}
        self.rebuild()

    def rebuild(self, serials: Any = None) -> None:
        """The server's attestation service, with known devices wired."""
        s = self.server
        s.service.stop()
        s.service = AttestationService(
            clock=s.clock,
            runner=s.runner,
            journal=s.journal,
            ekRoots=s.service.ekRoots,
            issuer=s.issuer,
            book=s.book,
            approvedSerialFor=s.bindings,
            deviceBySerial=s.inventory.bySerial,
            metrics=None,
            known=self.known,
            serialsForEK=serials or (lambda db, ek: self.serials.get(ek, [])),
        )
        self.addCleanup(s.service.stop)

    def begin(self, doc: dict[str, Any]) -> Refused:
        d = Deferred.fromCoroutine(self.server.service.begin(doc))
        refusal: Refused = self.failureResultOf(d, Refused).value
        return refusal

    def test_unboundEK_namedByReportedSerial(self) -> None:
        """
        A node whose EK has no binding, reporting w1's serial: the refusal
        names w1, found by its device (fleetctl journal --device w1).
        """
        self.assertEqual(self.begin(self.node.claim()).reason, E.NOT_APPROVED)
        self.assertEqual(
            named(self.server, E.NOT_APPROVED), [("w1", "reported-serial")]
        )
        found = self.successResultOf(self.server.journal.query(device="w1"))
        self.assertEqual([e.event for e in found], ["attest.refused"])
        self.assertEqual(found[0].fields["reported_serial"], "SER1")

    def test_clone_namedByItsEvidence(self) -> None:
        """
        A cloned TPM: its EK's evidence names two serials; the refusal
        names the machine whose serial the node reports among them.
        """
        digest = ekDigest(spkiOf(self.node.ekPublic))
        self.serials[digest] = ["SER2", "SER1"]
        self.begin(self.node.claim())
        self.assertEqual(named(self.server, E.NOT_APPROVED), [("w1", "ek-evidence")])

    def test_otherSerialReported_namedByTheEKsOneSerial(self) -> None:
        """A TPM presented under a serial fleetd does not know: its EK's machine."""
        digest = ekDigest(spkiOf(self.node.ekPublic))
        self.serials[digest] = ["SER2"]
        self.begin(self.node.claim(serial="NOT-IN-INVENTORY"))
        self.assertEqual(named(self.server, E.NOT_APPROVED), [("w2", "ek-evidence")])

    def test_tpm12_namedBySerialOrUUID(self) -> None:
        """[T2] A TPM 1.2 claim has no EK: its serial, else its uuid."""
        self.begin({"tpm_version": "1.2", "serial": "ser2"})
        self.server.clock.advance(NAMED_EVERY)
        self.begin({"tpm_version": "1.2", "serial": "nope", "uuid": self.uuid.upper()})
        self.assertEqual(
            named(self.server, E.TPM12),
            [("w2", "reported-serial"), ("w1", "reported-uuid")],
        )

    def test_serialMismatch_namesTheReportingMachine(self) -> None:
        """
        [T1] An EK bound to w2's chassis, presented by a node reporting
        w1's serial: the refusal names w1 and keeps the bound serial.
        """
        digest = ekDigest(spkiOf(self.node.ekPublic))
        self.server.bindings.approved[digest] = "SER2"
        self.assertEqual(self.begin(self.node.claim()).reason, E.SERIAL_MISMATCH)
        (entry,) = self.server.entries("attest.refused")
        self.assertEqual((entry.device, entry.fields["serial"]), ("w1", "SER2"))

    def test_unknownClaim_namesNoDevice(self) -> None:
        """A claim fleetd cannot map is journaled as before: no device."""
        self.begin(self.node.claim(serial="NOPE"))
        (entry,) = self.server.entries("attest.refused")
        self.assertIsNone(entry.device)
        self.assertNotIn("named_by", entry.fields)

    def test_realEvidence_serialsForEK(self) -> None:
        """trust.bindings.serialsForEK: the serials the EK's evidence names."""
        self.rebuild(serialsForEK)
        s = self.server
        digest = ekDigest(spkiOf(self.node.ekPublic))
        trust = TrustService(s.runner, s.journal, s.inventory, s.clock)
        claim = evidence(serial="SER2", ek_sha256=digest, kind="receiving-scan")
        self.successResultOf(
            Deferred.fromCoroutine(trust.record([claim], actor="owner:o", via="add"))
        )
        self.begin(self.node.claim(serial="NOT-KNOWN"))
        self.assertEqual(named(self.server, E.NOT_APPROVED), [("w2", "ek-evidence")])


class ClaimFloodTests(SynchronousTestCase):
    """[J1] Claiming every serial journals no more than anonymous refusals did."""

    def test_claimsOfManyDevices_bounded(self) -> None:
        """
        TPM 1.2 claims naming 1,000 different known devices within a
        second: CLAIMED_BURST entries name their device, then the rest are
        throttled as refusals naming no device (one entry per reason every
        10 s); every one is counted. The budget refills one entry every
        10 s.
        """
        server, _, _, _ = serverAndNode(self)
        known = IdentityIndex()
        for n in range(1000):
            known[f"d{n}"] = (f"00000000-0000-4000-8000-{n:012d}", f"S{n}")
        results = AttestResults(None)
        recorder = RefusalRecorder(server.clock, server.journal, results, known)

        def claimed(n: int) -> None:
            refusal = Refused(E.TPM12, "TPM 1.2 cannot attest")
            d = recorder.refuse(refusal, claim=Claim(serial=f"S{n}"))
            self.successResultOf(Deferred.fromCoroutine(d))

        for n in range(1000):
            claimed(n)
        entries = server.entries("attest.refused")
        named = [e for e in entries if e.device is not None]
        self.assertEqual(len(named), CLAIMED_BURST)
        self.assertEqual(len(entries), CLAIMED_BURST + 1)
        self.assertIsNone(entries[-1].device)
        server.clock.advance(ANONYMOUS_EVERY)
        claimed(998)
        claimed(999)
        entries = server.entries("attest.refused")
        self.assertEqual(entries[-2].device, "d998")
        self.assertEqual(entries[-1].device, None)
        self.assertEqual(entries[-1].fields["not_journaled"], 1000 - CLAIMED_BURST - 1)
