"""
End to end with a real swtpm: fleetd-agent against the device listener
over TLS [T1] [T2] [T3] [T4].
"""

from __future__ import annotations

import atexit
import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.agent import main as agent
from fleetd.agent import tpm
from fleetd.attest.tpm import canonicalSPKI, ekDigest
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from tests.attestserver import AttestServer
from tests.support import missingPeer
from tests.swtpm import AVAILABLE, SWTPM


def ekDigestOf(certDER: bytes) -> str:
    cert = x509.load_der_x509_certificate(certDER)
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    spki = cert.public_key().public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    )
    return ekDigest(canonicalSPKI(spki))


class SWTPMTestCase(TestCase):
    """One dev PKI and one manufactured swtpm per class."""

    tpm2 = True
    swtpm: SWTPM
    pki: DevPKIPaths
    base: Path

    @classmethod
    def shared(cls) -> None:
        """
        Manufacture this class's swtpm once (trial has no setUpClass); it is
        stopped and its files removed when the test process exits.
        """
        if "swtpm" in cls.__dict__:
            return
        if not AVAILABLE:
            raise missingPeer("swtpm is not installed")
        cls.base = Path(tempfile.mkdtemp(prefix="fleetd-swtpm-"))
        cls.pki = ensureDevPKI(cls.base / "pki", "localhost")
        cls.swtpm = SWTPM(cls.base / "tpm", cls.pki, tpm2=cls.tpm2)
        cls.swtpm.start()
        atexit.register(cls.swtpm.stop)
        atexit.register(shutil.rmtree, cls.base, True)

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        self.shared()
        self.server = AttestServer(Path(self.mktemp()), self.pki)
        self.state = Path(self.mktemp())

        async def start() -> None:
            self.url = await self.server.listen()

        self.addCleanup(lambda: ensureDeferred(self.server.stop()))
        return ensureDeferred(start())

    def agent(
        self, command: str, *extra: str, tcti: str | None = None
    ) -> Deferred[Any]:
        argv = [
            "--server", self.url,
            "--ca", str(self.pki.public_ca),
            "--tcti", tcti or self.swtpm.tcti,
            "--state", str(self.state),
            command, *extra,
        ]  # fmt: skip

        def run() -> tuple[int, str, str]:
            out, err = io.StringIO(), io.StringIO()
            code = agent.main(argv, err, out)
            return code, out.getvalue(), err.getvalue()

        return deferToThread(run)

    def approve(
        self, name: str, serial: str, kind: str = "rsa", cls: str = "worker"
    ) -> None:
        certs = self.swtpm.ekCertificates()
        der = certs["ek-rsa2048.crt" if kind == "rsa" else "ek-secp384r1.crt"]
        self.server.addDevice(name, serial, cls)
        self.server.bindings.approved[ekDigestOf(der)] = serial


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

    def test_attest_rsaEK_issuesLDevID(self) -> Deferred[None]:
        """[T3] an approved RSA-2048 EK attests and gets an LDevID naming its device."""
        return ensureDeferred(self._attest())

    def test_attest_flushesEverything(self) -> Deferred[None]:
        """The agent leaves no transient object or session loaded (3 slots)."""

        async def check() -> None:
            await self._attest()
            self.assertEqual(await deferToThread(self.loadedHandles), [])

        return ensureDeferred(check())

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
    async def _attest(self) -> None:
        self.approve("w2", "SER2", kind="ecc")
        code, _out, err = await self.agent("attest", "--serial", "SER2", "--ek", "ecc")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(len(self.server.entries("ldevid.issued")), 1)

    def test_attest_eccP384EK_issuesLDevID(self) -> Deferred[None]:
        """[T3] an approved ECC P-384 EK (high range, PolicyB) attests."""
        return ensureDeferred(self._attest())


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

    def test_attest_unboundEK_refused(self) -> Deferred[None]:
        """[T1] an EK without an approved binding gets ek-binding-not-approved."""
        self.server.addDevice("w1", "SER1")
        return ensureDeferred(
            self.refused("ek-binding-not-approved", "--serial", "SER1", "--ek", "rsa")
        )

    def test_attest_classWorkerG2_refused(self) -> Deferred[None]:
        """[T2] a worker-g2 device cannot attest: class-refused, journaled."""
        self.approve("old1", "SER9", cls="worker-g2")

        async def check() -> None:
            await self.refused("class-refused", "--serial", "SER9", "--ek", "rsa")
            (entry,) = self.server.entries("attest.refused")
            self.assertEqual(entry.device, "old1")

        return ensureDeferred(check())

    def test_attest_clonedTPMOtherSerial_refused(self) -> Deferred[None]:
        """[T3] a copy of an approved TPM's state, claiming another serial: refused."""
        self.approve("w1", "SER1")
        self.server.addDevice("w2", "SER2")
        twin = self.swtpm.clone(Path(self.mktemp()).resolve())
        twin.start()
        self.addCleanup(twin.stop)
        return ensureDeferred(
            self.refused(
                "serial-mismatch", "--serial", "SER2", "--ek", "rsa", tcti=twin.tcti
            )
        )

    def test_attest_untrustedManufacturer_refused(self) -> Deferred[None]:
        """[T3] an EK certificate from outside attest.ek_roots: ek-cert-untrusted."""
        self.approve("w1", "SER1")
        other = ensureDevPKI(Path(self.mktemp()), "localhost")
        from fleetd.attest.ekroots import EKRoots

        self.server.service.ekRoots = EKRoots.load(other.ek_roots)
        return ensureDeferred(
            self.refused("ek-cert-untrusted", "--serial", "SER1", "--ek", "rsa")
        )


class TPM12Tests(SWTPMTestCase):
    tpm2 = False

    def test_attest_tpm12_refused(self) -> Deferred[None]:
        """[T2] a TPM 1.2 (by version: it has an EK certificate too) cannot attest."""

        async def check() -> None:
            code, _, err = await self.agent("attest", "--serial", "SER1")
            self.assertEqual(code, 1)
            self.assertIn("refused: tpm12-unsupported: ", err)
            (entry,) = self.server.entries("attest.refused")
            self.assertEqual(entry.fields["reason"], "tpm12-unsupported")
            self.assertEqual(entry.fields["reported_serial"], "SER1")

        return ensureDeferred(check())
