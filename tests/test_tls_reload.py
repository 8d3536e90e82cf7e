"""
SIGHUP reloads the public certificate and key of every TLS listener
(issue 19, item 3: renewing the public certificate without a restart).
"""

from __future__ import annotations

import datetime
import hashlib
import socket
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.pki.dev import DevPKIPaths, makeCertificate
from tests.daemonsupport import DeliveryMixin

TLS_LISTENERS = ("boot", "device", "admin", "tink")
ENROLLMENT = "enroll.lolwtf.ca"  # tests.support's topology


def presented(port: int) -> str:
    """The SHA-256 of the certificate a listener presents (no verification)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def renewedBy(pki: DevPKIPaths, cert: Path, key: Path) -> str:
    """
    Write a new leaf from the dev public CA (as an ACME client renewing it
    would: a new key too) over C{cert} and C{key}; its SHA-256.
    """
    caKey = serialization.load_pem_private_key(pki.public_ca_key.read_bytes(), None)
    assert isinstance(caKey, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    ca = x509.load_pem_x509_certificate(pki.public_ca.read_bytes())
    private = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName("localhost"), x509.DNSName(ENROLLMENT)]
    now = datetime.datetime.now(datetime.UTC)
    leaf = makeCertificate(
        "renewed", private, now, (ca, caKey), ExtendedKeyUsageOID.SERVER_AUTH, sans
    )
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    return leaf.fingerprint(hashes.SHA256()).hex()


class ReloadTests(DeliveryMixin, TestCase):
    timeout = 60

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        return self.startLoaded()

    async def fingerprints(self) -> dict[str, str]:
        found = {}
        for name in TLS_LISTENERS:
            found[name] = await deferToThread(presented, self.port(self.service, name))
        return found

    async def test_reload_newCertificateOnEveryListener(self) -> None:
        """After a reload every TLS listener presents the renewed certificate
        to new connections, and the reload is logged and journaled."""
        before = await self.fingerprints()
        self.assertEqual(len(set(before.values())), 1)
        tls = self.service.settings.tls
        renewed = renewedBy(self.pki, tls.cert, tls.key)
        logged = self.captureLogs()
        self.service.reload()
        after = await self.fingerprints()
        self.assertEqual(after, {name: renewed for name in TLS_LISTENERS})
        (line,) = [e for e in logged if e.get("log_format", "").startswith("tls.rel")]
        self.assertEqual(line["sha256"], renewed)
        entries = await self.journal()
        reloaded = [e for e in entries if e["event"] == "tls.reloaded"]
        self.assertEqual(len(reloaded), 1)
        self.assertEqual(reloaded[0]["fields"]["sha256"], renewed)
        self.assertEqual(reloaded[0]["fields"]["listeners"], ",".join(TLS_LISTENERS))

    async def test_reload_keyDoesNotMatch_nothingChanges(self) -> None:
        """A certificate whose key does not match leaves every listener on
        the certificate it had, with one line saying why."""
        before = await self.fingerprints()
        tls = self.service.settings.tls
        keep = tls.key.read_bytes()
        renewedBy(self.pki, tls.cert, tls.key)
        tls.key.write_bytes(keep)  # the old key beside the new certificate
        logged = self.captureLogs()
        self.service.reload()
        self.assertEqual(await self.fingerprints(), before)
        failed: list[Any] = [
            e for e in logged if e.get("log_format") == "tls.reload.failed {error}"
        ]
        self.assertEqual(len(failed), 1)
        self.assertIn("tls.key", failed[0]["error"])
        self.assertIn("does not match", failed[0]["error"])
