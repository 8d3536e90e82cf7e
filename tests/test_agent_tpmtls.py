"""
fleetd-agent's mTLS with the TPM-resident LDevID key [T4] [D1]: a real
daemon, a real swtpm behind tpm2-abrmd (the resource manager a node has
as /dev/tpmrm0), OpenSSL's tpm2 provider; and the clean refusals when the
TPM key cannot be used.
"""

from __future__ import annotations

import atexit
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cryptography import x509
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.agent import attest as agent_attest
from fleetd.agent import main as agent
from fleetd.agent import mtls as agent_mtls
from fleetd.agent.client import Refusal, Unreachable
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from tests.support import TOPOLOGY, missingPeer, writeConfig
from tests.swtpm import RM_AVAILABLE, SWTPM, ResourceManager
from tests.test_attest_swtpm import ekDigestOf
from tests.test_daemon import DaemonTestMixin
from tests.test_devices_api import run as fleetctlRun

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"
DISKS = {
    "disks": [
        {"name": "nvme0n1", "serial": "S6PNNS0T1", "wwn": "eui.0025388",
         "size": 960197124096, "removable": False},
        {"name": "sda", "serial": "BTYS81234", "wwn": None,
         "size": 240057409536, "removable": False},
    ]
}  # fmt: skip


def runAgent(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = agent.main(argv, err, out)
    return code, out.getvalue(), err.getvalue()


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


class TPMKeyDaemonCase(DaemonTestMixin, TestCase):
    """
    A real daemon per test; one swtpm behind tpm2-abrmd and one dev PKI
    per concrete class (the daemon's PKI is a copy, so its EK roots are
    the swtpm's manufacturer CA).
    """

    swtpm: SWTPM
    rm: ResourceManager
    classPKI: DevPKIPaths

    @classmethod
    def shared(cls) -> None:
        if "swtpm" in cls.__dict__:
            return
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")
        base = Path(tempfile.mkdtemp(prefix="fleetd-tpmtls-"))
        atexit.register(shutil.rmtree, base, True)
        cls.classPKI = ensureDevPKI(base / "pki", str(TOPOLOGY["enrollment_name"]))
        cls.swtpm = SWTPM(base / "tpm", cls.classPKI)
        cls.swtpm.start()
        atexit.register(cls.swtpm.stop)
        cls.rm = ResourceManager(cls.swtpm, base)
        cls.rm.start()
        atexit.register(cls.rm.stop)

    def setUp(self) -> None:
        self.shared()
        self.makeSettings()
        shutil.copytree(self.classPKI.ek_roots.parent, self.directory / "pki")
        self.state = Path(self.mktemp()).resolve()

    def agent(
        self,
        command: str,
        *extra: str,
        state: Path | None = None,
        tcti: str | None = None,
    ) -> Any:
        argv = [
            "--server", self.url,
            "--ca", str(self.pki.public_ca),
            "--tcti", tcti or self.rm.tcti,
            "--state", str(state or self.state),
            "--json", command, *extra,
        ]  # fmt: skip
        return deferToThread(runAgent, argv)

    async def fleetctl(self, *words: str) -> str:
        code, out, err = await deferToThread(
            fleetctlRun, ["--config", self.config, *words]
        )
        self.assertEqual(code, 0, err)
        return str(out)

    async def _start(self, approve: bool = True) -> None:
        self.service = service = self.startDaemon()
        await service.loading.whenReady()
        admin = self.port(service, "admin")
        self.url = f"https://localhost:{self.port(service, 'device')}"
        self.config = str(
            writeConfig(
                self.directory, {"owner": {"server": f"https://localhost:{admin}"}}
            )
        )
        await self.fleetctl("device", "add", "w1", "--serial", "SER1",
                            "--uuid", UUID, "--class", "worker")  # fmt: skip
        if not approve:
            return
        der = self.swtpm.ekCertificates()["ek-rsa2048.crt"]
        await self.fleetctl("evidence", "add", "--serial", "SER1",
                            "--ek-sha256", ekDigestOf(der),
                            "--kind", "receiving-scan", "--ref", "scan-1")  # fmt: skip
        await self.fleetctl("binding", "approve", "SER1")


class TPMKeyDaemonTests(TPMKeyDaemonCase):
    async def _endToEnd(self) -> None:
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

    def test_tpmKey_attestDisksPlanRenew(self) -> Deferred[None]:
        """
        [T4][D1] with the TPM-resident LDevID over mTLS: disks reports (the
        target named), plan gives the target's serial and the META code
        after a provision, renew gets a new certificate for the same key,
        and the old certificate is refused afterwards.
        """
        return ensureDeferred(self._endToEnd())


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
