"""
[O4] The operator's role, fixed in the certificate: how fleetd reads it
(L{fleetd.pki.owners.certificateRole}, through the owner check) and how
C{fleetd-pki operator --role} writes it.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.config import loadSettings
from fleetd.pki.dev import DevPKIPaths
from fleetd.pki.owners import (
    OWNER,
    READER,
    ROLE_ARC,
    certificateRole,
    rolePolicies,
)
from fleetd.web.owner import checkOwner, isOwner
from tests.daemonsupport import DaemonTestMixin, httpsJSON
from tests.ownersupport import CertTransport, PKIMixin, issue
from tests.test_pki_cli import cert, pki, realConfig, vendorFiles


class _Request:
    def __init__(self, leaf: x509.Certificate, ca: x509.Certificate) -> None:
        self.transport = CertTransport(leaf, ca)


def _policies(*dotted: str) -> x509.CertificatePolicies:
    return x509.CertificatePolicies(
        [x509.PolicyInformation(x509.ObjectIdentifier(d), None) for d in dotted]
    )


class CertificateRoleTests(PKIMixin, SynchronousTestCase):
    """What role a certificate from the owner CA carries [O4]."""

    def setUp(self) -> None:
        self.makePKI()
        self.ownerCA = x509.load_pem_x509_certificate(self.pki.owner_ca.read_bytes())

    def check(self, *extensions: x509.ExtensionType) -> tuple[str | None, str, str]:
        leaf, _, _ = issue(self.pki, "jane", extensions=extensions)
        checked = checkOwner(_Request(leaf, self.ownerCA))  # type: ignore[arg-type]
        return checked.owner, checked.role, checked.refusal

    def test_noRolePolicy_owner(self) -> None:
        """
        [O4] A certificate without a fleetd role (every owner certificate
        issued before roles) keeps its meaning: an owner.
        """
        owner, role, _ = self.check()
        self.assertEqual((owner, role), ("jane", OWNER))

    def test_readerPolicy_reader(self) -> None:
        """[O4] The reader policy makes a reader, named by its CN."""
        owner, role, _ = self.check(rolePolicies(READER))
        self.assertEqual((owner, role), ("jane", READER))
        leaf, _, _ = issue(self.pki, "jane", extensions=[rolePolicies(READER)])
        checked = checkOwner(_Request(leaf, self.ownerCA))  # type: ignore[arg-type]
        self.assertEqual((checked.actor, checked.mayChange), ("reader:jane", False))

    def test_reader_smallBodiesOnly(self) -> None:
        """
        [O2] [O4] A reader changes nothing, so the admin site gives it the
        small body limit of peers without an owner certificate.
        """
        for extensions, large in (((), True), ((rolePolicies(READER),), False)):
            leaf, _, _ = issue(self.pki, "jane", extensions=extensions)
            request = _Request(leaf, self.ownerCA)
            self.assertEqual(isOwner(request), large)  # type: ignore[arg-type]

    def test_ownerPolicy_owner(self) -> None:
        """[O4] The owner policy makes an owner, who may change things."""
        owner, role, _ = self.check(rolePolicies(OWNER))
        self.assertEqual((owner, role), ("jane", OWNER))

    def test_othersPolicies_ignored(self) -> None:
        """
        A policy of another issuer (a site's CA practice statement) is not
        fleetd's: alone it leaves an owner, beside the reader policy a reader.
        """
        self.assertEqual(self.check(_policies("1.3.6.1.4.1.99999.1"))[1], OWNER)
        mixed = _policies("1.3.6.1.4.1.99999.1", ROLE_ARC + ".2")
        self.assertEqual(self.check(mixed)[1], READER)

    def test_twoRoles_refused(self) -> None:
        """[O4] A certificate naming two fleetd roles is no operator at all."""
        owner, _, refusal = self.check(_policies(ROLE_ARC + ".1", ROLE_ARC + ".2"))
        self.assertIsNone(owner)
        self.assertEqual(
            refusal, "owner certificate refused: it names more than one fleetd role"
        )

    def test_unknownRole_refused(self) -> None:
        """
        [O4] A role under fleetd's arc that this fleetd does not know (one
        of a later version) is refused, never taken for an owner.
        """
        owner, _, refusal = self.check(_policies(ROLE_ARC + ".7"))
        self.assertIsNone(owner)
        self.assertIn(
            f"a fleetd role this fleetd does not know ({ROLE_ARC}.7)", refusal
        )

    def test_devPKI_ownerStatesItsRole(self) -> None:
        """The dev PKI's owner certificate states the owner role."""
        leaf = x509.load_pem_x509_certificate(self.pki.owner_cert.read_bytes())
        policies = leaf.extensions.get_extension_for_class(x509.CertificatePolicies)
        self.assertEqual(policies.value, rolePolicies(OWNER))
        self.assertEqual(certificateRole(leaf), OWNER)


class OperatorRoleTests(SynchronousTestCase):
    """C{fleetd-pki operator NAME --role ROLE} [O4]."""

    def test_reader_roleInTheCertificate(self) -> None:
        """
        [O4] --role reader writes a clientAuth certificate from the owner CA
        whose policies fix the reader role, and says what it may do.
        """
        config, real = realConfig(self)
        pki(config, "owner-ca")
        code, out, err = pki(config, "operator", "backup", "--role", "reader")
        self.assertEqual((code, err), (0, ""))
        leaf = cert(real / "operators" / "backup.pem")
        leaf.verify_directly_issued_by(cert(real / "owner-ca.pem"))
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        self.assertEqual(list(eku), [ExtendedKeyUsageOID.CLIENT_AUTH])
        self.assertEqual(certificateRole(leaf), READER)
        self.assertIn("reader 'backup': clientAuth, valid 365 days", out)
        self.assertIn("changes nothing; the journal names it reader:backup", out)

    def test_default_owner(self) -> None:
        """[O4] Without --role the certificate is an owner's, and says so."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        code, out, _ = pki(config, "operator", "alice")
        self.assertEqual(code, 0)
        leaf = cert(real / "operators" / "alice.pem")
        policies = leaf.extensions.get_extension_for_class(x509.CertificatePolicies)
        self.assertEqual(policies.value, rolePolicies(OWNER))
        self.assertIn("owner 'alice': clientAuth", out)

    def test_unknownRole_refused(self) -> None:
        """A role fleetd does not know is a usage error; nothing is written."""
        config, real = realConfig(self)
        pki(config, "owner-ca")
        code, out, err = pki(config, "operator", "eve", "--role", "admin")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("invalid choice: 'admin'", err)
        self.assertFalse((real / "operators").exists())


class ReaderAcceptedTests(DaemonTestMixin, TestCase):
    timeout = 60

    async def test_daemon_readsTheRoleTheToolWrote(self) -> None:
        """
        [O4] Over TLS, fleetd names the operators fleetd-pki made and the
        roles it fixed in their certificates.
        """
        config, real = realConfig(self)
        vendor = vendorFiles(Path(self.mktemp()))
        for argv in (
            ("owner-ca",),
            ("operator", "alice"),
            ("operator", "backup", "--role", "reader"),
            ("issuer",),
            ("ek-roots", "import", str(vendor["root"]), str(vendor["inter"])),
        ):
            code, _out, err = pki(config, *argv)
            self.assertEqual((code, err), (0, ""), argv)
        self.directory = config.parent
        self.settings = loadSettings(config)
        self.pki = DevPKIPaths.inside(self.directory / "pki")
        service = self.startDaemon()
        port = self.port(service, "admin")
        for name, role in (("alice", OWNER), ("backup", READER)):
            pair = (
                real / "operators" / f"{name}.pem",
                real / "operators" / f"{name}.key",
            )
            status, body = await deferToThread(
                httpsJSON, port, "GET", "/v1/admin/whoami", self.pki.public_ca,
                pair, None,
            )  # fmt: skip
            self.assertEqual((status, body), (200, {"owner": name, "role": role}))
