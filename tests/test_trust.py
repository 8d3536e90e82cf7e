"""
Evidence and EK bindings [T1]: the rules, the contract attestation uses,
and [J1] with a failing journal or database.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.store.db import StoreError
from fleetd.trust import bindings
from fleetd.trust.bindings import approvedSerialFor, bindingRefusal
from fleetd.trust.model import EvidenceKind, TrustError, ekDigest, evidence
from fleetd.trust.service import TrustService
from tests.faultsupport import FAULTS, Faults
from tests.fleetsupport import Fleet, device

EK1 = hashlib.sha256(b"ek-one").hexdigest()
EK2 = hashlib.sha256(b"ek-two").hexdigest()
WEAK = ("reported-serial", "pending-claim", "console")


class TrustFleet:
    """A fleet (inline database, real journal) with a trust service."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.test = test
        self.fleet = Fleet(test)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"))
        self.service = TrustService(
            self.fleet.runner,
            self.fleet.journal,
            self.fleet.inventory,
            self.fleet.clock,
        )

    def run(self, coroutine: Any) -> Any:
        return self.test.successResultOf(Deferred.fromCoroutine(coroutine))

    def fails(self, coroutine: Any, *errors: type[Exception]) -> Any:
        return self.test.failureResultOf(
            Deferred.fromCoroutine(coroutine), *errors
        ).value

    def add(self, serial: str, ek: str, kind: str, ref: str | None = None) -> Any:
        claim = evidence(serial=serial, ek_sha256=ek, kind=kind, ref=ref)
        return self.run(self.service.record([claim], actor="owner:jane", via="add"))

    def approve(self, serial: str, ek: str | None = None) -> Any:
        return self.run(self.service.approve(serial, actor="owner:jane", ek=ek))

    def refused(self, serial: str, ek: str | None = None) -> TrustError:
        error = self.fails(
            self.service.approve(serial, actor="owner:jane", ek=ek), TrustError
        )
        assert isinstance(error, TrustError)
        self.test.assertEqual(error.kind, "refused")
        return error

    def entries(self) -> list[tuple[str, str | None, dict[str, Any]]]:
        found = self.test.successResultOf(self.fleet.journal.query())
        return [(e.event, e.device, dict(e.fields)) for e in found]

    def events(self) -> list[str]:
        return [event for event, _, _ in self.entries()]

    def serialFor(self, ek: str) -> str | None:
        with self.fleet.db.transaction(write=False) as conn:
            return approvedSerialFor(conn, ek)

    def refusalFor(self, ek: str) -> str:
        with self.fleet.db.transaction(write=False) as conn:
            return bindingRefusal(conn, ek)


class DigestTests(SynchronousTestCase):
    def test_digest_normalisedLowercase(self) -> None:
        """[T1] An EK digest in capitals is accepted and stored lowercase."""
        claim = evidence(serial="S", ek_sha256=EK1.upper(), kind="receiving-scan")
        self.assertEqual(claim.ek_sha256, EK1)

    def test_digest_malformedRefused(self) -> None:
        """[T1] Anything but 64 hex digits (or the digest of nothing) is refused."""
        empty = hashlib.sha256(b"").hexdigest()
        for bad in ["", EK1[:63], EK1 + "0", "g" * 64, f"sha256:{EK1}", empty, 7]:
            with self.assertRaises(TrustError, msg=repr(bad)) as raised:
                evidence(serial="S", ek_sha256=bad, kind="console")
            self.assertIn("ek_sha256", str(raised.exception))

    def test_ekDigest_ofSubjectPublicKeyInfo(self) -> None:
        """The EK digest is the SHA-256 of the key's DER SubjectPublicKeyInfo."""
        key = ec.generate_private_key(ec.SECP384R1()).public_key()
        der = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        self.assertEqual(ekDigest(der), hashlib.sha256(der).hexdigest())

    def test_kind_andRef_checked(self) -> None:
        """Unknown kinds and unprintable refs are refused, naming the field."""
        with self.assertRaises(TrustError) as raised:
            evidence(serial="S", ek_sha256=EK1, kind="hearsay")
        self.assertIn("kind:", str(raised.exception))
        with self.assertRaises(TrustError):
            evidence(serial="S", ek_sha256=EK1, kind="console", ref="a\nb")
        with self.assertRaises(TrustError):
            evidence(serial="has space", ek_sha256=EK1, kind="console")


class ApprovalTests(SynchronousTestCase):
    """[T1] Which evidence approves a binding, and what the refusals say."""

    def setUp(self) -> None:
        self.t = TrustFleet(self)

    def test_receivingScan_approves(self) -> None:
        """[T1] A receiving-scan naming the serial and the EK approves it."""
        self.t.add("SER1", EK1, "receiving-scan", "dock-7")
        approval = self.t.approve("ser1")  # serials compare case-insensitively
        self.assertTrue(approval.changed)
        self.assertEqual(
            (approval.binding.serial, approval.binding.device), ("SER1", "w1")
        )
        self.assertEqual(self.t.serialFor(EK1), "SER1")
        self.assertEqual(self.t.serialFor(EK1.upper()), "SER1")
        event, dev, fields = self.t.entries()[-1]
        self.assertEqual((event, dev), ("binding.approved", "w1"))
        self.assertEqual(fields["ek_sha256"], EK1)

    def test_supplierRecord_approves(self) -> None:
        """[T1] A supplier-record approves too."""
        self.t.add("SER1", EK1, "supplier-record")
        self.t.approve("SER1")
        self.assertEqual(self.t.serialFor(EK1), "SER1")

    def test_weakKinds_neverApprove(self) -> None:
        """
        [T1] reported-serial, pending-claim and console evidence is recorded
        but never approves; the refusal says why, and is journaled.
        """
        for kind in WEAK:
            self.t.add("SER1", EK1, kind)
        error = self.t.refused("SER1")
        self.assertEqual(error.code, "evidence-insufficient")
        for kind in WEAK:
            self.assertIn(kind, str(error))
        self.assertIn("can never approve", str(error))
        self.assertIn("receiving-scan or supplier-record", str(error))
        self.assertIsNone(self.t.serialFor(EK1))
        event, dev, fields = self.t.entries()[-1]
        self.assertEqual((event, dev, fields["reason"]), ("binding.refused", "w1",
                         "evidence-insufficient"))  # fmt: skip
        refusal = self.t.refusalFor(EK1)
        self.assertTrue(refusal.startswith("ek-binding-not-approved: "), refusal)
        self.assertIn("can never approve", refusal)

    def test_noEvidence_refusedNamingWhatIsMissing(self) -> None:
        """[T1] No evidence at all: evidence-missing, naming the serial."""
        error = self.t.refused("SER1")
        self.assertEqual(error.code, "evidence-missing")
        self.assertIn("serial SER1", str(error))
        self.assertEqual(self.t.events()[-1], "binding.refused")
        self.assertIn("no evidence names EK", self.t.refusalFor(EK1))

    def test_pinnedEK_mustBeNamed(self) -> None:
        """[T1] approve --ek-sha256 needs independent evidence for that EK."""
        self.t.add("SER1", EK1, "receiving-scan")
        error = self.t.refused("SER1", ek=EK2)
        self.assertEqual(error.code, "evidence-missing")
        self.assertIsNone(self.t.serialFor(EK2))

    def test_notInInventory_refused(self) -> None:
        """[T1] A serial no device has is refused (and journaled)."""
        self.t.add("SER9", EK1, "receiving-scan")
        error = self.t.refused("SER9")
        self.assertEqual(error.code, "serial-not-in-inventory")
        self.assertEqual(self.t.entries()[-1][0], "binding.refused")
        self.assertIsNone(self.t.serialFor(EK1))

    def test_approveTwice_unchangedNoEntry(self) -> None:
        """Approving an approved binding again changes and journals nothing."""
        self.t.add("SER1", EK1, "receiving-scan")
        self.t.approve("SER1")
        before = len(self.t.events())
        self.assertFalse(self.t.approve("SER1").changed)
        self.assertEqual(len(self.t.events()), before)

    def test_sameClaimTwice_recordedOnce(self) -> None:
        """The same claim again is left as it is: no row, no entry."""
        first = self.t.add("SER1", EK1, "receiving-scan", "r")
        again = self.t.add("ser1", EK1, "receiving-scan", "r")
        self.assertEqual(again.recorded, [])
        self.assertEqual(again.unchanged[0].id, first.recorded[0].id)
        self.assertEqual(self.t.events(), ["evidence.recorded"])

    def test_evidence_journaledWithDevice(self) -> None:
        """[J1] Evidence is journaled with the device its serial belongs to."""
        self.t.add("ser2", EK2, "console", "seen on the console")
        event, dev, fields = self.t.entries()[0]
        self.assertEqual((event, dev), ("evidence.recorded", "w2"))
        self.assertEqual(fields["kind"], "console")


class ConflictTests(SynchronousTestCase):
    """[T1] Conflicting evidence blocks approval and is journaled."""

    def setUp(self) -> None:
        self.t = TrustFleet(self)

    def test_oneEKTwoSerials_journaledAndBlocks(self) -> None:
        """[T1] One EK claimed by two serials: journaled when recorded; refused."""
        self.t.add("SER1", EK1, "receiving-scan")
        outcome = self.t.add("SER2", EK1, "supplier-record")
        self.assertEqual(len(outcome.conflicts), 1)
        self.assertEqual(
            self.t.events(),
            ["evidence.recorded", "evidence.recorded", "evidence.conflict"],
        )
        for serial in ("SER1", "SER2"):
            error = self.t.refused(serial)
            self.assertEqual(error.code, "conflicting-evidence")
            self.assertIn("withdraw", str(error))
        event, _, fields = self.t.entries()[-1]
        self.assertEqual((event, fields["reason"]), ("binding.refused",
                         "conflicting-evidence"))  # fmt: skip

    def test_twoEKsOneSerial_blocks(self) -> None:
        """[T1] Two EK digests for one serial block approval."""
        self.t.add("SER1", EK1, "receiving-scan")
        self.t.add("SER1", EK2, "supplier-record")
        self.assertIn("evidence.conflict", self.t.events())
        error = self.t.refused("SER1")
        self.assertEqual(error.code, "conflicting-evidence")
        self.assertIsNone(self.t.serialFor(EK1))

    def test_weakEvidence_alsoConflicts(self) -> None:
        """[T1] A console naming another serial for the EK blocks approval too."""
        self.t.add("SER1", EK1, "receiving-scan")
        self.t.add("SER2", EK1, "console")
        self.assertEqual(self.t.refused("SER1").code, "conflicting-evidence")

    def test_conflictAfterApproval_suspends_withdrawRestores(self) -> None:
        """
        [T1] Conflicting evidence recorded after approval suspends the
        binding (attestation gets the reason); withdrawing it restores it.
        """
        self.t.add("SER1", EK1, "receiving-scan")
        self.t.approve("SER1")
        clone = self.t.add("SER2", EK1, "reported-serial").recorded[0]
        self.assertIsNone(self.t.serialFor(EK1))
        refusal = self.t.refusalFor(EK1)
        self.assertIn("suspended", refusal)
        self.assertIn("SER2", refusal)
        self.t.run(
            self.t.service.withdraw(clone.id, actor="owner:jane", reason="clone")
        )
        self.assertEqual(self.t.serialFor(EK1), "SER1")
        self.assertEqual(self.t.events()[-1], "evidence.withdrawn")

    def test_withdrawnEvidence_suspendsBinding(self) -> None:
        """[T1] A binding whose independent evidence is withdrawn no longer holds."""
        scan = self.t.add("SER1", EK1, "receiving-scan").recorded[0]
        self.t.approve("SER1")
        self.t.run(self.t.service.withdraw(scan.id, actor="owner:jane", reason="typo"))
        self.assertIsNone(self.t.serialFor(EK1))
        self.assertIn("withdrawn", self.t.refusalFor(EK1))

    def test_newEK_afterWithdrawal_replacesBinding(self) -> None:
        """A replaced TPM: withdraw the old evidence, record and approve the new."""
        scan = self.t.add("SER1", EK1, "receiving-scan").recorded[0]
        self.t.approve("SER1")
        self.t.run(
            self.t.service.withdraw(scan.id, actor="owner:jane", reason="new board")
        )
        self.t.add("SER1", EK2, "receiving-scan")
        approval = self.t.approve("SER1")
        self.assertEqual(approval.replaced, [("SER1", EK1)])
        self.assertEqual((self.t.serialFor(EK2), self.t.serialFor(EK1)), ("SER1", None))
        self.assertIn("replaced", self.t.entries()[-1][2])

    def test_withdraw_refusals(self) -> None:
        """Withdrawing unknown or withdrawn evidence, or without a reason, refuses."""
        scan = self.t.add("SER1", EK1, "receiving-scan").recorded[0]
        svc = self.t.service
        error = self.t.fails(svc.withdraw(99, actor="owner:j", reason="x"), TrustError)
        self.assertEqual(error.kind, "not-found")
        self.t.fails(svc.withdraw(scan.id, actor="owner:j", reason=" "), TrustError)
        self.t.run(svc.withdraw(scan.id, actor="owner:j", reason="x"))
        self.t.fails(svc.withdraw(scan.id, actor="owner:j", reason="x"), TrustError)


class ContractTests(SynchronousTestCase):
    """The functions attestation calls inside its own transaction."""

    def test_insideAWriteTransaction(self) -> None:
        """approvedSerialFor and bindingRefusal work in the caller's transaction."""
        t = TrustFleet(self)
        t.add("SER1", EK1, "receiving-scan")
        t.approve("SER1")
        with t.fleet.db.transaction() as conn:
            self.assertEqual(approvedSerialFor(conn, EK1), "SER1")
            self.assertIsNone(approvedSerialFor(conn, "not a digest"))
            self.assertTrue(
                bindingRefusal(conn, EK2).startswith(bindings.REFUSAL_CODE + ": ")
            )
            self.assertIn("malformed", bindingRefusal(conn, "zz"))

    def test_approvedButUnsupported_refusalNamesOwnerStep(self) -> None:
        """Independent evidence without approval: the refusal names the command."""
        t = TrustFleet(self)
        t.add("SER1", EK1, "supplier-record")
        self.assertIn("fleetctl binding approve", t.refusalFor(EK1))


class TrustFaultTests(SynchronousTestCase):
    """[J1] With a failing journal or database, nothing changes."""

    def setUp(self) -> None:
        self.t = TrustFleet(self)
        self.faults = Faults(self.t.fleet)

    def state(self) -> tuple[Any, ...]:
        conn = self.t.fleet.db.connection
        return (
            conn.execute("SELECT * FROM evidence ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM ek_bindings").fetchall(),
            self.t.events(),
        )

    def check(self, change: Any) -> None:
        for kind in FAULTS:
            before = self.state()
            self.faults.inject(kind)
            error = self.t.fails(change(), StoreError, sqlite3.OperationalError)
            self.assertEqual(len(str(error).splitlines()), 1)
            self.faults.clear()
            self.assertEqual(self.state(), before, kind)

    def test_record_faults_nothingChanges(self) -> None:
        """[J1] Evidence that cannot be journaled is not recorded."""
        claims = [
            evidence(serial="SER1", ek_sha256=EK1, kind="receiving-scan"),
            evidence(serial="SER2", ek_sha256=EK1, kind="console"),
        ]
        self.check(lambda: self.t.service.record(claims, actor="owner:j", via="import"))

    def test_approve_faults_nothingChanges(self) -> None:
        """[J1] An approval that cannot be journaled is not stored."""
        self.t.add("SER1", EK1, "receiving-scan")
        self.check(lambda: self.t.service.approve("SER1", actor="owner:j"))
        self.assertIsNone(self.t.serialFor(EK1))

    def test_refusal_faults_stillRefusedNothingChanges(self) -> None:
        """[J1] A refusal whose entry cannot be journaled changes nothing."""
        self.t.add("SER1", EK1, "console")
        self.check(lambda: self.t.service.approve("SER1", actor="owner:j"))

    def test_withdraw_faults_nothingChanges(self) -> None:
        """[J1] A withdrawal that cannot be journaled leaves the evidence live."""
        scan = self.t.add("SER1", EK1, "receiving-scan").recorded[0]
        self.t.approve("SER1")
        self.check(
            lambda: self.t.service.withdraw(scan.id, actor="owner:j", reason="x")
        )
        self.assertEqual(self.t.serialFor(EK1), "SER1")

    def test_badEntry_refusedNothingChanges(self) -> None:
        """[J1] An actor the journal refuses stops the change itself."""
        from fleetd.store.entries import JournalRefused

        claim = evidence(serial="SER1", ek_sha256=EK1, kind=EvidenceKind.CONSOLE)
        before = self.state()
        self.t.fails(
            self.t.service.record([claim], actor="owner:Jane Doe", via="add"),
            JournalRefused,
        )
        self.assertEqual(self.state(), before)


class StatusTests(SynchronousTestCase):
    """fleetctl status shows the binding, the evidence behind it, the disks."""

    def test_report_showsBindingEvidenceAndDisks(self) -> None:
        """[T1] [D1] The status report carries the binding state and disk report."""
        from fleetd.fleet.status import StatusService
        from fleetd.nodes import NodeIdentity
        from fleetd.statuswords import diskLines, trustLines
        from fleetd.trust.disk_report import Disk
        from fleetd.trust.disks import DiskService

        t = TrustFleet(self)
        fleet = t.fleet
        disks = DiskService(fleet.runner, fleet.journal, fleet.clock)
        status = StatusService(
            fleet.inventory, fleet.registry, fleet.alerts, fleet.journal,
            trust=t.service, disks=disks,
        )  # fmt: skip
        t.add("SER1", EK1, "receiving-scan", "dock")
        t.add("SER1", EK1, "console")
        t.approve("SER1")
        t.run(
            disks.report(NodeIdentity("w1", "SER1"), [Disk("sda", "D1", None, 10**12)])
        )
        report = t.run(status.report("w1"))
        doc = json.loads(json.dumps(report.toJSON()))
        self.assertEqual(doc["trust"]["binding"]["state"], "approved")
        self.assertEqual(len(doc["trust"]["evidence"]), 2)
        self.assertEqual(doc["disks"]["target"], "D1")
        lines = trustLines(doc["trust"]) + diskLines(doc["disks"])
        self.assertEqual(lines[0][:28], "binding:  approved: EK " + EK1[:5])
        self.assertIn("(cannot approve)", lines[-2])
        self.assertEqual(lines[-1], "disks:    1 reported; ok, target disk serial D1")
        other = t.run(status.report("w2"))
        self.assertIsNone(other.trust.binding)
        self.assertIsNone(other.disks)
