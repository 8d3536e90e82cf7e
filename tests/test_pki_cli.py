"""
C{fleetd-pki} (L{fleetd.pki.cli}): the site's real PKI, made where the
config says, never over an existing file, and accepted by fleetd's own
loaders and owner check [O1] [T3] [T4].
"""

from __future__ import annotations

import contextlib
import io
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.attest.ekroots import EKRoots
from fleetd.config import ConfigError, loadSettings
from fleetd.pki.cli import main
from fleetd.pki.dev import DevPKIPaths, makeCertificate
from fleetd.service import prepare
from tests.daemonsupport import DaemonTestMixin, httpsJSON
from tests.support import writeConfig

REAL = {
    "owner": {
        "client_ca": "real/owner-ca.pem",
        "client_cert": "real/operators/alice.pem",
        "client_key": "real/operators/alice.key",
    },
    "pki": {
        "issuer_cert": "real/devid-issuer.pem",
        "issuer_key": "real/devid-issuer.key",
        "bundle": "real/folly-devid-ca.pem",
    },
    "attest": {"ek_roots": "real/ek-roots"},
}


def pki(config: Path, *argv: str) -> tuple[int, str, str]:
    """Run C{fleetd-pki --config CONFIG ARGV}: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--config", str(config), *argv])
    return code, out.getvalue(), err.getvalue()


def realConfig(test: SynchronousTestCase) -> tuple[Path, Path]:
    """A dev-style config whose owner, issuer and EK roots are real/'s."""
    directory = Path(test.mktemp()).resolve()
    return writeConfig(directory, REAL), directory / "real"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates(path.read_bytes())[0]


class OwnerCATests(SynchronousTestCase):
    def test_ownerCA_writesCertificateAndKey(self) -> None:
        """owner-ca writes owner.client_ca and its key (mode 0600) beside it."""
        config, real = realConfig(self)
        code, out, err = pki(config, "owner-ca")
        self.assertEqual((code, err), (0, ""))
        ca = cert(real / "owner-ca.pem")
        self.assertTrue(
            ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        )
        self.assertEqual(mode(real / "owner-ca.key"), 0o600)
        self.assertIn(f"wrote {real / 'owner-ca.key'} (private key, mode 0600)", out)

    def test_ownerCA_neverOverwritesWithoutForce(self) -> None:
        """A second owner-ca is refused and leaves the files; --force replaces."""
        config, real = realConfig(self)
        self.assertEqual(pki(config, "owner-ca")[0], 0)
        before = (real / "owner-ca.key").read_bytes()
        code, out, err = pki(config, "owner-ca")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("already exist", err)
        self.assertEqual((real / "owner-ca.key").read_bytes(), before)
        self.assertEqual(pki(config, "owner-ca", "--force")[0], 0)
        self.assertNotEqual((real / "owner-ca.key").read_bytes(), before)
        self.assertEqual(mode(real / "owner-ca.key"), 0o600)

    def test_ownerCA_notTheBundleFile(self) -> None:
        """[O1] An owner.client_ca that names the LDevID bundle is refused."""
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(
            directory, {**REAL, "owner": {"client_ca": "real/folly-devid-ca.pem"}}
        )
        code, _, err = pki(config, "owner-ca")
        self.assertEqual(code, 2)
        self.assertIn("owner.client_ca and pki.bundle are the same file", err)
        self.assertFalse((directory / "real" / "folly-devid-ca.pem").exists())


class OperatorTests(SynchronousTestCase):
    def test_operator_clientAuthFromOwnerCA(self) -> None:
        """[O1] operator NAME: CN NAME, clientAuth, no CA, issued by the owner CA."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        code, out, err = pki(config, "operator", "alice@folly.ops")
        self.assertEqual((code, err), (0, ""))
        leaf = cert(real / "operators" / "alice@folly.ops.pem")
        leaf.verify_directly_issued_by(cert(real / "owner-ca.pem"))
        cn = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        self.assertEqual(cn, "alice@folly.ops")
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        self.assertEqual(list(eku), [ExtendedKeyUsageOID.CLIENT_AUTH])
        basic = leaf.extensions.get_extension_for_class(x509.BasicConstraints).value
        self.assertFalse(basic.ca)
        self.assertEqual(mode(real / "operators" / "alice@folly.ops.key"), 0o600)
        self.assertIn("owner:alice@folly.ops", out)

    def test_operator_nameOutsideTheActorAlphabet(self) -> None:
        """
        A name that is not a usable owner name (the journal's actor) is
        refused with the rule, and nothing is written.
        """
        config, real = realConfig(self)
        pki(config, "owner-ca")
        for name in ("bob smith", "_bob", ".bob", "a" * 65, "bob:x", "bób", "bob/../x"):
            code, out, err = pki(config, "operator", name)
            self.assertEqual((code, out), (2, ""), name)
            self.assertIn("not a usable owner name (letters, digits, _ . @ -", err)
        self.assertFalse((real / "operators").exists())
        self.assertEqual(pki(config, "operator", "a" * 64)[0], 0)

    def test_operator_needsTheOwnerCA(self) -> None:
        """Without the owner CA and its key there is nothing to sign with."""
        config, _ = realConfig(self)
        code, _, err = pki(config, "operator", "alice")
        self.assertEqual(code, 2)
        self.assertIn("owner-ca.pem", err)

    def test_operator_caKeyOffline(self) -> None:
        """With the owner CA's key moved offline, --ca-key names where it is."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        offline = Path(self.mktemp())
        offline.mkdir()
        (real / "owner-ca.key").rename(offline / "owner-ca.key")
        code, _, err = pki(config, "operator", "alice")
        self.assertEqual(code, 2)
        self.assertIn("(offline? --ca-key FILE)", err)
        code, _, err = pki(
            config, "operator", "alice", "--ca-key", str(offline / "owner-ca.key")
        )
        self.assertEqual((code, err), (0, ""))

    def test_operator_neverOverwrites(self) -> None:
        """The same operator twice: refused, the first key kept."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        pki(config, "operator", "alice")
        before = (real / "operators" / "alice.key").read_bytes()
        self.assertEqual(pki(config, "operator", "alice")[0], 2)
        self.assertEqual((real / "operators" / "alice.key").read_bytes(), before)


class IssuerTests(SynchronousTestCase):
    def test_issuer_writesIssuerAndBundle(self) -> None:
        """[T4] issuer writes pki.issuer_* and adds the issuer to the bundle,
        keeping the legacy CAs already there."""
        config, real = realConfig(self)
        now = datetime.now(UTC)
        legacy = makeCertificate("capsule software CA", _rsa(), now)
        real.mkdir()
        (real / "folly-devid-ca.pem").write_bytes(legacy.public_bytes(_PEM))
        code, _, err = pki(config, "issuer")
        self.assertEqual((code, err), (0, ""))
        issuer = cert(real / "devid-issuer.pem")
        self.assertIn("test devid issuer", issuer.subject.rfc4514_string())
        bundle = x509.load_pem_x509_certificates(
            (real / "folly-devid-ca.pem").read_bytes()
        )
        self.assertEqual(bundle, [legacy, issuer])
        self.assertEqual(mode(real / "devid-issuer.key"), 0o600)
        self.assertEqual(pki(config, "issuer")[0], 2)  # never overwritten

    def test_issuer_refusedWithTheOwnerCAInTheBundle(self) -> None:
        """[O1] The owner CA found in the bundle: the issuer is not made."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        (real / "folly-devid-ca.pem").write_bytes((real / "owner-ca.pem").read_bytes())
        code, _, err = pki(config, "issuer")
        self.assertEqual(code, 2)
        self.assertIn("the owner CA is also pki.bundle", err)
        self.assertFalse((real / "devid-issuer.pem").exists())

    def test_operator_refusedWhenTheOwnerCAIsTheIssuer(self) -> None:
        """[O1] An owner CA that is also the issuer signs no operator."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        for suffix in ("pem", "key"):
            data = (real / f"owner-ca.{suffix}").read_bytes()
            (real / f"devid-issuer.{suffix}").write_bytes(data)
        code, _, err = pki(config, "operator", "alice")
        self.assertEqual(code, 2)
        self.assertIn("the owner CA is also in pki.issuer_cert", err)


_PEM = serialization.Encoding.PEM


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def vendorFiles(directory: Path) -> dict[str, Path]:
    """A stand-in TPM vendor: a DER root, a PEM intermediate, an EK leaf."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    rootKey, interKey = _rsa(), _rsa()
    root = makeCertificate("Vendor EK Root CA", rootKey, now)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Vendor EK Int CA")])
    inter = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(root.subject)
        .public_key(interKey.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(interKey.public_key()), False
        )
        .sign(rootKey, hashes.SHA256())
    )
    ek = makeCertificate("ek", _rsa(), now, (inter, interKey))
    old = makeCertificate("Old Vendor Root", _rsa(), now - timedelta(days=4000))
    files = {
        "root": (directory / "root.cer", root.public_bytes(serialization.Encoding.DER)),
        "inter": (directory / "inter.pem", inter.public_bytes(_PEM)),
        "ek": (directory / "ek.pem", ek.public_bytes(_PEM)),
        "expired": (directory / "old.pem", old.public_bytes(_PEM)),
    }
    for path, data in files.values():
        path.write_bytes(data)
    return {key: path for key, (path, _) in files.items()}


class EKRootsTests(SynchronousTestCase):
    def test_import_byteForByteAndOnce(self) -> None:
        """
        [T3] ek-roots import copies a vendor's DER root and PEM intermediate
        into attest.ek_roots unchanged (the same DER), once; fleetd's loader
        reads both.
        """
        config, real = realConfig(self)
        vendor = vendorFiles(Path(self.mktemp()))
        code, out, err = pki(
            config, "ek-roots", "import", str(vendor["root"]), str(vendor["inter"])
        )
        self.assertEqual((code, err), (0, ""), out)
        self.assertIn("[root (anchor)", out)
        self.assertIn("[intermediate", out)
        written = sorted((real / "ek-roots").iterdir())
        self.assertEqual(len(written), 2)
        ders = {
            x509.load_pem_x509_certificate(p.read_bytes()).public_bytes(
                serialization.Encoding.DER
            )
            for p in written
        }
        self.assertIn(vendor["root"].read_bytes(), ders)
        loaded = EKRoots.load(real / "ek-roots")
        self.assertEqual((len(loaded), len(loaded._intermediates)), (1, 1))
        code, out, _ = pki(config, "ek-roots", "import", str(vendor["root"]))
        self.assertEqual(code, 0)
        self.assertIn("already there", out)
        self.assertEqual(len(list((real / "ek-roots").iterdir())), 2)

    def test_import_refusesLeafAndExpired(self) -> None:
        """An EK certificate itself, or an expired root, is not imported."""
        config, real = realConfig(self)
        vendor = vendorFiles(Path(self.mktemp()))
        code, _, err = pki(
            config, "ek-roots", "import", str(vendor["root"]), str(vendor["ek"])
        )
        self.assertEqual(code, 2)
        self.assertIn("is not a CA certificate", err)
        self.assertFalse((real / "ek-roots").exists())
        code, _, err = pki(config, "ek-roots", "import", str(vendor["expired"]))
        self.assertEqual(code, 2)
        self.assertIn("expired", err)
        self.assertEqual(
            pki(config, "ek-roots", "import", "--force", str(vendor["expired"]))[0], 0
        )

    def test_import_intoOneFile(self) -> None:
        """attest.ek_roots naming a .pem file: the certificates are appended."""
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory, {**REAL, "attest": {"ek_roots": "ek.pem"}})
        vendor = vendorFiles(Path(self.mktemp()))
        self.assertEqual(pki(config, "ek-roots", "import", str(vendor["root"]))[0], 0)
        self.assertEqual(pki(config, "ek-roots", "import", str(vendor["inter"]))[0], 0)
        loaded = EKRoots.load(directory / "ek.pem")
        self.assertEqual((len(loaded), len(loaded._intermediates)), (1, 1))


class AcceptedByFleetdTests(DaemonTestMixin, TestCase):
    timeout = 60

    async def test_daemon_acceptsWhatTheToolMade(self) -> None:
        """
        [O1] [T4] A daemon starts on the owner CA, issuer, bundle and EK roots
        fleetd-pki made (prepare() checks them as at every start), and the
        operator's certificate is an owner named by its CN.
        """
        config, real = realConfig(self)
        vendor = vendorFiles(Path(self.mktemp()))
        for argv in (
            ("owner-ca",),
            ("operator", "alice"),
            ("issuer",),
            ("ek-roots", "import", str(vendor["root"]), str(vendor["inter"])),
        ):
            code, _out, err = pki(config, *argv)
            self.assertEqual((code, err), (0, ""), argv)
        self.directory = config.parent
        self.settings = loadSettings(config)
        self.pki = DevPKIPaths.inside(self.directory / "pki")
        service = self.startDaemon()
        alice = (real / "operators" / "alice.pem", real / "operators" / "alice.key")
        status, body = await deferToThread(
            httpsJSON, self.port(service, "admin"), "GET", "/v1/admin/whoami",
            self.pki.public_ca, alice, None,
        )  # fmt: skip
        self.assertEqual((status, body), (200, {"owner": "alice", "role": "owner"}))

    def test_prepare_refusesTheOwnerCAAsIssuer(self) -> None:
        """[O1] The mistake the tool refuses is one fleetd refuses too."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        pki(config, "issuer")
        (real / "folly-devid-ca.pem").write_bytes(
            (real / "folly-devid-ca.pem").read_bytes()
            + (real / "owner-ca.pem").read_bytes()
        )
        error = self.assertRaises(ConfigError, prepare, loadSettings(config))
        self.assertIn("owner.client_ca", str(error))
