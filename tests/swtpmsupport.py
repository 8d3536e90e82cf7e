"""
Cases over a real swtpm: one manufactured swtpm and dev PKI per class
behind an attestation listener (L{SWTPMTestCase}) or a whole daemon with
tpm2-abrmd (L{TPMKeyDaemonCase}); the agent run in-process, its steps one
at a time (L{Node}), and software LDevIDs from a bundle CA.
"""

from __future__ import annotations

import atexit
import base64
import io
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.agent import main as agent
from fleetd.agent import tpm
from fleetd.agent.client import call, tlsContext
from fleetd.attest.tpm import canonicalSPKI, ekDigest
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from tests.attestserver import AttestServer
from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import fleetctlAgainst
from tests.softtpm import b64
from tests.support import TOPOLOGY, missingPeer
from tests.swtpm import AVAILABLE, RM_AVAILABLE, SWTPM, ResourceManager


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


class Node:
    """The agent's steps, one at a time, so a test can bend the proof."""

    def __init__(self, case: SWTPMTestCase) -> None:
        self.case = case
        self.context = tlsContext(str(case.pki.public_ca))

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return call(self.case.url, path, self.context, body)

    def begin(self, serial: str) -> tuple[tpm.Keys, dict[str, Any]]:
        ectx = tpm.openTPM(self.case.swtpm.tcti)
        try:
            keys = tpm.createKeys(ectx, "rsa")
        finally:
            ectx.close()
        challenge = self.post(
            "/v1/attest/challenge",
            {
                "tpm_version": "2.0",
                "serial": serial,
                "ek_cert": b64(keys.ekCert),
                "ek_public": b64(keys.ekPublic.marshal()),
                "ak_public": b64(keys.akPublic.marshal()),
            },
        )
        return keys, challenge

    def proof(
        self,
        keys: tpm.Keys,
        challenge: dict[str, Any],
        *,
        nonce: bytes | None = None,
        subject: str = "SER1",
    ) -> dict[str, Any]:
        ectx = tpm.openTPM(self.case.swtpm.tcti)
        try:
            secret = tpm.activate(
                ectx,
                keys,
                base64.b64decode(challenge["credential_blob"]),
                base64.b64decode(challenge["encrypted_secret"]),
            )
            info, signature, csr = tpm.certifyAndCSR(
                ectx,
                keys,
                base64.b64decode(challenge["nonce"]) if nonce is None else nonce,
                subject,
            )
        finally:
            ectx.close()
        return {
            "challenge": challenge["challenge"],
            "secret": b64(secret),
            "ldevid_public": b64(keys.ldevidPublic.marshal()),
            "certify_info": b64(info),
            "certify_signature": b64(signature),
            "csr": csr.decode("ascii"),
        }

    def otherKey(self, keys: tpm.Keys) -> tpm.Keys:
        """The same TPM's keys with a fresh LDevID key."""
        ectx = tpm.openTPM(self.case.swtpm.tcti)
        try:
            fresh = tpm.createKeys(ectx, "rsa")
        finally:
            ectx.close()
        keys2 = tpm.Keys(**vars(keys))
        keys2.ldevidPrivate, keys2.ldevidPublic = (
            fresh.ldevidPrivate,
            fresh.ldevidPublic,
        )
        return keys2


def issueWith(
    caCert: Path,
    caKey: Path,
    device: str,
    serial: str,
    *,
    expired: bool = False,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[bytes, bytes]:
    """A software LDevID (certificate PEM, key PEM) signed by a bundle CA."""
    ca = x509.load_pem_x509_certificate(caCert.read_bytes())
    signer: Any = serialization.load_pem_private_key(caKey.read_bytes(), None)
    key = key or ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    start, end = (now - timedelta(days=30), now - timedelta(days=1)) if expired else (
        now - timedelta(hours=1), now + timedelta(days=30))  # fmt: skip
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, device),
            x509.NameAttribute(NameOID.SERIAL_NUMBER, serial),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(False, None), True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        .sign(signer, hashes.SHA256())
    )
    keyPEM = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), keyPEM


def runAgent(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = agent.main(argv, err, out)
    return code, out.getvalue(), err.getvalue()


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
        code, out, err = await fleetctlAgainst(self.config, *words)
        self.assertEqual(code, 0, err)
        return str(out)

    async def _start(self, approve: bool = True) -> None:
        self.service, fleetctl = await self.startWithDevice(serial="SER1")
        self.url = f"https://localhost:{self.port(self.service, 'device')}"
        self.config = str(fleetctl.config)
        if not approve:
            return
        der = self.swtpm.ekCertificates()["ek-rsa2048.crt"]
        await self.fleetctl("evidence", "add", "--serial", "SER1",
                            "--ek-sha256", ekDigestOf(der),
                            "--kind", "receiving-scan", "--ref", "scan-1")  # fmt: skip
        await self.fleetctl("binding", "approve", "SER1")
