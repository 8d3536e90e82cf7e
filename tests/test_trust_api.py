"""
Machine trust over the admin API and fleetctl [T1] [O3] [J1].

L{TrustAPITests} drive the resources behind the real owner gate in
memory; L{TrustCommandTests} run fleetctl against a running daemon.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.devices import devicesResource
from fleetd.admin.resource import adminRoot
from fleetd.admin.trust import BindingsResource, EvidenceResource
from fleetd.inventory import SQLiteInventory
from fleetd.store import AsyncJournal, Database, InlineRunner, StoreError
from fleetd.trust.service import TrustService
from fleetd.web.site import BoundedSite
from tests.daemonsupport import DaemonTestMixin
from tests.faultsupport import FaultyJournal
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.inventorysupport import SITE, UUID1, UUID2
from tests.ownersupport import OwnerSiteMixin, PKIMixin, inline, issue

EK1 = hashlib.sha256(b"ek-one").hexdigest()
EK2 = hashlib.sha256(b"ek-two").hexdigest()
DEVICE = {"name": "w1", "serial": "SER1", "uuid": UUID1, "class": "worker-g3"}


class TrustAPITests(OwnerSiteMixin, PKIMixin, SynchronousTestCase):
    """/v1/admin/evidence and /v1/admin/bindings behind the owner gate."""

    def setUp(self) -> None:
        self.makePKI()
        db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(db.close)
        self.db = db
        runner = InlineRunner(db)
        self.clock = Clock()
        self.chain = FaultyJournal(b"k" * 32)
        self.journal = AsyncJournal(runner, self.chain, self.clock)
        inventory = SQLiteInventory(runner, self.journal)
        trust = TrustService(runner, self.journal, inventory, self.clock)
        root = adminRoot(
            clock=self.clock,
            registry=CollectorRegistry(),
            journal=self.journal,
            site="test",
            version="0",
            api={
                b"devices": devicesResource(
                    inventory, self.journal, offload=inline, defined=SITE
                ),
                b"evidence": EvidenceResource(trust, inline),
                b"bindings": BindingsResource(trust),
            },
        )
        self.site = BoundedSite(
            root, maxHeaderBytes=8192, maxHeaders=32, maxBodyBytes=1 << 20,
            idleTimeout=30, clock=self.clock,
        )  # fmt: skip
        self.owner, _, _ = issue(self.pki, "jane")
        status, _ = self.post("/v1/admin/devices", DEVICE)
        self.assertEqual(status, 201)

    def post(self, path: str, doc: Any) -> tuple[int, Any]:
        status, body = self.send("POST", path, json.dumps(doc).encode())
        return status, _decode(body)

    def get(self, path: str) -> tuple[int, Any]:
        status, body = self.send("GET", path, contentType=None)
        return status, _decode(body)

    def events(self) -> list[str]:
        return [e.event for e in self.successResultOf(self.journal.query())]

    def evidenceRows(self) -> int:
        (count,) = self.db.execute("SELECT count(*) FROM evidence").fetchone()
        return int(count)

    def test_addEvidence_201ThenRepeat200(self) -> None:
        """[T1] POST records evidence (201, journaled as the owner); a repeat is 200."""
        claim = {"serial": "ser1", "ek_sha256": EK1.upper(), "kind": "receiving-scan"}
        status, doc = self.post("/v1/admin/evidence", claim)
        self.assertEqual(status, 201)
        self.assertEqual(doc["recorded"][0]["ek_sha256"], EK1)
        self.assertEqual(doc["recorded"][0]["recorded_by"], "owner:jane")
        status, doc = self.post("/v1/admin/evidence", claim)
        self.assertEqual((status, doc["recorded"]), (200, []))
        self.assertEqual(self.events(), ["device.added", "evidence.recorded"])

    def test_addEvidence_badBodies_400OneLine(self) -> None:
        """Bad digests, kinds, unknown or missing keys: one 400 line, nothing stored."""
        good = {"serial": "SER1", "ek_sha256": EK1, "kind": "console"}
        for doc, words in [
            ({**good, "ek_sha256": "abc"}, "ek_sha256"),
            ({**good, "kind": "rumour"}, "kind"),
            ({**good, "extra": 1}, "unknown key"),
            ({"serial": "SER1", "ek_sha256": EK1}, "kind: missing"),
            ({**good, "serial": 5}, "serial"),
        ]:
            status, line = self.post("/v1/admin/evidence", doc)
            self.assertEqual(status, 400, doc)
            self.assertIn(words, line)
            self.assertNotIn("\n", line)
        self.assertEqual(self.evidenceRows(), 0)

    def test_import_csvAndJSON(self) -> None:
        """[T1] [O3] The import takes a CSV or a JSON manifest; kind and ref default."""
        csv = f"serial,ek_sha256\nSER1,{EK1}\nSER2,{EK2}\n"
        status, body = self.send(
            "POST", "/v1/admin/evidence/import?ref=po-1", csv.encode(), "text/csv"
        )
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["recorded"], 2)
        manifest = json.dumps([{"serial": "SER3", "ek_sha256": EK1, "ref": "x"}])
        status, body = self.send(
            "POST",
            "/v1/admin/evidence/import?kind=console",
            manifest.encode(),
            "application/json",
        )
        self.assertEqual(status, 200, body)
        result = json.loads(body)
        self.assertEqual(result["recorded"], 1)
        self.assertEqual(len(result["conflicts"]), 1)  # EK1 for SER1 and SER3
        _, listed = self.get("/v1/admin/evidence")
        kinds = [(e["serial"], e["kind"], e["ref"]) for e in listed["evidence"]]
        self.assertEqual(
            kinds,
            [
                ("SER1", "supplier-record", "po-1"),
                ("SER2", "supplier-record", "po-1"),
                ("SER3", "console", "x"),
            ],
        )
        self.assertIn("evidence.conflict", self.events())

    def test_import_badLine_wholeFileRefused(self) -> None:
        """[T1] One bad row rejects the whole manifest, naming its line."""
        csv = f"serial,ek_sha256\nSER1,{EK1}\n\nSER2,nothex\n"
        status, body = self.send(
            "POST", "/v1/admin/evidence/import", csv.encode(), "text/csv"
        )
        self.assertEqual(status, 400)
        self.assertTrue(body.startswith(b"line 4: ek_sha256:"), body)
        self.assertEqual(self.evidenceRows(), 0)
        status, _ = self.send(
            "POST", "/v1/admin/evidence/import", csv.encode(), "text/plain"
        )
        self.assertEqual(status, 415)

    def test_approve_refusedThenApproved(self) -> None:
        """[T1] A refusal is a 409 line with its code; approval 201, then 200."""
        self.post(
            "/v1/admin/evidence",
            {"serial": "SER1", "ek_sha256": EK1, "kind": "reported-serial"},
        )
        status, line = self.post("/v1/admin/bindings/approve", {"serial": "SER1"})
        self.assertEqual(status, 409)
        self.assertTrue(line.startswith("evidence-insufficient: "), line)
        self.assertIn("can never approve", line)
        self.post(
            "/v1/admin/evidence",
            {"serial": "SER1", "ek_sha256": EK1, "kind": "supplier-record"},
        )
        status, doc = self.post("/v1/admin/bindings/approve", {"serial": "SER1"})
        self.assertEqual((status, doc["device"], doc["state"]), (201, "w1", "approved"))
        status, doc = self.post("/v1/admin/bindings/approve", {"serial": "SER1"})
        self.assertEqual((status, doc["changed"]), (200, False))
        _, listed = self.get("/v1/admin/bindings")
        self.assertEqual([b["serial"] for b in listed["bindings"]], ["SER1"])

    def test_withdraw(self) -> None:
        """Withdrawal: 200 with the record marked; unknown ids 404."""
        _, doc = self.post(
            "/v1/admin/evidence",
            {"serial": "SER1", "ek_sha256": EK1, "kind": "console"},
        )
        id_ = doc["recorded"][0]["id"]
        status, doc = self.post(
            f"/v1/admin/evidence/{id_}/withdraw", {"reason": "typo"}
        )
        self.assertEqual((status, doc["withdrawn"]["reason"]), (200, "typo"))
        status, _ = self.post("/v1/admin/evidence/999/withdraw", {"reason": "x"})
        self.assertEqual(status, 404)
        _, listed = self.get("/v1/admin/evidence?serial=ser1")
        self.assertEqual(len(listed["evidence"]), 1)
        _, listed = self.get("/v1/admin/evidence?serial=SER2")
        self.assertEqual(listed["evidence"], [])

    def test_journalFails_503NothingChanged(self) -> None:
        """[J1] The journal refuses: one 503 line for the owner; nothing stored."""
        self.chain.failing = StoreError("journal head is not authentic")
        status, line = self.post(
            "/v1/admin/evidence",
            {"serial": "SER1", "ek_sha256": EK1, "kind": "receiving-scan"},
        )
        self.assertEqual(status, 503)
        self.assertTrue(line.endswith("nothing changed"), line)
        status, line = self.post("/v1/admin/bindings/approve", {"serial": "SER1"})
        self.assertEqual(status, 503)
        self.chain.failing = None
        self.assertEqual(self.evidenceRows(), 0)
        self.assertEqual(self.events(), ["device.added"])


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        text = body.decode()
        assert text.count("\n") == 1, text
        return text.rstrip("\n")


class TrustCommandTests(DaemonTestMixin, TestCase):
    """fleetctl evidence / binding / status against a running daemon [T1]."""

    def setUp(self) -> None:
        self.makeSettings()

    async def fleetctl(self, *words: str) -> tuple[int, str, str]:
        return await fleetctlAgainst(self.config, *words)

    async def test_evidenceBindingStatus_overTLS(self) -> None:
        """
        [T1] fleetctl records evidence, imports CSV and JSON manifests,
        refuses and approves bindings, and status shows the binding, its
        evidence and a conflict that suspends it.
        """
        service = self.startDaemon()
        port = self.port(service, "admin")
        self.config = str(ownerConfig(self.directory, port))
        for name, serial, uuid in (("w1", "SER1", UUID1), ("w2", "SER2", UUID2)):
            await self.fleetctl(
                *f"device add {name} --serial {serial} --uuid {uuid}".split(),
                *"--class worker-g3".split(),
            )
        code, out, err = await self.fleetctl(
            *f"evidence add --serial SER1 --ek-sha256 {EK1} --kind console".split()
        )
        self.assertEqual(code, 0, err)
        self.assertIn("can never approve", out)
        code, out, err = await self.fleetctl("binding", "approve", "SER1")
        self.assertEqual(code, 1)
        self.assertEqual(err.count("\n"), 1)
        self.assertIn("409: evidence-insufficient:", err)

        manifest = Path(self.directory / "supplier.csv")
        manifest.write_text(f"serial,ek_sha256\nSER1,{EK1}\nSER2,{'x' * 64}\n")
        code, out, err = await self.fleetctl("evidence", "import", str(manifest))
        self.assertEqual(code, 1)
        self.assertIn("line 3: ek_sha256", err)
        manifest.write_text(f"serial,ek_sha256\nSER1,{EK1}\nSER2,{EK2}\n")
        code, out, err = await self.fleetctl(
            "--json", "evidence", "import", str(manifest)
        )
        self.assertEqual((code, json.loads(out)["recorded"]), (0, 2), err)
        code, out, err = await self.fleetctl("binding", "approve", "ser1")
        self.assertEqual(code, 0, err)
        self.assertIn("approved: serial SER1 (device w1)", out)
        code, out, _ = await self.fleetctl("binding", "list")
        self.assertIn("approved", out.splitlines()[1])
        code, out, _ = await self.fleetctl("evidence", "list", "--serial", "SER1")
        self.assertEqual(len(out.splitlines()), 3)  # header, console, supplier
        self.assertIn("supplier.csv", out)
        code, out, err = await self.fleetctl("status", "w1")
        self.assertEqual(code, 0, err)
        self.assertIn(f"binding:  approved: EK {EK1}", out)
        self.assertIn("(cannot approve)", out)
        self.assertIn("disks:    not reported", out)

        jsonManifest = Path(self.directory / "supplier.json")
        jsonManifest.write_text(json.dumps([{"serial": "SER2", "ek_sha256": EK1}]))
        code, out, err = await self.fleetctl("evidence", "import", str(jsonManifest))
        self.assertEqual(code, 0, err)
        self.assertIn("CONFLICT", out)
        code, out, _ = await self.fleetctl("--json", "status", "w1")
        self.assertEqual(json.loads(out)["trust"]["binding"]["state"], "suspended")
        code, out, err = await self.fleetctl("disks", "forget", "w1", "--reason", "x")
        self.assertEqual((code, err), (1, "fleetctl: fleetd answered 404: no disk"
                         " report from w1\n"))  # fmt: skip
