"""
When fleetd's certificates expire (issue 27, item 8):
C{fleetd_certificate_not_after_seconds} for the chain every TLS listener
serves, the CAs it verifies clients with, the LDevID issuer and the files
fleetd verifies its peers with; read at each scrape, so a SIGHUP reload
shows at once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.certexpiry import CertificateExpiry, Watched, readCertificates, subjectOf
from fleetd.config import TLSFiles, loadSettings
from fleetd.listen.expiry import listenerCertificates
from fleetd.listen.policy import ListenerName, listenerPolicy
from fleetd.listen.service import Listeners
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI, makeCertificate
from fleetd.prepare import prepare
from fleetd.reactors import IListenerReactor
from tests.daemonsupport import DeliveryMixin
from tests.support import writeConfig

NOW = datetime(2027, 3, 1, tzinfo=UTC)
ENROLLMENT = "enroll.lolwtf.ca"  # tests.support's topology
TLS_LISTENERS: tuple[ListenerName, ...] = ("boot", "device", "admin", "tink")


def certificate(cn: str, days: int, issuer: Any = None) -> tuple[x509.Certificate, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    eku = None if issuer is None else ExtendedKeyUsageOID.SERVER_AUTH
    sans = [] if issuer is None else [x509.DNSName("localhost")]
    cert = makeCertificate(cn, key, NOW, issuer, eku, sans, timedelta(days=days))
    return cert, key


def pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def keyPEM(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def gauge(text: str) -> dict[tuple[str, str, str, str], float]:
    """The gauge's samples in a scrape, by (certificate, listener, index, subject)."""
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name != "fleetd_certificate_not_after_seconds":
            continue
        for s in family.samples:
            labels = s.labels
            key = (
                labels["certificate"],
                labels.get("listener", ""),
                labels["index"],
                labels["subject"],
            )
            found[key] = s.value
    return found


class CollectorTests(SynchronousTestCase):
    """L{CertificateExpiry}: one series per certificate, bounded labels."""

    def test_oneSeriesPerCertificate_notAfterAsUnixTime(self) -> None:
        """Each watched certificate is a series: its key, listener, place, CN."""
        root, rootKey = certificate("Site Root", 3650)
        leaf, _ = certificate("enroll.example", 90, (root, rootKey))
        other, _ = certificate("Other CA", 30)
        registry = CollectorRegistry()
        registry.register(
            CertificateExpiry(
                lambda: [
                    Watched("tls.cert", "boot", (leaf,)),
                    Watched("pki.bundle", "device", (root, other)),
                ]
            )
        )

        def value(*labels: str) -> float | None:
            names = ("certificate", "listener", "index", "subject")
            return registry.get_sample_value(
                "fleetd_certificate_not_after_seconds",
                dict(zip(names, labels, strict=True)),
            )

        day = 86400.0
        at = NOW.timestamp()
        self.assertEqual(
            value("tls.cert", "boot", "0", "enroll.example"), at + 90 * day
        )
        self.assertEqual(
            value("pki.bundle", "device", "0", "Site Root"), at + 3650 * day
        )
        self.assertEqual(value("pki.bundle", "device", "1", "Other CA"), at + 30 * day)

    def test_readAtEachScrape(self) -> None:
        """The sources are asked at every scrape: a new certificate shows at once."""
        first, _ = certificate("a", 10)
        second, _ = certificate("a", 20)
        current = [first]
        registry = CollectorRegistry()
        registry.register(
            CertificateExpiry(lambda: [Watched("tls.cert", "boot", (current[0],))])
        )
        labels = {"certificate": "tls.cert", "listener": "boot", "index": "0"}
        labels["subject"] = "a"
        name = "fleetd_certificate_not_after_seconds"
        self.assertEqual(
            registry.get_sample_value(name, labels),
            first.not_valid_after_utc.timestamp(),
        )
        current[0] = second
        self.assertEqual(
            registry.get_sample_value(name, labels),
            second.not_valid_after_utc.timestamp(),
        )

    def test_subject_commonNameElseWholeSubject_cut(self) -> None:
        """The subject label is the CN, else the whole subject, at most 64 long."""
        cert, _ = certificate("Forge CA", 1)
        self.assertEqual(subjectOf(cert), "Forge CA")

        def withoutCN(*attributes: x509.NameAttribute[str]) -> x509.Certificate:
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name(list(attributes))
            return (
                x509.CertificateBuilder()
                .subject_name(name)
                .issuer_name(name)
                .public_key(key.public_key())
                .serial_number(1)
                .not_valid_before(NOW)
                .not_valid_after(NOW + timedelta(days=1))
                .sign(key, hashes.SHA256())
            )

        forge = x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Forge")
        self.assertEqual(subjectOf(withoutCN(forge)), "O=Forge")
        unit = x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "u" * 64)
        self.assertEqual(subjectOf(withoutCN(forge, unit)), ("OU=" + "u" * 64)[:64])


class ReadCertificatesTests(SynchronousTestCase):
    def test_every_orFirst_orNoneWhenUnreadable(self) -> None:
        """
        readCertificates gives a file's certificates (the first only where
        fleetd's loader reads only that), none for a missing or bad file.
        """
        a, _ = certificate("a", 1)
        b, _ = certificate("b", 2)
        path = Path(self.mktemp())
        path.write_bytes(pem(a, b))
        self.assertEqual(readCertificates(path), (a, b))
        self.assertEqual(readCertificates(path, first=True), (a,))
        self.assertEqual(readCertificates(path.with_name("missing")), ())
        path.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
        self.assertEqual(readCertificates(path), ())


class ListenerCertificatesTests(SynchronousTestCase):
    """What each listener serves and trusts, read from its TLS options."""

    def test_servedChain_andClientCAs(self) -> None:
        """
        Each listener's served chain: tls.cert, then the tls.chain
        certificates it sends (the self-signed root is never sent, so not
        watched); the device listener's pki.bundle and the admin listener's
        owner.client_ca.
        """
        directory = Path(self.mktemp()).resolve()
        settings = loadSettings(writeConfig(directory))
        pki = ensureDevPKI(settings.tls.cert.parent, ENROLLMENT)
        root, rootKey = certificate("Site Root", 3650)
        middle, middleKey = certificate("Site Intermediate", 1000, (root, rootKey))
        leaf, leafKey = certificate("enroll.lolwtf.ca", 90, (middle, middleKey))
        files = TLSFiles(
            directory / "leaf.pem", directory / "leaf.key", directory / "chain.pem"
        )
        files.cert.write_bytes(pem(leaf))
        files.key.write_bytes(keyPEM(leafKey))
        assert files.chain is not None
        files.chain.write_bytes(pem(middle, root))
        listeners = Listeners(
            cast(IListenerReactor, MemoryReactorClock()),
            CollectorRegistry(),
            maxConnections=8,
            maxPerSource=None,
            idleTimeout=30,
        )
        for name in TLS_LISTENERS:
            options = listenerPolicy(settings, name).tlsOptions(files)
            listeners.add(name, "tcp:0", options, Factory())
        watched = {
            (w.certificate, w.listener): w.certs
            for w in listenerCertificates(listeners, settings)
        }
        bundle = tuple(readCertificates(pki.bundle))
        owner = tuple(readCertificates(pki.owner_ca))
        expected: dict[tuple[str, str], tuple[x509.Certificate, ...]] = {}
        for name in TLS_LISTENERS:
            expected[("tls.cert", name)] = (leaf,)
            expected[("tls.chain", name)] = (middle,)
        expected[("pki.bundle", "device")] = bundle
        expected[("owner.client_ca", "admin")] = owner
        self.assertEqual(watched, expected)
        self.assertTrue(bundle and owner)


class ReadAtStartTests(SynchronousTestCase):
    """The certificates fleetd reads once: the issuer, its peers' CAs."""

    def test_issuerAndPeers(self) -> None:
        """
        prepare() reads the LDevID issuer, and the files fleetd verifies its
        peers with or presents to them, as fleetd's own loaders read them.
        """
        directory = Path(self.mktemp()).resolve()
        kubeCA, _ = certificate("kube CA", 3650)
        kubeOther, _ = certificate("kube CA next", 3650)
        client, clientKey = certificate("fleetd", 365)
        netboxCA, _ = certificate("NetBox CA", 700)
        netboxOld, _ = certificate("NetBox CA old", 20)
        tinkCA, _ = certificate("tink CA", 400)
        directory.mkdir(parents=True)
        for name, body in (
            ("kube-ca.pem", pem(kubeCA, kubeOther)),
            ("kube-client.pem", pem(client)),
            ("kube-client.key", keyPEM(clientKey)),
            ("netbox-ca.pem", pem(netboxCA, netboxOld)),
            ("netbox-token", b"nbt_fleetd01.s3cret"),
            ("tink-ca.pem", pem(tinkCA)),
        ):
            (directory / name).write_bytes(body)
        settings = loadSettings(
            writeConfig(
                directory,
                {
                    "kubernetes": {
                        "api": "https://127.0.0.1:6443",
                        "ca": "kube-ca.pem",
                        "client_cert": "kube-client.pem",
                        "client_key": "kube-client.key",
                    },
                    "netbox": {
                        "url": "https://netbox.example/",
                        "token_file": "netbox-token",
                        "ca": "netbox-ca.pem",
                    },
                    "tink": {
                        "upstream": "tls:127.0.0.1:1",
                        "upstream_ca": "tink-ca.pem",
                    },
                },
            )
        )
        prepared = prepare(settings)
        self.addCleanup(prepared.vault.close)
        self.addCleanup(prepared.database.close)
        read = {(w.certificate, w.listener): w.certs for w in prepared.certificates}
        self.assertEqual(
            read,
            {
                ("pki.issuer_cert", ""): (prepared.issuer.cert,),
                ("kubernetes.ca", ""): (kubeCA,),
                ("kubernetes.client_cert", ""): (client,),
                ("netbox.ca", ""): (netboxCA, netboxOld),
                ("tink.upstream_ca", ""): (tinkCA,),
            },
        )


def renewed(pki: DevPKIPaths, cert: Path, key: Path, days: int) -> x509.Certificate:
    """A new public leaf from the dev public CA, valid C{days}, over the files."""
    caKey = serialization.load_pem_private_key(pki.public_ca_key.read_bytes(), None)
    assert isinstance(caKey, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    ca = x509.load_pem_x509_certificate(pki.public_ca.read_bytes())
    private = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName("localhost"), x509.DNSName(ENROLLMENT)]
    leaf = makeCertificate(
        "renewed",
        private,
        datetime.now(UTC),
        (ca, caKey),
        ExtendedKeyUsageOID.SERVER_AUTH,
        sans,
        timedelta(days=days),
    )
    key.write_bytes(keyPEM(private))
    cert.write_bytes(pem(leaf))
    return leaf


class DaemonCertificateTests(DeliveryMixin, TestCase):
    """The gauge as a running fleetd exports it, before and after a reload."""

    timeout = 60

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        return self.startLoaded()

    async def scrape(self) -> dict[tuple[str, str, str, str], float]:
        _, _, body = await self.get(self.service, "admin", "/metrics")
        return gauge(body.decode())

    async def test_daemon_everyCertificate_followsReload(self) -> None:
        """
        A running fleetd exports the notAfter of the public certificate on
        every TLS listener, of the LDevID bundle (device) and owner CA
        (admin) it asks clients for, and of the LDevID issuer; after a
        SIGHUP reload the listeners' series show the renewed certificate.
        """
        pki = self.pki
        leaf = x509.load_pem_x509_certificate(pki.public_cert.read_bytes())
        issuer = x509.load_pem_x509_certificate(pki.devid_issuer.read_bytes())
        found = await self.scrape()
        cn = subjectOf(leaf)
        for name in TLS_LISTENERS:
            self.assertEqual(
                found.pop(("tls.cert", name, "0", cn)),
                leaf.not_valid_after_utc.timestamp(),
            )
        self.assertEqual(
            found.pop(("pki.issuer_cert", "", "0", subjectOf(issuer))),
            issuer.not_valid_after_utc.timestamp(),
        )
        expected = {}
        for key, listener, path in (
            ("pki.bundle", "device", pki.bundle),
            ("owner.client_ca", "admin", pki.owner_ca),
        ):
            for index, cert in enumerate(readCertificates(path)):
                where = (key, listener, str(index), subjectOf(cert))
                expected[where] = cert.not_valid_after_utc.timestamp()
        # The dev tls.chain is the self-signed public CA alone: never sent.
        self.assertEqual(found, expected)
        tls = self.service.settings.tls
        new = renewed(pki, tls.cert, tls.key, days=20)
        self.service.reload()
        after = await self.scrape()
        for name in TLS_LISTENERS:
            self.assertNotIn(("tls.cert", name, "0", cn), after)
            self.assertEqual(
                after[("tls.cert", name, "0", "renewed")],
                new.not_valid_after_utc.timestamp(),
            )
