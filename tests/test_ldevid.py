"""
LDevID trust over the device listener [T4] [T2] [J1]: legacy (capsule,
forge) LDevIDs accepted until their node attests through spore (its
cut-over: a legacy software key is never renewed, attest-required), then
refused; renewal of attested LDevIDs from the one issuer; unknown
and expired certificates refused at the TLS layer; lookups of a node's own
record and install plan, never another's. Driven by fleetd-agent over
real TLS, with software LDevID keys (what legacy nodes hold).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.agent import main as agent
from fleetd.pki.dev import ensureDevPKI
from fleetd.store.entries import JournalRefused
from tests.attestserver import AttestServer
from tests.metasupport import loopDevice, makeImage, runAgent
from tests.swtpmsupport import issueWith

PKI: Any = None


def sharedPKI(base: Path) -> Any:
    global PKI
    if PKI is None:
        PKI = ensureDevPKI(base.resolve() / "pki", "localhost")
    return PKI


class LDevIDTestCase(TestCase):
    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        self.pki = sharedPKI(Path(self.mktemp()))
        self.server = AttestServer(Path(self.mktemp()), self.pki)
        self.server.addDevice("w1", "SER1")
        self.server.addDevice("w2", "SER2")

        async def start() -> None:
            self.url = await self.server.listen()

        self.addCleanup(lambda: ensureDeferred(self.server.stop()))
        return ensureDeferred(start())

    def node(self, name: str, certPEM: bytes, keyPEM: bytes) -> Path:
        state = Path(self.mktemp())
        state.mkdir()
        (state / "ldevid.pem").write_bytes(certPEM)
        (state / "ldevid.key").write_bytes(keyPEM)
        return state

    def legacy(
        self, name: str = "w1", serial: str = "SER1", ca: str = "capsule"
    ) -> Path:
        pair = issueWith(
            getattr(self.pki, f"{ca}_ca"),
            getattr(self.pki, f"{ca}_ca_key"),
            name,
            serial,
        )
        return self.node(name, *pair)

    def attested(
        self, name: str = "w1", serial: str = "SER1", ek: str = "ab" * 32
    ) -> Path:
        """
        A node as attestation leaves it (a software key stands in for the
        TPM's): an LDevID from the issuer, its record with the EK digest,
        and that EK's binding approved for C{serial}.
        """
        from fleetd.pki.ldevid import Subject, serialHex
        from fleetd.pki.records import LDevIDRecord, storeIssued

        key = ec.generate_private_key(ec.SECP256R1())
        issuer = self.server.issuer
        cert = issuer.issue(
            key.public_key(), Subject(name, serial), self.server.clock.seconds()
        )
        record = LDevIDRecord(
            serialHex(cert), serial, name, issuer.name,
            cert.not_valid_after_utc.timestamp(), self.server.clock.seconds(),
            "attest", ek,
        )  # fmt: skip
        with self.server.db.transaction():
            storeIssued(self.server.db, record)
        self.server.book.issued(record)
        self.server.bindings.approved[ek] = serial
        keyPEM = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return self.node(name, cert.public_bytes(serialization.Encoding.PEM), keyPEM)

    def agent(
        self, state: Path, command: str, *extra: str
    ) -> Deferred[tuple[int, str, str]]:
        argv = [
            "--server", self.url,
            "--ca", str(self.pki.public_ca),
            "--state", str(state),
            "--tcti", "swtpm:host=127.0.0.1,port=1",
            "--json", command, *extra,
        ]  # fmt: skip

        def run() -> tuple[int, str, str]:
            out, err = io.StringIO(), io.StringIO()
            code = agent.main(argv, err, out)
            return code, out.getvalue(), err.getvalue()

        return deferToThread(run)

    async def ok(self, state: Path, command: str, *extra: str) -> dict[str, Any]:
        code, out, err = await self.agent(state, command, *extra)
        self.assertEqual((code, err), (0, ""))
        doc: dict[str, Any] = json.loads(out)
        return doc

    async def refusal(self, state: Path, command: str, reason: str) -> None:
        await self.refused(state, command, reason)

    async def refused(self, state: Path, command: str, reason: str, *extra: str) -> str:
        code, _, err = await self.agent(state, command, *extra)
        self.assertEqual(code, 1, err)
        self.assertEqual(err.count("\n"), 1)
        self.assertIn(f"{reason}", err)
        return err


class LegacyCutOverTests(LDevIDTestCase):
    async def test_legacy_acceptedUntilAttested_neverRenewed(self) -> None:
        """
        [T4] [T3] A capsule LDevID works for lookups, but its software key is
        never renewed into an LDevID from the current issuer (attest-required,
        journaled, nothing issued); once the node attested through spore only
        the new one is accepted (ldevid-not-current-issuer).
        """
        state = self.legacy()
        plan = await self.ok(state, "plan")
        self.assertEqual(plan["device"], "w1")
        err = await self.refused(state, "renew", "attest-required")
        self.assertIn("fleetd-agent attest", err)
        self.assertEqual(self.server.entries("ldevid.issued"), [])
        self.assertEqual(self.server.entries("ldevid.cutover"), [])
        refusals = self.server.entries("attest.refused")
        self.assertEqual(refusals[-1].fields["reason"], "attest-required")
        # The node attests (its record as attestation leaves it).
        new = self.attested()
        self.assertEqual((await self.ok(new, "plan"))["device"], "w1")
        await self.refused(state, "plan", "ldevid-not-current-issuer")
        refusals = self.server.entries("attest.refused")
        self.assertEqual(refusals[-1].fields["reason"], "ldevid-not-current-issuer")

    async def test_forge_acceptedBeforeRenewal(self) -> None:
        """[T4] a forge-issued LDevID is accepted too (it is in the bundle)."""
        state = self.legacy(ca="forge")
        self.assertEqual((await self.ok(state, "plan"))["device"], "w1")

    async def test_otherNodeLegacy_unaffected(self) -> None:
        """[T4] one node's cut-over does not refuse another node's legacy LDevID."""
        await self.ok(self.attested(), "renew")
        other = self.legacy("w2", "SER2")
        self.assertEqual((await self.ok(other, "plan"))["device"], "w2")

    async def test_renewedTwice_olderRefused(self) -> None:
        """[T4] after a second renewal the first new LDevID is superseded."""
        state = self.attested()
        await self.ok(state, "renew")
        first = (state / "ldevid.pem").read_bytes()
        await self.ok(state, "renew")
        (state / "ldevid.pem").write_bytes(first)
        await self.refused(state, "plan", "ldevid-superseded")

    async def test_renew_journalRefuses_nothingChanges(self) -> None:
        """[J1] the journal refuses the renewal: no new record, one line."""
        state = self.attested()
        before = self.server.book.current("SER1")
        rows = self.server.db.execute("SELECT * FROM ldevids").fetchall()
        self.server.journalCore.failing = JournalRefused("journal full")
        self.server.journalCore.onlyEvents = frozenset({"ldevid.issued"})
        err = await self.refused(state, "renew", "journal refused")
        self.assertIn("nothing changed", err)
        self.server.journalCore.failing = None
        self.assertEqual(
            self.server.db.execute("SELECT * FROM ldevids").fetchall(), rows
        )
        self.assertEqual(self.server.book.current("SER1"), before)
        # Still the LDevID it had: accepted.
        self.assertEqual((await self.ok(state, "plan"))["device"], "w1")

    async def test_renew_databaseFails_nothingChanges(self) -> None:
        """[J1] the database fails in the issuance's transaction: nothing
        changes, one line (503)."""
        import sqlite3

        state = self.attested()
        before = self.server.book.current("SER1")
        rows = self.server.db.execute("SELECT * FROM ldevids").fetchall()
        # The write transaction fails as a full or broken disk makes it.
        self.server.journalCore.failing = sqlite3.OperationalError("disk I/O error")
        self.server.journalCore.onlyEvents = frozenset({"ldevid.issued"})
        err = await self.refused(state, "renew", "cannot record the change")
        self.server.journalCore.failing = None
        self.assertIn("nothing changed", err)
        self.assertEqual(self.server.book.current("SER1"), before)
        self.assertEqual(
            self.server.db.execute("SELECT * FROM ldevids").fetchall(), rows
        )

    async def test_renew_otherKey_refused(self) -> None:
        """[T4] renewal keeps the key: a CSR for another key is csr-invalid."""
        state = self.legacy()
        other = ec.generate_private_key(ec.SECP256R1())
        # The TLS key stays; only the CSR's key changes.
        from fleetd.agent import attest as agent_attest

        real = agent_attest.SOFT_KEY
        (state / "other.key").write_bytes(
            other.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        doc = await deferToThread(
            self._renewWithCSRKey, state, state / "other.key", real
        )
        self.assertEqual(doc, "csr-invalid")

    def _renewWithCSRKey(self, state: Path, keyPath: Path, real: str) -> str:
        from fleetd.agent.client import Refusal, call, tlsContext

        key: Any = serialization.load_pem_private_key(keyPath.read_bytes(), None)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(name)
            .sign(key, hashes.SHA256())
        )
        context = tlsContext(
            str(self.pki.public_ca), state / "ldevid.pem", state / real
        )
        try:
            pem = csr.public_bytes(serialization.Encoding.PEM).decode()
            call(self.url, "/v1/ldevid/renew", context, {"csr": pem})
        except Refusal as e:
            return e.reason
        return "issued"


class TLSRefusalTests(LDevIDTestCase):
    async def test_unknownIssuer_refusedAtTLS(self) -> None:
        """[T4] a certificate from a CA outside the bundle fails the TLS handshake."""
        pair = issueWith(self.pki.owner_ca, self.pki.owner_ca_key, "w1", "SER1")
        await self.refusal(self.node("w1", *pair), "plan", "unreachable")

    async def test_expired_refusedAtTLS(self) -> None:
        """[T4] an expired LDevID fails the TLS handshake (certificate expired)."""
        pair = issueWith(
            self.pki.capsule_ca, self.pki.capsule_ca_key, "w1", "SER1", expired=True
        )

        err = await self.refused(self.node("w1", *pair), "plan", "unreachable")
        self.assertIn("expired", err.lower())

    async def test_noCertificate_401(self) -> None:
        """[T4] a lookup without a client certificate: 401 ldevid-required."""
        from fleetd.agent.client import Refusal, call, tlsContext

        def run() -> Any:
            try:
                call(self.url, "/v1/node/plan", tlsContext(str(self.pki.public_ca)))
            except Refusal as e:
                return e.status, e.reason
            return None

        self.assertEqual(await deferToThread(run), (401, "ldevid-required"))

    async def test_currentIssuerUnrecorded_refused(self) -> None:
        """[T4] an LDevID from the issuer with no record in fleetd: ldevid-unknown."""
        issuer = self.pki.devid_issuer, self.pki.devid_issuer_key
        pair = issueWith(*issuer, "w1", "SER1")
        await self.refusal(self.node("w1", *pair), "plan", "ldevid-unknown")


class PlanTests(LDevIDTestCase):
    async def test_plan_targetDiskImageAndCode(self) -> None:
        """The plan names the target disk serial, image and the ready run's code."""
        self.server.disks.targets["w1"] = "DISK-SN-1"
        self.server.runs.ready["w1"] = "r-0123456789abcdef"
        self.server.vault.put("r-0123456789abcdef.code", b"ABCD-1234-code")
        config = b"machine:\n  install:\n    image: ghcr.io/x/installer:v1\n"
        self.server.vault.put("r-0123456789abcdef.yaml", config)

        plan = await self.ok(self.legacy(), "plan")
        self.assertEqual(
            plan,
            {
                "device": "w1",
                "serial": "SER1",
                "target_disk_serial": "DISK-SN-1",
                "image": "ghcr.io/x/installer:v1",
                "run": "r-0123456789abcdef",
                "meta_0x0b": "ABCD-1234-code",
                "meta_0x0b_withheld": None,
            },
        )

    async def test_plan_noReadyRun_noCode(self) -> None:
        """Without a ready run the plan carries no code."""
        plan = await self.ok(self.legacy(), "plan")
        self.assertIsNone(plan["meta_0x0b"])
        self.assertIsNone(plan["run"])

    async def test_plan_otherNode_refused(self) -> None:
        """A node cannot read another node's plan: not-your-record, journaled."""
        await self.refused(self.legacy(), "plan", "not-your-record", "--device", "w2")
        (entry,) = self.server.entries("attest.refused")
        self.assertEqual(entry.fields["reason"], "not-your-record")
        self.assertEqual(entry.fields["asked"], "w2")

    async def test_plan_workerG2_refused(self) -> None:
        """[T2] a worker-g2 device's plan lookup: class-refused, journaled."""
        self.server.addDevice("old1", "SER9", "worker-g2")

        await self.refused(self.legacy("old1", "SER9"), "plan", "class-refused")
        (entry,) = self.server.entries("attest.refused")
        self.assertEqual(
            (entry.device, entry.fields["reason"]), ("old1", "class-refused")
        )


class PlanWriteMetaTests(LDevIDTestCase):
    """
    C{plan --write-meta DEV} (issue 19, item 1): the run's code as META
    0x0b on the plan's target disk, through C{meta write}'s code path;
    refused in one line without a code or on another disk.
    """

    CODE = "ABCD-1234-code"

    def ready(self) -> None:
        self.server.disks.targets["w1"] = "DISK-SN-1"
        self.server.runs.ready["w1"] = "r-0123456789abcdef"
        self.server.vault.put("r-0123456789abcdef.code", self.CODE.encode())
        config = b"machine:\n  install:\n    image: ghcr.io/x/installer:v1\n"
        self.server.vault.put("r-0123456789abcdef.yaml", config)

    def metaKeys(self, disk: Path | str) -> dict[str, str]:
        code, out, err = runAgent("--json", "meta", "read", "--disk", str(disk))
        self.assertEqual((code, err), (0, ""))
        keys: dict[str, str] = json.loads(out)["keys"]
        return keys

    def fakeSysfs(self, device: str, serial: str) -> Path:
        """A sysfs root where C{device} is a whole disk with C{serial}."""
        root = Path(self.mktemp())
        rdev = os.stat(device).st_rdev
        name = Path(device).name
        (root / "block" / name / "device").mkdir(parents=True)
        (root / "block" / name / "device" / "serial").write_text(serial + "\n")
        (root / "dev" / "block").mkdir(parents=True)
        (root / "dev" / "block" / f"{os.major(rdev)}:{os.minor(rdev)}").symlink_to(
            f"../../block/{name}"
        )
        return root

    async def test_imageFile_codeWrittenAndReadBack(self) -> None:
        """With --image-file the code lands as 0x0b (other keys kept) and a
        warning line says the target disk was not checked."""
        self.ready()
        image = makeImage(self)
        self.assertEqual(
            runAgent("meta", "write", "--disk", str(image), "0x0a", "n")[0], 0
        )

        code, out, err = await self.agent(
            self.legacy(), "plan", "--write-meta", str(image), "--image-file"
        )
        self.assertEqual(code, 0, err)
        plan = json.loads(out)
        self.assertEqual(
            (plan["meta_0x0b"], plan["meta_written"]), (self.CODE, str(image))
        )
        self.assertEqual(
            err,
            f"fleetd-agent: warning: {image} is an image file; it was not"
            " checked against the plan's target disk serial DISK-SN-1\n",
        )
        self.assertEqual(self.metaKeys(image), {"0x0a": "n", "0x0b": self.CODE})

    async def test_noCode_refused(self) -> None:
        """No ready run, no code: one line, the disk untouched."""
        image = makeImage(self)
        before = image.read_bytes()

        err = await self.refused(
            self.legacy(), "plan", "meta-code-missing",
            "--write-meta", str(image), "--image-file",
        )  # fmt: skip
        self.assertIn("the plan carries no META 0x0b code", err)
        self.assertEqual(image.read_bytes(), before)

    async def test_fileWithoutImageFlag_refused(self) -> None:
        """A file is not the target disk unless --image-file says it is one."""
        self.ready()
        image = makeImage(self)
        before = image.read_bytes()

        err = await self.refused(
            self.legacy(), "plan", "not-target-disk", "--write-meta", str(image)
        )
        self.assertIn("not the plan's target disk DISK-SN-1", err)
        self.assertEqual(image.read_bytes(), before)

    async def test_targetDisk_bySerial(self) -> None:
        """A block device whose serial is the plan's target (case aside)
        gets the code; no warning."""
        self.ready()
        device = loopDevice(self, makeImage(self))
        sysfs = self.fakeSysfs(device, "disk-sn-1")

        code, out, err = await self.agent(
            self.legacy(), "plan", "--write-meta", device,
            "--sysfs-root", str(sysfs),
        )  # fmt: skip
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out)["meta_written"], device)
        self.assertEqual(self.metaKeys(device), {"0x0b": self.CODE})

    async def test_otherDisk_refused(self) -> None:
        """A block device with another serial: not-target-disk, untouched."""
        self.ready()
        device = loopDevice(self, makeImage(self))
        sysfs = self.fakeSysfs(device, "DISK-SN-2")

        err = await self.refused(
            self.legacy(), "plan", "not-target-disk",
            "--write-meta", device, "--sysfs-root", str(sysfs),
        )  # fmt: skip
        self.assertIn("is disk DISK-SN-2, not the plan's target disk DISK-SN-1", err)
        self.assertEqual(self.metaKeys(device), {})

    async def test_diskWithoutSerial_refused(self) -> None:
        """A disk that reports no serial (a loop device in the real sysfs)
        cannot be shown to be the target: refused."""
        self.ready()
        device = loopDevice(self, makeImage(self))

        err = await self.refused(
            self.legacy(), "plan", "not-target-disk", "--write-meta", device
        )
        self.assertIn("reports no serial", err)
        self.assertEqual(self.metaKeys(device), {})

    async def test_imageFlagOnDisk_refused(self) -> None:
        """--image-file cannot waive the serial check for a block device."""
        self.ready()
        device = loopDevice(self, makeImage(self))

        err = await self.refused(
            self.legacy(), "plan", "not-target-disk",
            "--write-meta", device, "--image-file",
        )  # fmt: skip
        self.assertIn("--image-file, but", err)
        self.assertEqual(self.metaKeys(device), {})


class RenewSubjectTests(LDevIDTestCase):
    async def test_renew_subjectFromInventory(self) -> None:
        """[T4] an attested LDevID naming an old device name renews under
        the inventory's name for its serial."""
        state = self.attested("old-name", "SER1")
        await self.ok(state, "renew")
        new = x509.load_pem_x509_certificate((state / "ldevid.pem").read_bytes())
        cn = new.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        self.assertEqual(cn, "w1")

    async def test_renew_unknownSerial_refused(self) -> None:
        """[T4] an attested LDevID for a serial no longer in the inventory
        cannot renew."""
        await self.refusal(self.attested("w9", "SER9"), "renew", "device-unknown")


SERVER = "https://127.0.0.1:9"  # never reached: the state is looked at first


class AgentStateTests(SynchronousTestCase):
    """fleetd-agent's --state: one line, never a traceback (issue 17's note)."""

    def agent(self, *argv: str) -> tuple[int, str]:
        err, out = io.StringIO(), io.StringIO()
        code = agent.main(list(argv), err, out)
        return code, err.getvalue()

    def test_renew_noKeyInState_oneLine(self) -> None:
        """renew without a previous attest names the directory and what to run."""
        state = self.mktemp()
        Path(state).mkdir()
        code, err = self.agent(
            "--server", "https://127.0.0.1:9", "--state", state, "renew"
        )
        self.assertEqual(code, 1)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(f"fleetd-agent: renew: no LDevID key in {state}", err)
        self.assertIn("fleetd-agent attest", err)

    def test_emptyState_usageError(self) -> None:
        """An empty --state is a usage error, not the current directory."""
        code, err = self.agent(
            "--server", "https://127.0.0.1:9", "--state", "", "renew"
        )
        self.assertEqual(code, 1)
        self.assertIn("--state: empty", err)
        self.assertNotIn("Traceback", err)
