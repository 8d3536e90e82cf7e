"""
End to end with a real swtpm: fleetd-agent against the device listener
over TLS [T1] [T2] [T3] [T4].
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID
from twisted.internet.threads import deferToThread

from fleetd.agent import tpm
from fleetd.pki.dev import ensureDevPKI
from tests.swtpmsupport import SWTPMTestCase


class AttestRSATests(SWTPMTestCase):
    async def _attest(self) -> None:
        self.approve("w1", "SER1")
        code, _out, err = await self.agent("attest", "--serial", "SER1", "--ek", "rsa")
        self.assertEqual((code, err), (0, ""))
        cert = x509.load_pem_x509_certificate((self.state / "ldevid.pem").read_bytes())
        self.assertEqual(
            cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value, "w1"
        )
        self.assertEqual(len(self.server.entries("ldevid.issued")), 1)

    async def test_attest_rsaEK_issuesLDevID(self) -> None:
        """[T3] an approved RSA-2048 EK attests and gets an LDevID naming its device."""
        await self._attest()

    async def test_attest_flushesEverything(self) -> None:
        """The agent leaves no transient object or session loaded (3 slots)."""
        await self._attest()
        self.assertEqual(await deferToThread(self.loadedHandles), [])

    def loadedHandles(self) -> list[int]:
        from tpm2_pytss.constants import TPM2_CAP, TPM2_HC

        ectx = tpm.openTPM(self.swtpm.tcti)
        try:
            found = []
            for first in (TPM2_HC.TRANSIENT_FIRST, TPM2_HC.LOADED_SESSION_FIRST):
                _, data = ectx.get_capability(TPM2_CAP.HANDLES, first, 64)
                found += [
                    int(h) for h in data.data.handles if (h >> 24) == (first >> 24)
                ]
            return found
        finally:
            ectx.close()


class AttestECCTests(SWTPMTestCase):
    async def test_attest_eccP384EK_issuesLDevID(self) -> None:
        """[T3] an approved ECC P-384 EK (high range, PolicyB) attests."""
        self.approve("w2", "SER2", kind="ecc")
        code, _out, err = await self.agent("attest", "--serial", "SER2", "--ek", "ecc")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(len(self.server.entries("ldevid.issued")), 1)


class RefusalTests(SWTPMTestCase):
    async def refused(self, reason: str, *argv: str, tcti: str | None = None) -> None:
        code, _, err = await self.agent("attest", *argv, tcti=tcti)
        self.assertEqual(code, 1, err)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(f"refused: {reason}: ", err)
        entries = self.server.entries("attest.refused")
        self.assertEqual([e.fields["reason"] for e in entries], [reason])
        self.assertFalse((self.state / "ldevid.pem").exists())
        self.assertEqual(self.server.entries("ldevid.issued"), [])

    async def test_attest_unboundEK_refused(self) -> None:
        """[T1] an EK without an approved binding gets ek-binding-not-approved."""
        self.server.addDevice("w1", "SER1")
        await self.refused("ek-binding-not-approved", "--serial", "SER1", "--ek", "rsa")

    async def test_attest_classWorkerG2_refused(self) -> None:
        """[T2] a worker-g2 device cannot attest: class-refused, journaled."""
        self.approve("old1", "SER9", cls="worker-g2")

        await self.refused("class-refused", "--serial", "SER9", "--ek", "rsa")
        (entry,) = self.server.entries("attest.refused")
        self.assertEqual(entry.device, "old1")

    async def test_attest_clonedTPMOtherSerial_refused(self) -> None:
        """[T3] a copy of an approved TPM's state, claiming another serial: refused."""
        self.approve("w1", "SER1")
        self.server.addDevice("w2", "SER2")
        twin = self.swtpm.clone(Path(self.mktemp()).resolve())
        twin.start()
        self.addCleanup(twin.stop)
        await self.refused(
            "serial-mismatch", "--serial", "SER2", "--ek", "rsa", tcti=twin.tcti
        )

    async def test_attest_untrustedManufacturer_refused(self) -> None:
        """[T3] an EK certificate from outside attest.ek_roots: ek-cert-untrusted."""
        self.approve("w1", "SER1")
        other = ensureDevPKI(Path(self.mktemp()), "localhost")
        from fleetd.attest.ekroots import EKRoots

        self.server.service.ekRoots = EKRoots.load(other.ek_roots)
        await self.refused("ek-cert-untrusted", "--serial", "SER1", "--ek", "rsa")


class TPM12Tests(SWTPMTestCase):
    tpm2 = False

    async def test_attest_tpm12_refused(self) -> None:
        """[T2] a TPM 1.2 (by version: it has an EK certificate too) cannot attest."""
        code, _, err = await self.agent("attest", "--serial", "SER1")
        self.assertEqual(code, 1)
        self.assertIn("refused: tpm12-unsupported: ", err)
        (entry,) = self.server.entries("attest.refused")
        self.assertEqual(entry.fields["reason"], "tpm12-unsupported")
        self.assertEqual(entry.fields["reported_serial"], "SER1")
