"""Tests for L{fleetd.pki.dev} and L{fleetd.pki.devcli}: the development PKI
and C{fleetd-devpki}."""

# trial's assertions, mktemp and patch carry no annotations.
# mypy: allow-untyped-calls

from __future__ import annotations

import io
import ipaddress
import json
import os
import shutil
import stat
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from OpenSSL import SSL, crypto
from service_identity import VerificationError as ServiceIdentityError
from service_identity.cryptography import (
    verify_certificate_hostname,
    verify_certificate_ip_address,
)
from twisted.internet.ssl import PrivateCertificate
from twisted.trial.unittest import SynchronousTestCase

from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from fleetd.pki.devcli import main

NAME = "enroll.lolwtf.ca"
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
_E = TypeVar("_E", bound=x509.ExtensionType)
CONF = Path(__file__).resolve().parent.parent / "conf"

# Built in two parts so no line here looks like a committed key.
PKCS8_HEADER = b"-----BEGIN " + b"PRIVATE KEY-----\n"


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def commonName(cert: x509.Certificate) -> str:
    value = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert isinstance(value, str)
    return value


def ext(cert: x509.Certificate, kind: type[_E]) -> x509.Extension[_E]:
    return cert.extensions.get_extension_for_class(kind)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def snapshot(paths: DevPKIPaths) -> dict[Path, tuple[bytes, int]]:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths.files()}


def serverVerify(
    caPath: Path, leafPath: Path, subject: x509.DNSName | x509.IPAddress
) -> None:
    """Chain C{leafPath} to C{caPath} as a TLS client would, at a fixed time."""
    verifier = (
        PolicyBuilder()
        .store(Store([load(caPath)]))
        .time(NOW + timedelta(days=30))
        .build_server_verifier(subject)
    )
    verifier.verify(load(leafPath), [])


def acceptedByTwisted(testCase: SynchronousTestCase, cert: Path, key: Path) -> None:
    """Twisted and pyOpenSSL load the pair and agree the key matches."""
    certPEM, keyPEM = cert.read_bytes(), key.read_bytes()
    loaded = crypto.load_certificate(crypto.FILETYPE_PEM, certPEM)
    testCase.assertEqual(loaded.to_cryptography(), load(cert))
    private = PrivateCertificate.loadPEM(keyPEM + certPEM)
    testCase.assertEqual(private.original.to_cryptography(), load(cert))
    context = SSL.Context(SSL.TLS_METHOD)
    context.use_certificate(private.original.to_cryptography())
    context.use_privatekey(private.privateKey.original.to_cryptography_key())
    context.check_privatekey()


class EnsureDevPKITests(SynchronousTestCase):
    """The generated files, their modes, and regeneration rules."""

    def setUp(self) -> None:
        self.directory = Path(self.mktemp()) / "state" / "pki"
        self.paths = ensureDevPKI(self.directory, NAME, now=NOW)

    def test_ensure_writesEveryFile(self) -> None:
        """Every file of the set is written under the standard names."""
        self.assertEqual(self.paths, DevPKIPaths.inside(self.directory))
        self.assertEqual(len(self.paths.files()), 17)
        names = sorted(p.name for p in self.directory.iterdir())
        top = [p.name for p in self.paths.files() if p.parent == self.directory]
        expected = sorted([*top, "ek-roots"])
        self.assertEqual(names, expected)
        self.assertTrue(self.paths.complete())

    def test_ensure_modes(self) -> None:
        """Keys are 0600, certificates 0644, the directories 0700."""
        self.assertEqual(mode(self.directory), 0o700)
        self.assertEqual(mode(self.paths.ek_roots), 0o700)
        for p in self.paths.files():
            self.assertEqual(mode(p), 0o600 if p.suffix == ".key" else 0o644, p)

    def test_ensure_modesDespiteUmask(self) -> None:
        """A restrictive umask still yields world-readable certificates."""
        old = os.umask(0o077)
        try:
            paths = ensureDevPKI(Path(self.mktemp()), NAME, now=NOW)
        finally:
            os.umask(old)
        self.assertEqual(mode(paths.public_cert), 0o644)
        self.assertEqual(mode(paths.public_key), 0o600)

    def test_ensure_ekRootsHoldDevManufacturer(self) -> None:
        """ek-roots holds only the dev TPM manufacturer CA (RSA), its key is outside."""
        self.assertTrue(self.paths.ek_roots.is_dir())
        self.assertEqual(list(self.paths.ek_roots.iterdir()), [self.paths.ek_ca])
        self.assertEqual(self.paths.ek_ca_key.parent, self.directory)
        self.assertIsInstance(load(self.paths.ek_ca).public_key(), rsa.RSAPublicKey)

    def test_ensure_noTemporariesLeft(self) -> None:
        """Atomic writes leave no temporary files behind."""
        self.assertEqual(list(self.directory.glob(".*")), [])

    def test_keys_pkcs8Unencrypted(self) -> None:
        """Private keys are unencrypted PKCS8 PEM, ECDSA P-256 by default
        (the dev TPM manufacturer's is RSA: swtpm_localca signs with it)."""
        for p in self.paths.files():
            if p.suffix != ".key":
                continue
            data = p.read_bytes()
            self.assertTrue(data.startswith(PKCS8_HEADER), p)
            key = serialization.load_pem_private_key(data, password=None)
            if p == self.paths.ek_ca_key:
                self.assertIsInstance(key, rsa.RSAPrivateKey)
                continue
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            self.assertIsInstance(key.curve, ec.SECP256R1)

    def test_ensure_idempotent(self) -> None:
        """A second call on a complete set changes no file."""
        before = snapshot(self.paths)
        again = ensureDevPKI(self.directory, "other.example", now=NOW + timedelta(1))
        self.assertEqual(again, self.paths)
        self.assertEqual(snapshot(self.paths), before)

    def test_ensure_partialRegenerated(self) -> None:
        """A missing file makes the whole set new and consistent again."""
        before = snapshot(self.paths)
        self.paths.forge_ca_key.unlink()
        (self.directory / ".public.pem.dead.tmp").write_bytes(b"crash")
        ensureDevPKI(self.directory, NAME, now=NOW)
        self.assertTrue(self.paths.complete())
        after = snapshot(self.paths)
        for p in self.paths.files():
            if p != self.paths.forge_ca_key:
                self.assertNotEqual(after[p][0], before[p][0], p)
        serverVerify(self.paths.public_ca, self.paths.public_cert, x509.DNSName(NAME))
        self.assertEqual(list(self.directory.glob(".*")), [])

    def test_ensure_recreatesWithoutEkRoots(self) -> None:
        """A deleted ek-roots directory (it holds the dev EK CA) regenerates the set."""
        before = snapshot(self.paths)
        shutil.rmtree(self.paths.ek_roots)
        ensureDevPKI(self.directory, NAME, now=NOW)
        self.assertTrue(self.paths.ek_ca.is_file())
        after = snapshot(self.paths)
        self.assertNotEqual(after[self.paths.ek_ca], before[self.paths.ek_ca])

    def test_ensure_badArguments(self) -> None:
        """An unknown key type or an unusable name is refused before writing."""
        target = Path(self.mktemp())
        self.assertRaises(ValueError, ensureDevPKI, target, NAME, keyType="dsa")
        self.assertRaises(ValueError, ensureDevPKI, target, "", now=NOW)
        self.assertRaises(ValueError, ensureDevPKI, target, "a b.example", now=NOW)
        self.assertFalse(target.exists())


class CertificateTests(SynchronousTestCase):
    """The contents of the CAs and leaves."""

    keyType = "ecdsa"

    def setUp(self) -> None:
        self.paths = ensureDevPKI(
            Path(self.mktemp()), NAME, now=NOW, keyType=self.keyType
        )

    def test_cas_extensionsAndNames(self) -> None:
        """Each CA is self-signed, ca=True critical, signs certificates and CRLs."""
        expected = {
            self.paths.public_ca: "fleetd dev public CA",
            self.paths.devid_issuer: "folly devid issuer (dev)",
            self.paths.capsule_ca: "capsule software CA (dev)",
            self.paths.forge_ca: "forge software CA (dev)",
            self.paths.owner_ca: "fleetd dev owner CA",
        }
        for path, cn in expected.items():
            cert = load(path)
            self.assertEqual(commonName(cert), cn)
            self.assertEqual(cert.issuer, cert.subject)
            cert.verify_directly_issued_by(cert)
            bc = ext(cert, x509.BasicConstraints)
            self.assertTrue(bc.critical)
            self.assertTrue(bc.value.ca)
            self.assertIn(bc.value.path_length, (0, None))
            ku = ext(cert, x509.KeyUsage)
            self.assertTrue(ku.critical)
            self.assertTrue(ku.value.key_cert_sign and ku.value.crl_sign)
            self.assertFalse(ku.value.digital_signature)
            ext(cert, x509.SubjectKeyIdentifier)

    def test_validity_fromInjectedNow(self) -> None:
        """CAs last 10 years, leaves 1 year, all start an hour before now."""
        for path in (
            self.paths.public_ca,
            self.paths.devid_issuer,
            self.paths.owner_ca,
        ):
            cert = load(path)
            self.assertEqual(cert.not_valid_before_utc, NOW - timedelta(hours=1))
            self.assertEqual(cert.not_valid_after_utc, NOW + timedelta(days=3650))
        for path in (self.paths.public_cert, self.paths.owner_cert):
            cert = load(path)
            self.assertEqual(cert.not_valid_before_utc, NOW - timedelta(hours=1))
            self.assertEqual(cert.not_valid_after_utc, NOW + timedelta(days=365))

    def test_serials_distinct(self) -> None:
        """Every certificate has its own random serial."""
        certs = [p for p in self.paths.files() if p.suffix == ".pem"]
        certs.remove(self.paths.bundle)
        self.assertEqual(len({load(p).serial_number for p in certs}), 8)

    def test_public_sansAndUsage(self) -> None:
        """The public leaf names the enrollment name, localhost and loopback IPs."""
        cert = load(self.paths.public_cert)
        san = ext(cert, x509.SubjectAlternativeName).value
        self.assertEqual(san.get_values_for_type(x509.DNSName), [NAME, "localhost"])
        self.assertEqual(
            san.get_values_for_type(x509.IPAddress),
            [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")],
        )
        eku = ext(cert, x509.ExtendedKeyUsage).value
        self.assertEqual(list(eku), [ExtendedKeyUsageOID.SERVER_AUTH])
        bc = ext(cert, x509.BasicConstraints)
        self.assertTrue(bc.critical)
        self.assertFalse(bc.value.ca)
        ku = ext(cert, x509.KeyUsage).value
        self.assertTrue(ku.digital_signature)
        self.assertFalse(ku.key_cert_sign)
        self.assertEqual(ku.key_encipherment, self.keyType == "rsa")
        aki = ext(cert, x509.AuthorityKeyIdentifier).value
        ski = ext(load(self.paths.public_ca), x509.SubjectKeyIdentifier).value
        self.assertEqual(aki.key_identifier, ski.digest)

    def test_public_serviceIdentity(self) -> None:
        """[A5] service-identity accepts the leaf for the name and localhost only."""
        cert = load(self.paths.public_cert)
        verify_certificate_hostname(cert, NAME)
        verify_certificate_hostname(cert, "localhost")
        verify_certificate_ip_address(cert, "127.0.0.1")
        verify_certificate_ip_address(cert, "::1")
        self.assertRaises(
            ServiceIdentityError, verify_certificate_hostname, cert, "other.lolwtf.ca"
        )

    def test_public_chainsToPublicCA(self) -> None:
        """The public leaf verifies against public-ca for every name it covers."""
        for subject in (
            x509.DNSName(NAME),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ):
            serverVerify(self.paths.public_ca, self.paths.public_cert, subject)

    def test_public_notByOtherCA(self) -> None:
        """The public leaf does not chain to any other CA of the set."""
        self.assertRaises(
            VerificationError,
            serverVerify,
            self.paths.devid_issuer,
            self.paths.public_cert,
            x509.DNSName(NAME),
        )

    def test_bundle_threeIssuers(self) -> None:
        """[T4] the bundle holds the devid issuer, capsule and forge, in order."""
        bundle = x509.load_pem_x509_certificates(self.paths.bundle.read_bytes())
        self.assertEqual(len(bundle), 3)
        self.assertEqual(
            [commonName(c) for c in bundle],
            [
                "folly devid issuer (dev)",
                "capsule software CA (dev)",
                "forge software CA (dev)",
            ],
        )
        self.assertEqual(
            bundle,
            [
                load(self.paths.devid_issuer),
                load(self.paths.capsule_ca),
                load(self.paths.forge_ca),
            ],
        )

    def test_owner_clientCertificate(self) -> None:
        """The owner certificate is CN owner, clientAuth, issued by the owner CA."""
        cert = load(self.paths.owner_cert)
        self.assertEqual(commonName(cert), "owner")
        eku = ext(cert, x509.ExtendedKeyUsage).value
        self.assertEqual(list(eku), [ExtendedKeyUsageOID.CLIENT_AUTH])
        cert.verify_directly_issued_by(load(self.paths.owner_ca))
        store = crypto.X509Store()
        store.set_time(NOW + timedelta(days=30))
        store.add_cert(crypto.X509.from_cryptography(load(self.paths.owner_ca)))
        leaf = crypto.X509.from_cryptography(cert)
        crypto.X509StoreContext(store, leaf).verify_certificate()
        other = crypto.X509Store()
        other.set_time(NOW + timedelta(days=30))
        other.add_cert(crypto.X509.from_cryptography(load(self.paths.public_ca)))
        self.assertRaises(
            crypto.X509StoreContextError,
            crypto.X509StoreContext(other, leaf).verify_certificate,
        )

    def test_twisted_loadsPairs(self) -> None:
        """Twisted and pyOpenSSL accept the public and owner certificate+key."""
        acceptedByTwisted(self, self.paths.public_cert, self.paths.public_key)
        acceptedByTwisted(self, self.paths.owner_cert, self.paths.owner_key)


class RSACertificateTests(CertificateTests):
    """The same checks with RSA 2048 keys (ECDSA and RSA both accepted)."""

    keyType = "rsa"

    def test_keys_rsa2048(self) -> None:
        """Every key is RSA 2048 in unencrypted PKCS8 PEM."""
        for p in self.paths.files():
            if p.suffix == ".key":
                data = p.read_bytes()
                self.assertTrue(data.startswith(PKCS8_HEADER))
                key = serialization.load_pem_private_key(data, password=None)
                assert isinstance(key, rsa.RSAPrivateKey)
                self.assertEqual(key.key_size, 2048)


class MainTests(SynchronousTestCase):
    """The fleetd-devpki console script."""

    def setUp(self) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()
        self.patch(sys, "stdout", self.out)
        self.patch(sys, "stderr", self.err)
        self.root = Path(self.mktemp()).resolve()
        (self.root / "conf").mkdir(parents=True)
        (self.root / "conf" / "topo.json").write_text(
            json.dumps({"enrollment_name": NAME})
        )
        self.config = self.root / "conf" / "fleetd.toml"
        self.writeConfig('key = "../pki/public.key"\n')

    def writeConfig(self, tlsExtra: str = "") -> None:
        self.config.write_text(
            '[site]\ntopology = "topo.json"\n'
            f'[tls]\ncert = "../pki/public.pem"\n{tlsExtra}'
        )

    def test_main_createsThenReady(self) -> None:
        """One line on stdout, exit 0; paths relative to the config file."""
        self.assertEqual(main(["--config", str(self.config)]), 0)
        directory = self.root / "pki"
        self.assertEqual(self.out.getvalue(), f"dev PKI created in {directory}\n")
        self.assertEqual(self.err.getvalue(), "")
        paths = DevPKIPaths.inside(directory)
        self.assertTrue(paths.complete())
        san = ext(load(paths.public_cert), x509.SubjectAlternativeName).value
        self.assertIn(NAME, san.get_values_for_type(x509.DNSName))
        self.out.truncate(0)
        self.out.seek(0)
        self.assertEqual(main(["--config", str(self.config)]), 0)
        self.assertEqual(self.out.getvalue(), f"dev PKI ready in {directory}\n")

    def test_main_devConfigLayout(self) -> None:
        """conf/fleetd.dev.toml puts the set in .dev/state/pki under its names."""
        shutil.copy(CONF / "fleetd.dev.toml", self.root / "conf")
        shutil.copy(CONF / "anchor-topology.example.json", self.root / "conf")
        self.assertEqual(main(["--config", str(self.root / "conf/fleetd.dev.toml")]), 0)
        directory = self.root / ".dev" / "state" / "pki"
        self.assertEqual(self.out.getvalue(), f"dev PKI created in {directory}\n")
        self.assertTrue(DevPKIPaths.inside(directory).complete())

    def test_main_missingConfig(self) -> None:
        """A missing config file: one line on stderr, exit 2."""
        missing = self.root / "absent.toml"
        self.assertEqual(main(["--config", str(missing)]), 2)
        self.assertEqual(self.out.getvalue(), "")
        lines = self.err.getvalue().splitlines()
        self.assertEqual(len(lines), 1)
        self.assertIn(str(missing), lines[0])

    def test_main_usageError(self) -> None:
        """No --config: one line on stderr, exit 2."""
        self.assertEqual(main([]), 2)
        self.assertEqual(len(self.err.getvalue().splitlines()), 1)
        self.assertIn("--config", self.err.getvalue())

    def test_main_mismatchedPath(self) -> None:
        """A config path the dev PKI would not write is named and refused."""
        self.writeConfig('key = "../elsewhere/public.key"\n')
        self.assertEqual(main(["--config", str(self.config)]), 2)
        lines = self.err.getvalue().splitlines()
        self.assertEqual(len(lines), 1)
        self.assertIn("tls.key", lines[0])
        self.assertFalse((self.root / "pki").exists())

    def test_main_badTopology(self) -> None:
        """A topology without an enrollment name: one line naming the key, exit 2."""
        (self.root / "conf" / "topo.json").write_text("{}")
        self.assertEqual(main(["--config", str(self.config)]), 2)
        self.assertIn("enrollment_name", self.err.getvalue())
        self.assertEqual(len(self.err.getvalue().splitlines()), 1)
