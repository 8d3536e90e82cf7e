"""
One node cannot take away another's target disk (issue 17, item 10) [D1].

The node that reported a disk serial first keeps its clean target (and so
its META code); a later reporter of that serial is refused until the
owner decides (C{fleetctl disks forget}). The line a node gets never names
another device; the journal does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography import x509
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.attest.identity import Peer
from fleetd.attest.tpm import ekDigest, spkiOf
from fleetd.device.disks import NodeDisksResource
from fleetd.device.resource import deviceRoot
from fleetd.nodes import NodeIdentity
from fleetd.store.db import Database
from fleetd.store.migrations import MIGRATIONS
from fleetd.trust import disks
from fleetd.trust.disks import DiskService
from fleetd.web.resources import Router
from tests.attestserver import HoldsTestCase
from tests.disksupport import W1, W2, DiskFleet, d
from tests.softtpm import SoftNode

W3 = NodeIdentity("w3", "SER3")


class FirstReporterTests(SynchronousTestCase):
    """[D1] The first reporter of a serial keeps it; later ones are refused."""

    def setUp(self) -> None:
        self.f = DiskFleet(self)

    def forget(self, device: str) -> None:
        coroutine = self.f.service.forget(device, actor="owner:jane", reason="moved")
        self.successResultOf(Deferred.fromCoroutine(coroutine))

    def test_laterReporter_refused_firstKeepsTarget(self) -> None:
        """
        [D1] w2 reporting w1's target serial (any case) is refused
        duplicate-disk-serial; w1 keeps its target, also when it reports
        again. Neither w2's line nor its stored reason names w1; the journal
        entry of the refusal does.
        """
        self.f.report(W1, d("sda", "CLONE"))
        verdict = self.f.report(W2, d("sda", "clone"), d("sdb", "OWN2"))
        self.assertEqual(verdict.code, "duplicate-disk-serial")
        self.assertNotIn("w1", verdict.line)
        self.assertIn("disks forget", verdict.line)
        self.assertEqual(self.f.target("w1"), "CLONE")
        self.assertIsNone(self.f.target("w2"))
        refusal = self.f.refusal("w2")
        self.assertTrue(refusal.startswith("duplicate-disk-serial: "), refusal)
        self.assertNotIn("w1", refusal)
        event, device, fields = self.f.entries()[-1]
        self.assertEqual((event, device), ("disks.refused", "w2"))
        self.assertEqual(fields["first_reported_by"], "w1")
        self.assertIn("w1", str(fields["detail"]))
        # The first reporter reports again: still clean, still its target.
        self.assertIsNone(self.f.report(W1, d("sda", "CLONE")).code)
        self.assertEqual(self.f.target("w1"), "CLONE")
        self.assertEqual(
            self.f.report(W2, d("sda", "CLONE")).code, "duplicate-disk-serial"
        )

    def test_ownerForgets_laterReporterGetsIt(self) -> None:
        """
        [D1] After the owner forgets the first reporter's report (its disk
        moved), the later reporter's next report is clean; the earlier
        holder reporting the serial again is then the later one.
        """
        self.f.report(W1, d("sda", "MOVED"))
        self.f.report(W2, d("sda", "MOVED"))
        self.f.report(W3, d("sda", "MOVED"))
        self.forget("w1")
        self.assertIsNone(self.f.report(W2, d("sda", "MOVED")).code)
        self.assertEqual(self.f.target("w2"), "MOVED")
        # w3 reported after w2: still refused; so is w1 coming back.
        self.assertIsNotNone(self.f.report(W3, d("sda", "MOVED")).code)
        self.assertIsNotNone(self.f.report(W1, d("sda", "MOVED")).code)
        self.assertEqual(self.f.target("w2"), "MOVED")

    def test_droppedSerial_claimedAnew(self) -> None:
        """
        [D1] A device whose report no longer holds a serial gives up its
        claim: reporting it again later comes after the others'.
        """
        self.f.report(W1, d("sda", "S"))
        self.f.report(W2, d("sda", "S"))
        self.f.report(W1, d("sdb", "OTHER"))
        self.assertIsNotNone(self.f.report(W1, d("sdb", "OTHER"), d("sda", "S")).code)
        self.assertIsNone(self.f.report(W2, d("sda", "S")).code)

    def test_http_409LineNamesNoOtherDevice(self) -> None:
        """[D1] The 409 line the later reporter gets names no other device."""
        self.f.report(W1, d("sda", "CLONE"))
        resource = NodeDisksResource(self.f.service, lambda request: W2)
        node, v1 = Router(), Router()
        node.putChild(b"disks", resource)
        v1.putChild(b"node", node)
        stub: Any = StubTreq(deviceRoot(v1))
        data = json.dumps({"disks": [d("sda", "CLONE").toJSON()]})
        response = stub.post("https://device.test/v1/node/disks", data=data)
        stub.flush()
        answer = self.successResultOf(response)
        body = self.successResultOf(answer.content())
        self.assertEqual(answer.code, 409)
        self.assertTrue(body.startswith(b"duplicate-disk-serial: "), body)
        self.assertNotIn(b"w1", body)


class MigrationTests(SynchronousTestCase):
    """[D1] Reports stored before claims were ordered keep their order."""

    def test_existingReports_orderedByReportTime(self) -> None:
        """
        A database whose reports predate claim order: the device that
        reported a shared serial earlier is its first reporter, and a stored
        refusal line stops naming the other device.
        """
        path = Path(self.mktemp())
        path.mkdir()
        before = tuple(m for m in MIGRATIONS if m[0] <= 11)
        db = Database.open(path / "state.sqlite3", before)
        legacy = "duplicate-disk-serial: serial S of sda is also reported by w1"
        for device, at, verdict in (("w2", 20.0, legacy), ("w1", 10.0, "ok")):
            db.connection.execute(
                "INSERT INTO disk_reports VALUES (?, ?, ?, ?, 'S', '[]')",
                (device, device.upper(), at, verdict),
            )
            db.connection.execute(
                "INSERT INTO disk_serials (serial, device, name) VALUES (?, ?, ?)",
                ("S", device, "sda"),
            )
        db.close()
        db = Database.open(path / "state.sqlite3")
        self.addCleanup(db.close)
        with db.transaction(write=False) as conn:
            self.assertEqual(disks.targetDiskFor(conn, "w1"), "S")
            self.assertIsNone(disks.targetDiskFor(conn, "w2"))
            refusal = disks.diskRefusal(conn, "w2")
        self.assertTrue(refusal.startswith("duplicate-disk-serial: "), refusal)
        self.assertNotIn("w1", refusal)


class PlanTests(HoldsTestCase):
    """[D1] The META code stays with the first reporter's plan."""

    def setUp(self) -> None:
        super().setUp()
        self.server.lookups._targetDiskFor = disks.targetDiskFor
        self.server.lookups._diskRefusal = disks.diskRefusal
        self.other = SoftNode(self.caCert, self.caKey, serial="SER2")
        self.server.bindings.approved[ekDigest(spkiOf(self.other.ekPublic))] = "SER2"
        self.service = DiskService(
            self.server.runner, self.server.journal, self.server.clock
        )
        for name in ("w1", "w2"):
            run = f"r-{name}0123456789abc"
            self.server.runs.ready[name] = run
            self.server.vault.put(f"{run}.code", f"CODE-{name}".encode())
            self.server.vault.put(f"{run}.yaml", b"machine: {}\n")

    def peer(self, node: SoftNode) -> Peer:
        challenge = self.successResultOf(self.begin(node.claim()))
        issued = self.successResultOf(self.prove(node.proof(challenge)))
        cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
        return self.server.identify.checkCertificate(cert)

    def plan(self, peer: Peer) -> dict[str, Any]:
        plan: dict[str, Any] = self.successResultOf(
            Deferred.fromCoroutine(self.server.lookups.plan(peer))
        )
        return plan

    def report(self, who: NodeIdentity, serial: str) -> None:
        coroutine = self.service.report(who, [d("sda", serial)])
        self.successResultOf(Deferred.fromCoroutine(coroutine))

    def test_laterReporter_cannotWithholdFirstsCode(self) -> None:
        """
        [D1] w2 reporting w1's target serial does not withhold w1's META
        code; w2's own plan withholds its code with a line naming no other
        device.
        """
        w1, w2 = self.peer(self.node), self.peer(self.other)
        self.report(W1, "DISK-1")
        self.report(W2, "DISK-1")
        mine = self.plan(w1)
        self.assertEqual(mine["meta_0x0b"], "CODE-w1")
        self.assertEqual(mine["target_disk_serial"], "DISK-1")
        theirs = self.plan(w2)
        self.assertIsNone(theirs["meta_0x0b"])
        withheld = theirs["meta_0x0b_withheld"]
        self.assertTrue(withheld.startswith("duplicate-disk-serial: "), withheld)
        self.assertNotIn("w1", withheld)
