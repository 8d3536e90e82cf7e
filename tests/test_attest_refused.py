"""
A refused attestation is visible where the owner looks (issue 27, item 4).

Where the EK's evidence, the reported serial or the uuid maps to a device
fleetd knows, C{attest.refused} names it (the journal's device field,
with C{named_by}), throttled so that claiming every serial of the fleet
journals no more than before [J1]. C{fleetctl status}, the console's
device page and its fleet view show the standing refusal: the reason in
words, when, and the step back, decided from the evidence as it is now;
a later LDevID (a successful attestation) clears it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd import nodes as E
from fleetd.agent.client import Refusal, call, tlsContext
from fleetd.attest.naming import Claim
from fleetd.attest.recorder import RefusalRecorder
from fleetd.attest.results import AttestResults
from fleetd.attest.service import AttestationService
from fleetd.attest.throttle import ANONYMOUS_EVERY, CLAIMED_BURST, NAMED_EVERY
from fleetd.attest.tpm import ekDigest, spkiOf
from fleetd.fleet.status import StatusService
from fleetd.nodes import Refused
from fleetd.runs.identities import IdentityIndex
from fleetd.runs.registry import RunRegistry
from fleetd.statuswords import CLONE_STEP, statusLines
from fleetd.trust.bindings import serialsForEK
from fleetd.trust.model import evidence
from fleetd.trust.refusals import AttestRefusals
from fleetd.trust.service import TrustService
from tests.attestserver import AttestServer, serverAndNode
from tests.consolesupport import ConsoleMixin, text
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.fleetsupport import device
from tests.softtpm import SoftNode
from tests.test_console_device import statusRowsOf
from tests.test_trust import TrustFleet

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


class StandingTests(SynchronousTestCase):
    """
    fleetctl status's report: a planned device whose attestation was
    refused says so, with the step back; not "nothing to do".
    """

    def setUp(self) -> None:
        self.t = TrustFleet(self)
        fleet = self.t.fleet
        # planned, waiting for its node
        (self.provisioned,) = fleet.provision(device("w1", "SER1"))
        registry: RunRegistry = fleet.registry
        self.recorder = RefusalRecorder(
            fleet.clock, fleet.journal, AttestResults(None), registry.index
        )
        self.status = StatusService(
            fleet.inventory, registry, fleet.alerts, fleet.journal,
            trust=self.t.service, refusals=AttestRefusals(fleet.runner, fleet.journal),
        )  # fmt: skip

    def refuse(self, reason: str = E.NOT_APPROVED, serial: str = "SER1") -> None:
        self.t.fleet.clock.advance(NAMED_EVERY)
        refusal = Refused(reason, "no approved binding for this EK")
        self.t.run(
            self.recorder.refuse(
                refusal, claim=Claim(serial=serial), fields={"reported_serial": serial}
            )
        )

    def report(self) -> dict[str, Any]:
        report = self.t.run(self.status.report("w1"))
        doc: dict[str, Any] = json.loads(json.dumps(report.toJSON()))
        return doc

    def test_noEvidence_stepIsEvidenceAdd(self) -> None:
        """
        A clone-free node with no evidence: state and recovery say the
        attestation was refused and to record evidence from the machine.
        """
        self.assertEqual(self.report()["recovery"], None)
        self.refuse()
        doc = self.report()
        self.assertEqual(doc["device"]["status"], "planned")
        refusal = doc["attest_refusal"]
        self.assertEqual(
            (refusal["reason"], refusal["named_by"], refusal["at"]),
            (E.NOT_APPROVED, "reported-serial", self.t.fleet.clock.seconds()),
        )
        self.assertEqual(
            doc["state"],
            "provisioned; its attestation was refused: ek-binding-not-approved"
            " (its TPM's EK has no approved binding; named by the serial it"
            " reported)",
        )
        self.assertTrue(
            doc["recovery"].startswith(
                "fleetctl evidence add --serial SER1 --ek-sha256 DIGEST"
                " --kind receiving-scan"
            ),
            doc["recovery"],
        )
        lines = statusLines(doc)
        self.assertNotIn("recovery: nothing to do", lines)
        self.assertIn(
            "attest:   refused 1970-01-01T00:00:10Z: ek-binding-not-approved (its"
            " TPM's EK has no approved binding; named by the serial it reported)",
            lines,
        )

    def test_evidence_stepIsApprove_thenClone(self) -> None:
        """
        The step follows the evidence as it is now: recorded, approve the
        binding; conflicting (the EK claimed for another serial), a clone.
        """
        self.refuse()
        self.t.add("SER1", EK, "receiving-scan", "dock")
        self.assertEqual(
            self.report()["recovery"],
            "fleetctl binding approve SER1, then run its workflow again",
        )
        self.t.add("SER2", EK, "receiving-scan", "dock")
        self.assertEqual(self.report()["recovery"], CLONE_STEP)

    def test_serialMismatch_isAClone(self) -> None:
        self.refuse(E.SERIAL_MISMATCH)
        self.assertEqual(self.report()["recovery"], CLONE_STEP)

    def test_laterLDevID_clearsIt(self) -> None:
        """An LDevID issued since (attestation or renewal) clears the refusal."""
        self.refuse()
        self.successResultOf(
            self.t.fleet.journal.append(
                "ldevid.issued", actor="attest", device="w1", fields={"how": "attest"}
            )
        )
        doc = self.report()
        self.assertIsNone(doc["attest_refusal"])
        self.assertIsNone(doc["recovery"])
        self.refuse()
        self.assertIsNotNone(self.report()["attest_refusal"])

    def test_deliveredDevice_rowWithStep_stateKept(self) -> None:
        """
        A refusal of a device whose configuration went out does not take
        over its state: the row shows it, its step back beneath it.
        """
        self.t.fleet.fetch(self.provisioned.code)
        self.refuse(E.TPM12)
        doc = self.report()
        self.assertEqual(doc["run"]["state"], "consumed")
        self.assertFalse(doc["state"].startswith("provisioned; its attestation"))
        lines = statusLines(doc)
        (at,) = [n for n, x in enumerate(lines) if x.startswith("attest:")]
        self.assertEqual(
            lines[at : at + 2],
            [
                "attest:   refused 1970-01-01T00:00:10Z: tpm12-unsupported (it has a"
                " TPM 1.2, which cannot attest; named by the serial it reported)",
                "  step back: none through fleetd: a TPM 1.2 cannot attest",
            ],
        )


class AttestThenClearTests(SynchronousTestCase):
    """The real service: a refusal, then a successful attestation clears it."""

    def test_refusedThenAttested_cleared(self) -> None:
        server, _, _, node = serverAndNode(self)
        known = IdentityIndex()
        w1 = self.successResultOf(server.inventory.get("w1"))
        assert w1 is not None
        known["w1"] = (w1.uuid, w1.serial)
        server.service.refusals = RefusalRecorder(
            server.clock, server.journal, server.service.results, known
        )
        refusals = AttestRefusals(server.runner, server.journal)
        begin = Deferred.fromCoroutine(server.service.begin(node.claim()))
        self.failureResultOf(begin, Refused)
        standing = self.successResultOf(Deferred.fromCoroutine(refusals.standing([w1])))
        self.assertEqual(standing["w1"]["reason"], E.NOT_APPROVED)
        self.assertIn("fleetctl evidence add --serial SER1", standing["w1"]["step"])
        server.bindings.approved[ekDigest(spkiOf(node.ekPublic))] = "SER1"
        challenge = self.successResultOf(
            Deferred.fromCoroutine(server.service.begin(node.claim()))
        )
        self.successResultOf(
            Deferred.fromCoroutine(server.service.prove(node.proof(challenge)))
        )
        standing = self.successResultOf(Deferred.fromCoroutine(refusals.standing([w1])))
        self.assertEqual(standing, {})


UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"


class DaemonTests(ConsoleMixin, TestCase):
    """A cloned or unscanned TPM against the daemon, seen where the owner looks."""

    timeout = 120

    def post(self, path: str, body: dict[str, Any]) -> Any:
        context = tlsContext(str(self.pki.public_ca))
        port = self.port(self.service, "device")
        try:
            return 200, call(f"https://localhost:{port}", path, context, body)
        except Refusal as e:
            return e.status, e.line

    async def fleetctl(self, *argv: str) -> tuple[int, str, str]:
        config = ownerConfig(self.directory, self.port(self.service, "admin"))
        return await fleetctlAgainst(config, *argv)

    async def test_unscannedTPM_shownEverywhere_clearedByAttestation(self) -> None:
        """
        w1 provisioned (planned); its node attests with an EK no evidence
        names: fleetctl journal --device w1 finds the refusal; fleetctl
        status, the device page and the fleet view show why, when, and
        the step back (record evidence); with the evidence recorded, to
        approve the binding; after approval the node attests and all of
        it is gone.
        """
        await self.startConsole()
        await self.addDevice("w1", "SN-1", UUID)
        await self.provision("w1")
        caCert = x509.load_pem_x509_certificate(self.pki.ek_ca.read_bytes())
        caKey = serialization.load_pem_private_key(
            self.pki.ek_ca_key.read_bytes(), None
        )
        node = SoftNode(caCert, caKey, serial="SN-1")
        digest = ekDigest(spkiOf(node.ekPublic))
        status, line = await deferToThread(
            self.post, "/v1/attest/challenge", node.claim(uuid=UUID)
        )
        self.assertEqual(status, 403)
        self.assertTrue(line.startswith("ek-binding-not-approved: "), line)
        code, out, err = await self.fleetctl("--json", "journal", "--device", "w1")
        self.assertEqual(code, 0, err)
        (refused,) = [e for e in json.loads(out) if e["event"] == "attest.refused"]
        self.assertEqual(refused["fields"]["named_by"], "reported-serial")
        code, out, err = await self.fleetctl("status", "w1")
        self.assertEqual(code, 0, err)
        printed = out.splitlines()
        self.assertEqual(printed[0].split()[:2], ["w1", "planned"])
        self.assertNotIn("recovery: nothing to do", printed)
        (attest,) = [x for x in printed if x.startswith("attest:")]
        self.assertIn(": ek-binding-not-approved (its TPM's EK has no approved", attest)
        (recovery,) = [x for x in printed if x.startswith("recovery:")]
        self.assertIn(
            "fleetctl evidence add --serial SN-1 --ek-sha256 DIGEST", recovery
        )
        _, _, page = await self.page("GET", "/devices/w1")
        rows = statusRowsOf(page)
        shown = [line for row in rows for line in row.lines()]
        self.assertEqual(printed[1 : printed.index("journal:")], shown)
        _, _, fleet = await self.page("GET", "/")
        seen = " ".join(text(fleet).split())
        self.assertIn("FleetAttestationRefused : its attestation was refused at", seen)
        self.assertIn("step back: fleetctl evidence add --serial SN-1", seen)
        # The evidence recorded: the step is the approval now.
        code, _, err = await self.fleetctl(
            "evidence", "add", "--serial", "SN-1", "--ek-sha256", digest,
            "--kind", "receiving-scan",
        )  # fmt: skip
        self.assertEqual(code, 0, err)
        _, out, _ = await self.fleetctl("status", "w1")
        self.assertIn(
            "recovery: fleetctl binding approve SN-1, then run its workflow again",
            out.splitlines(),
        )
        code, _, err = await self.fleetctl("binding", "approve", "SN-1")
        self.assertEqual(code, 0, err)
        status, challenge = await deferToThread(
            self.post, "/v1/attest/challenge", node.claim()
        )
        self.assertEqual(status, 200, challenge)
        status, issued = await deferToThread(
            self.post, "/v1/attest/proof", node.proof(challenge)
        )
        self.assertEqual(status, 200, issued)
        _, out, _ = await self.fleetctl("status", "w1")
        self.assertNotIn("attest:", out)
        self.assertIn("recovery: nothing to do", out.splitlines())
        _, _, fleet = await self.page("GET", "/")
        self.assertNotIn("FleetAttestationRefused", fleet)
        self.assertIsNone(re.search("its attestation was refused", fleet))
