"""
fleetd-agent's mTLS with the TPM-resident LDevID key [T4] [D1]: a real
daemon, a real swtpm behind tpm2-abrmd (the resource manager a node has
as /dev/tpmrm0), OpenSSL's tpm2 provider; and the clean refusals when the
TPM key cannot be used.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cryptography import x509
from twisted.trial.unittest import SynchronousTestCase

from fleetd.agent import attest as agent_attest
from fleetd.agent import mtls as agent_mtls
from fleetd.agent.client import Refusal, Unreachable
from fleetd.pki.dev import ensureDevPKI
from tests.swtpmsupport import TPMKeyDaemonCase, runAgent

DISKS = {
    "disks": [
        {"name": "nvme0n1", "serial": "S6PNNS0T1", "wwn": "eui.0025388",
         "size": 960197124096, "removable": False},
        {"name": "sda", "serial": "BTYS81234", "wwn": None,
         "size": 240057409536, "removable": False},
    ]
}  # fmt: skip


class ResourceManagedTests(SynchronousTestCase):
    def test_resourceManaged_onlyKernelRMAndAbrmd(self) -> None:
        """Which TCTIs reach the TPM through a resource manager."""
        managed = agent_mtls.resourceManaged
        self.assertTrue(managed("device:/dev/tpmrm0"))
        self.assertTrue(managed("tabrmd:bus_type=session"))
        self.assertTrue(managed("tabrmd"))
        self.assertFalse(managed("device:/dev/tpm0"))
        self.assertFalse(managed("device"))
        self.assertFalse(managed("swtpm:host=127.0.0.1,port=2321"))
        self.assertFalse(managed("mssim"))


class RefusalTests(SynchronousTestCase):
    """Without a resource manager the agent says so in one line [T4]."""

    def setUp(self) -> None:
        self.state = Path(self.mktemp())
        self.state.mkdir()
        (self.state / "ldevid.pem").write_text("certificate\n")
        (self.state / "ldevid.tss2.pem").write_text("key\n")

    def argv(self, command: str, *extra: str) -> list[str]:
        return [
            "--server", "https://localhost:1",
            "--tcti", "swtpm:host=127.0.0.1,port=1",
            "--state", str(self.state),
            command, *extra,
        ]  # fmt: skip

    def test_plan_swtpmWithoutRM_tpmTLSUnsupported(self) -> None:
        """[T4] plan with a TPM key and no resource manager: one clear line."""
        code, out, err = runAgent(self.argv("plan"))
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(
            err,
            "fleetd-agent: plan: tpm-tls-unsupported: swtpm:host=127.0.0.1,port=1"
            " has no resource manager; OpenSSL's tpm2 provider needs more than"
            " the TPM's object slots for a handshake (use device:/dev/tpmrm0 or"
            " tabrmd)\n",
        )

    def test_disks_swtpmWithoutRM_tpmTLSUnsupported(self) -> None:
        """[D1] disks maps the same refusal to its one AgentError line."""
        report = self.state / "disks.json"
        report.write_text(json.dumps(DISKS))
        code, out, err = runAgent(self.argv("disks", "--from", str(report)))
        self.assertEqual((code, out), (1, ""))
        self.assertTrue(
            err.startswith(
                "fleetd-agent: disks: tpm-tls-unsupported: swtpm:host=127.0.0.1,"
                "port=1 has no resource manager; "
            ),
            err,
        )
        self.assertEqual(err.count("\n"), 1, err)

    def test_disks_noLDevID_oneLine(self) -> None:
        """[D1] disks before attest: a TPMError, one line, nothing sent."""
        (self.state / "ldevid.pem").unlink()
        report = self.state / "disks.json"
        report.write_text(json.dumps(DISKS))
        code, _, err = runAgent(self.argv("disks", "--from", str(report)))
        self.assertEqual(code, 1)
        self.assertEqual(
            err,
            f"fleetd-agent: disks: tpm-error: no LDevID in {self.state}:"
            " run attest first\n",
        )


class HelperTests(SynchronousTestCase):
    """The child process's answers map to one line each."""

    def test_answer_garbage_tpmTLSUnsupported(self) -> None:
        """A helper that died (no JSON) names its last stderr line."""
        with self.assertRaises(agent_mtls.TPMTLSError) as caught:
            agent_mtls._answer("https://x", b"", b"noise\nTraceback: boom\n")
        self.assertEqual(
            str(caught.exception),
            "tpm-tls-unsupported: the TLS helper failed: Traceback: boom",
        )

    def test_answer_unreachable(self) -> None:
        doc = json.dumps({"error": "unreachable", "line": "refused"}).encode()
        with self.assertRaises(Unreachable):
            agent_mtls._answer("https://x", doc, b"")

    def test_exchange_unloadableKey_tpmTLSUnsupported(self) -> None:
        """A key OpenSSL cannot load (no provider decodes it) is refused
        before connecting."""
        pki = ensureDevPKI(Path(self.mktemp()), "localhost")
        bad = Path(self.mktemp())
        bad.write_text(
            "-----BEGIN TSS2 PRIVATE KEY-----\nAAAA\n-----END TSS2 PRIVATE KEY-----\n"
        )
        answer = agent_mtls._exchange(
            {"method": "GET", "url": "https://localhost:1/", "ca": None,
             "cert": str(pki.public_cert), "key": str(bad), "body": None}
        )  # fmt: skip
        self.assertEqual(answer["error"], "tpm-tls-unsupported")
        self.assertIn("cannot load the TPM key", answer["line"])


class TPMKeyDaemonTests(TPMKeyDaemonCase):
    async def test_tpmKey_attestDisksPlanRenew(self) -> None:
        """
        [T4][D1] with the TPM-resident LDevID over mTLS: disks reports (the
        target named), plan gives the target's serial and the META code
        after a provision, renew gets a new certificate for the same key,
        and the old certificate is refused afterwards.
        """
        await self._start()
        code, _, err = await self.agent("attest", "--serial", "SER1", "--ek", "rsa")
        self.assertEqual((code, err), (0, ""))
        self.assertFalse((self.state / "ldevid.key").exists())  # a TPM key
        report = Path(self.mktemp())
        report.write_text(json.dumps(DISKS))
        code, out, err = await self.agent("disks", "--from", str(report))
        self.assertEqual((code, err), (0, ""))
        verdict = json.loads(out)
        self.assertEqual(verdict["device"], "w1")
        target = verdict["target"]["serial"]
        self.assertIn(target, {"S6PNNS0T1", "BTYS81234"})
        await self.fleetctl("provision", "w1")
        code, out, err = await self.agent("plan")
        self.assertEqual((code, err), (0, ""))
        plan = json.loads(out)
        self.assertEqual((plan["device"], plan["target_disk_serial"]), ("w1", target))
        self.assertRegex(plan["meta_0x0b"] or "", r"\S{8,}")
        before = (self.state / "ldevid.pem").read_bytes()
        old = Path(self.mktemp())
        shutil.copytree(self.state, old)
        code, out, err = await self.agent("renew")
        self.assertEqual((code, err), (0, ""))
        after = (self.state / "ldevid.pem").read_bytes()
        first = x509.load_pem_x509_certificate(before)
        second = x509.load_pem_x509_certificate(after)
        self.assertNotEqual(first.serial_number, second.serial_number)
        self.assertEqual(first.public_key(), second.public_key())
        code, out, err = await self.agent("plan")
        self.assertEqual((code, err), (0, ""))
        code, out, err = await self.agent("plan", state=old)
        self.assertEqual((code, out), (1, ""))
        self.assertTrue(
            err.startswith("fleetd-agent: plan: refused: ldevid-superseded: "), err
        )
        self.assertEqual(err.count("\n"), 1, err)


class InstallableTests(SynchronousTestCase):
    """What C{fleetd-agent plan} does with the plan fleetd answers."""

    def test_codeWithheld_refusedNamingTheDiskReason(self) -> None:
        """
        [D1] A ready run whose code fleetd withheld (no target disk) stops
        the workflow with the disk check's line, its reason code first.
        """
        plan = {
            "meta_0x0b": None,
            "meta_0x0b_withheld": "duplicate-disk-serial: S1 is also on w2",
        }
        e = self.assertRaises(Refusal, agent_attest.installable, plan)
        self.assertEqual(e.reason, "duplicate-disk-serial")
        self.assertEqual(e.line, "duplicate-disk-serial: S1 is also on w2")

    def test_noReadyRun_orCode_passes(self) -> None:
        """A plan with its code, or with no ready run at all, goes on."""
        for plan in (
            {"meta_0x0b": "abc", "meta_0x0b_withheld": None},
            {"meta_0x0b": None, "meta_0x0b_withheld": None},
        ):
            self.assertIs(agent_attest.installable(plan), plan)
