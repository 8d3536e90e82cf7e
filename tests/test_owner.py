"""
Owner identity and the admin API's gate [O1] [O2] [O3].

L{CheckOwnerTests} and L{GateTests} drive the gate in memory (an HTTP
channel over a transport that presents a chosen peer certificate);
L{OwnerCATests} check the start-up refusals; L{OwnerDaemonTests} go
through the real daemon over TLS.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.iweb import IRequest

from fleetd.admin.devices import devicesResource
from fleetd.admin.resource import adminRoot
from fleetd.config import ConfigError, TLSFiles, loadSettings
from fleetd.inventory import SQLiteInventory
from fleetd.listen.tls import loadTLSOptions
from fleetd.pki.dev import ensureDevPKI, makeCertificate
from fleetd.pki.ldevid import Issuer, Subject
from fleetd.pki.owners import OWNER_NAME
from fleetd.prepare import checkOwnerCA
from fleetd.store import AsyncJournal, Database, InlineRunner, Journal
from fleetd.web.owner import checkOwner
from fleetd.web.resources import Endpoint
from fleetd.web.site import BoundedSite
from tests.daemonsupport import DaemonTestMixin, httpsRequest
from tests.inventorysupport import SITE
from tests.ownersupport import (
    CLIENT_AUTH,
    CSV,
    NO_EKU,
    NOW,
    SERVER_AUTH,
    W1,
    CertTransport,
    OwnerSiteMixin,
    PKIMixin,
    inline,
    issue,
)
from tests.support import writeConfig


class FakeRequest:
    def __init__(self, cert: x509.Certificate | None, *above: x509.Certificate) -> None:
        self.transport = CertTransport(cert, *above)


def _ca(name: str, key: Any, signer: tuple[x509.Certificate, Any] | None) -> Any:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if signer is None else signer[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(True, None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False
        )
        .sign(key if signer is None else signer[1], hashes.SHA256())
    )


def siteRoot(directory: Path) -> tuple[x509.Certificate, Any, Path]:
    """A site root CA with no path length limit, to serve as the owner CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _ca("site-root (owner CA)", key, None)
    path = directory / "site-root.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def intermediate(
    root: x509.Certificate, rootKey: Any, directory: Path
) -> tuple[x509.Certificate, Any, Path]:
    """
    A CA signed by C{root} (as an LDevID issuer under the site root would
    be), written to C{directory}; its certificate, key and path.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _ca("folly devid CA", key, (root, rootKey))
    path = directory / "under-owner-ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def ldevidUnder(
    ca: x509.Certificate, caKey: Any, directory: Path
) -> tuple[x509.Certificate, Path, Path]:
    """
    An LDevID from L{Issuer} under C{ca} (clientAuth, CN = device name); the
    certificate file holds the leaf and C{ca}, as a node's client sends it.
    """
    issuer = Issuer(ca, caKey, timedelta(days=30))
    key = ec.generate_private_key(ec.SECP256R1())
    # Valid now: TLS checks it against the real time.
    now = datetime.now(UTC).timestamp()
    leaf = issuer.issue(key.public_key(), Subject("w1", "SER1"), now)
    pem = serialization.Encoding.PEM
    certPath, keyPath = directory / "w1-ldevid.pem", directory / "w1-ldevid.key"
    certPath.write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    keyPath.write_bytes(
        key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return leaf, certPath, keyPath


class CheckOwnerTests(PKIMixin, SynchronousTestCase):
    """What makes a peer an owner [O1]."""

    def setUp(self) -> None:
        self.makePKI()

    def check(
        self, cert: x509.Certificate | None, *above: x509.Certificate
    ) -> tuple[str | None, str]:
        if not above:
            above = (self.ca("owner_ca"),)
        checked = checkOwner(FakeRequest(cert, *above))  # type: ignore[arg-type]
        return checked.owner, checked.refusal

    def ca(self, name: str) -> x509.Certificate:
        return x509.load_pem_x509_certificate(getattr(self.pki, name).read_bytes())

    def test_clientAuthLeaf_owner(self) -> None:
        """[O1] A leaf with the clientAuth EKU and a usable CN is an owner."""
        cert, _, _ = issue(self.pki, "jane.doe@folly")
        self.assertEqual(self.check(cert)[0], "jane.doe@folly")

    def test_noEKU_refused(self) -> None:
        """
        [O1] A certificate without any extended key usage (as LDevIDs from
        capsule carry) is not an owner, whatever CA issued it.
        """
        cert, _, _ = issue(self.pki, "node-7", NO_EKU, ca="capsule_ca")
        owner, refusal = self.check(cert, self.ca("capsule_ca"))
        self.assertIsNone(owner)
        self.assertIn("no extended key usage", refusal)

    def test_serverAuthOnly_refused(self) -> None:
        """[O1] An EKU without clientAuth is not an owner."""
        cert, _, _ = issue(self.pki, "jane", SERVER_AUTH)
        owner, refusal = self.check(cert)
        self.assertIsNone(owner)
        self.assertIn("lacks clientAuth", refusal)

    def test_leafUnderIntermediate_refused(self) -> None:
        """
        [O1] An LDevID (clientAuth, CN = device name) from an issuer that is
        itself under the owner CA is not an owner: its verified chain is
        leaf, intermediate, owner CA, not leaf and owner CA.
        """
        root, rootKey, _ = siteRoot(self.pki.directory)
        ca, caKey, _ = intermediate(root, rootKey, self.pki.directory)
        leaf, _, _ = ldevidUnder(ca, caKey, self.pki.directory)
        owner, refusal = self.check(leaf, ca, root)
        self.assertIsNone(owner)
        self.assertEqual(
            refusal,
            "owner certificate refused: it was not issued directly by the owner CA",
        )

    def test_noVerifiedChain_refused(self) -> None:
        """
        [O1] A peer certificate without the chain TLS verified (or whose
        verified chain does not start with it) is never an owner.
        """
        cert, _, _ = issue(self.pki, "jane")
        other, _, _ = issue(self.pki, "john")
        request = FakeRequest(cert)
        request.transport._chain = None
        self.assertIsNone(checkOwner(request).owner)  # type: ignore[arg-type]
        owner, _ = self.check(cert, self.ca("capsule_ca"))
        self.assertIsNone(owner)
        request = FakeRequest(cert, self.ca("owner_ca"))
        request.transport._chain = [other, self.ca("owner_ca")]
        self.assertIsNone(checkOwner(request).owner)  # type: ignore[arg-type]

    def test_noCertificate_refused(self) -> None:
        """[O1] No certificate, no owner."""
        self.assertEqual(self.check(None), (None, "owner client certificate required"))

    def test_caCertificate_refused(self) -> None:
        """[O1] A CA certificate is never an owner, even if it claimed clientAuth."""
        ca = x509.load_pem_x509_certificate(self.pki.owner_ca.read_bytes())
        owner, _ = self.check(ca)
        self.assertIsNone(owner)

    def test_cnOutsideActorAlphabet_refused(self) -> None:
        """
        [O1] [J1] An owner name (CN) the journal would refuse as an actor
        (a space, a colon, too long) is refused with a line naming the CN.
        """
        for cn in ["Jane Doe", "owner:x", "-lead", "ünï", "a/b"]:
            cert, _, _ = issue(self.pki, cn)
            owner, refusal = self.check(cert)
            self.assertIsNone(owner, cn)
            self.assertIn("is not a usable owner name", refusal)
        cert, _, _ = issue(self.pki, "Jane Doe")
        self.assertIn("'Jane Doe'", self.check(cert)[1])

    def test_ownerNames_fitJournalActors(self) -> None:
        """[O1] Every name the gate accepts is an actor the journal accepts."""
        db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(db.close)
        journal = AsyncJournal(InlineRunner(db), Journal(b"k" * 32), Clock())
        for name in ["a", "A" * 64, "x_y.z@w-v", "0"]:
            self.assertIsNotNone(OWNER_NAME.fullmatch(name))
            self.successResultOf(journal.append("owner.test", actor=f"owner:{name}"))


class Recorder(Endpoint):
    """A change endpoint that records what reached it."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    def render_POST(self, request: IRequest) -> bytes:
        self.bodies.append(request.content.read())
        return b"{}\n"


class GateTests(OwnerSiteMixin, PKIMixin, SynchronousTestCase):
    """The owner gate in front of /v1/admin/: who, and which bodies [O1] [O3]."""

    def setUp(self) -> None:
        self.makePKI()
        db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(db.close)
        runner = InlineRunner(db)
        self.clock = Clock()
        self.journal = AsyncJournal(runner, Journal(b"k" * 32), self.clock)
        self.inventory = SQLiteInventory(runner, self.journal)
        self.provision = Recorder()
        root = adminRoot(
            clock=self.clock,
            registry=CollectorRegistry(),
            journal=self.journal,
            site="test",
            version="0",
            api={
                b"devices": devicesResource(
                    self.inventory, self.journal, offload=inline, defined=SITE
                ),
                b"provision": self.provision,
            },
        )
        self.site = BoundedSite(
            root, maxHeaderBytes=8192, maxHeaders=32, maxBodyBytes=1 << 20,
            idleTimeout=30, clock=self.clock,
        )  # fmt: skip
        self.owner, _, _ = issue(self.pki, "owner")

    def devices(self) -> list[str]:
        return [d.name for d in self.successResultOf(self.inventory.list())]

    def entries(self) -> list[str]:
        return [e.event for e in self.successResultOf(self.journal.query())]

    def test_badOwnerName_403BeforeAnyChange(self) -> None:
        """
        [O1] [J1] A chain-valid owner certificate whose CN is 'Jane Doe' gets
        one 403 line before anything changes: no device, no journal entry.
        """
        jane, _, _ = issue(self.pki, "Jane Doe")
        status, body = self.send(
            "POST", "/v1/admin/devices", json.dumps(W1).encode(), cert=jane
        )
        self.assertEqual(status, 403)
        self.assertEqual(body.count(b"\n"), 1)
        self.assertIn(b"'Jane Doe' is not a usable owner name", body)
        self.assertEqual((self.devices(), self.entries()), ([], []))
        status, body = self.send("POST", "/v1/admin/devices", json.dumps(W1).encode())
        self.assertEqual((status, self.devices()), (201, ["w1"]))

    def test_noEKU_403(self) -> None:
        """[O1] A certificate without EKU cannot even read whoami."""
        bare, _, _ = issue(self.pki, "node-7", NO_EKU)
        status, body = self.send("GET", "/v1/admin/whoami", cert=bare)
        self.assertEqual(status, 403)
        self.assertIn(b"no extended key usage", body)

    def test_browserBodyTypes_415(self) -> None:
        """
        [O3] A change with a body type a browser form can send (text/plain,
        urlencoded, multipart), none at all, or another charset is a 415;
        nothing reaches the resource.
        """
        body = json.dumps({"devices": ["w1"]}).encode()
        for ctype in [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            None,
            "application/json; charset=latin-1",
            "application/jsonx",
            "text/csv",
        ]:
            status, line = self.send("POST", "/v1/admin/provision", body, ctype)
            self.assertEqual(status, 415, ctype)
            self.assertEqual(
                line, b"unsupported content-type: this change takes "
                b"application/json (UTF-8)\n",
            )  # fmt: skip
        form = (
            b'--x\r\nContent-Disposition: form-data; name="devices"\r\n\r\n'
            b"w1\r\n--x--\r\n"
        )
        status, _ = self.send(
            "POST", "/v1/admin/provision", form, "multipart/form-data; boundary=x"
        )
        self.assertEqual(status, 415)
        self.assertEqual(self.provision.bodies, [])
        status, _ = self.send(
            "POST", "/v1/admin/provision", body, "Application/JSON; charset=UTF-8"
        )
        self.assertEqual((status, self.provision.bodies), (200, [body]))

    def test_duplicateKeys_400(self) -> None:
        """
        [O3] A JSON body naming a key twice (or not JSON at all) is a 400
        line; nothing reaches the resource.
        """
        for body in [
            b'{"devices": ["w1"], "devices": ["w2"]}',
            b'{"devices": [{"a": 1, "a": 2}]}',
            b"devices=w1",
            b"",
            b'{"devices": ["\xff"]}',
        ]:
            status, line = self.send("POST", "/v1/admin/provision", body)
            self.assertEqual(status, 400, body)
            self.assertEqual(line.count(b"\n"), 1)
        status, line = self.send(
            "POST", "/v1/admin/provision", b'{"devices": [], "devices": []}'
        )
        self.assertEqual(line, b"body: key 'devices' appears twice\n")
        self.assertEqual(self.provision.bodies, [])

    def test_import_takesCSVOnly(self) -> None:
        """[O3] The import takes text/csv (UTF-8) and nothing else."""
        for ctype in ["application/json", "text/plain", None]:
            status, _ = self.send(
                "POST", "/v1/admin/devices/import", CSV.encode(), ctype
            )
            self.assertEqual(status, 415, ctype)
        self.assertEqual(self.devices(), [])
        status, body = self.send(
            "POST", "/v1/admin/devices/import", CSV.encode(), "text/csv; charset=utf-8"
        )
        self.assertEqual((status, json.loads(body)), (200, {"imported": 2}))

    def test_reads_needNoBodyType(self) -> None:
        """GET and HEAD need no content-type."""
        self.assertEqual(
            self.send("GET", "/v1/admin/devices", contentType=None)[0], 200
        )
        status, body = self.send("HEAD", "/v1/admin/whoami", contentType=None)
        self.assertEqual((status, body), (200, b""))


class OwnerCATests(PKIMixin, SynchronousTestCase):
    """[O1] fleetd refuses to start with an owner CA trusted for anything else."""

    def setUp(self) -> None:
        self.directory = Path(self.mktemp()).resolve()
        self.pki = ensureDevPKI(self.directory / "pki", "enroll.lolwtf.ca")

    def load(self, clientCA: str, **tls: str) -> Any:
        owner = {"client_ca": clientCA}
        return loadSettings(writeConfig(self.directory, {"owner": owner, "tls": tls}))

    def refusal(self, clientCA: str, **tls: str) -> str:
        with self.assertRaises(ConfigError) as caught:
            checkOwnerCA(self.load(clientCA, **tls))
        message = str(caught.exception)
        self.assertIn("owner.client_ca", message)
        return message

    def test_devPKI_accepted(self) -> None:
        """The dev PKI's own owner CA passes."""
        checkOwnerCA(self.load("pki/owner-ca.pem"))

    def test_inLDevIDBundle_refused(self) -> None:
        """[O1] The capsule CA (in the LDevID trust bundle) cannot be the owner CA."""
        self.assertIn("pki.bundle", self.refusal("pki/capsule-ca.pem"))

    def test_ldevidIssuer_refused(self) -> None:
        """[O1] The LDevID issuer cannot be the owner CA."""
        self.assertIn(
            "in the LDevID trust bundle", self.refusal("pki/devid-issuer.pem")
        )
        bundle = self.pki.bundle.read_bytes()
        self.pki.bundle.write_bytes(
            bundle.replace(self.pki.devid_issuer.read_bytes(), b"")
        )
        self.assertIn("pki.issuer_cert", self.refusal("pki/devid-issuer.pem"))

    def test_inPublicChain_refused(self) -> None:
        """[O1] A CA of the public certificate's chain cannot be the owner CA."""
        # The public certificate itself was issued by that CA: refused first.
        self.assertIn("public certificate chain", self.refusal("pki/public-ca.pem"))
        both = self.directory / "pki" / "public-with-ca.pem"
        both.write_bytes(
            self.pki.public_cert.read_bytes() + self.pki.public_ca.read_bytes()
        )
        message = self.refusal("pki/public-ca.pem", cert="pki/public-with-ca.pem")
        self.assertIn("tls.cert", message)

    def test_caUnderOwnerCA_refused(self) -> None:
        """
        [O1] An LDevID issuer, a bundle CA or a public-chain CA signed by the
        owner CA is refused at start: every node would otherwise be an
        owner once its client sends the intermediate.
        """
        root = x509.load_pem_x509_certificate(self.pki.owner_ca.read_bytes())
        rootKey = serialization.load_pem_private_key(
            self.pki.owner_ca_key.read_bytes(), None
        )
        _, _, under = intermediate(root, rootKey, self.directory / "pki")
        settings = self.load("pki/owner-ca.pem")
        for key in ("issuer_cert", "bundle"):
            pki = replace(settings.pki, **{key: under})
            with self.assertRaises(ConfigError) as caught:
                checkOwnerCA(replace(settings, pki=pki))
            message = str(caught.exception)
            self.assertIn(f"(pki.{key})", message)
            self.assertIn("was issued by the owner CA", message)
        message = self.refusal("pki/owner-ca.pem", chain="pki/under-owner-ca.pem")
        self.assertIn("(tls.chain)", message)

    def test_severalCAs_refused(self) -> None:
        """
        [O1] The owner CA file holds exactly one CA: the owner CA beside the
        capsule CA (as in the review's attack) is refused.
        """
        both = self.directory / "pki" / "owner-and-capsule.pem"
        both.write_bytes(
            self.pki.owner_ca.read_bytes() + self.pki.capsule_ca.read_bytes()
        )
        message = self.refusal("pki/owner-and-capsule.pem")
        self.assertIn("holds 2 certificates", message)


class _Who(Endpoint):
    isLeaf = True

    def render_GET(self, request: IRequest) -> bytes:
        checked = checkOwner(request)
        return json.dumps([checked.owner, checked.refusal]).encode()


class OwnerChainOverTLSTests(PKIMixin, TestCase):
    """[O1] checkOwner behind a real TLS listener trusting the owner CA."""

    async def test_ldevidUnderOwnerCA_notOwner_overTLS(self) -> None:
        """
        [O1] Over real TLS (the review's probe): a node that sends its
        LDevID with an issuer signed by the owner CA verifies at the TLS
        layer but is not an owner; the owner's own certificate still is.
        """
        from twisted.internet import reactor
        from twisted.web.server import Site

        self.makePKI()
        where = self.pki.directory
        root, rootKey, rootPath = siteRoot(where)
        ca, caKey, _ = intermediate(root, rootKey, where)
        _, ldevidCert, ldevidKey = ldevidUnder(ca, caKey, where)
        ownerKey = ec.generate_private_key(ec.SECP256R1())
        ownerCert = makeCertificate(
            "owner", ownerKey, NOW, (root, rootKey), CLIENT_AUTH
        )
        pem = serialization.Encoding.PEM
        (where / "o.pem").write_bytes(ownerCert.public_bytes(pem))
        (where / "o.key").write_bytes(
            ownerKey.private_bytes(
                pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        options = loadTLSOptions(
            TLSFiles(self.pki.public_cert, self.pki.public_key), clientCA=rootPath
        )
        port = reactor.listenSSL(  # type: ignore[attr-defined]
            0, Site(_Who()), options, interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        number = port.getHost().port

        async def who(cert: tuple[Path, Path]) -> list[Any]:
            _, body = await deferToThread(
                httpsRequest, number, "GET", "/", self.pki.public_ca, cert
            )
            found: list[Any] = json.loads(body)
            return found

        self.assertEqual(
            await who((ldevidCert, ldevidKey)),
            [None, "owner certificate refused: it was not issued directly by the "
             "owner CA"],
        )  # fmt: skip
        owner = await who((where / "o.pem", where / "o.key"))
        self.assertEqual(owner[0], "owner")


class OwnerDaemonTests(DaemonTestMixin, TestCase):
    """The owner gate through the real daemon over TLS [O1] [O2] [O3]."""

    def setUp(self) -> None:
        self.makeSettings()

    async def call(
        self,
        method: str,
        path: str,
        cert: tuple[Path, Path] | None,
        body: bytes | None = None,
        contentType: str | None = None,
    ) -> tuple[int, bytes]:
        return await deferToThread(
            httpsRequest, self.port(self.service, "admin"), method, path,
            self.pki.public_ca, cert, body, contentType,
        )  # fmt: skip

    async def test_ownerIdentity_overTLS(self) -> None:
        """
        [O1] [O3] Over real TLS: the owner is named; a no-EKU certificate
        from the owner CA is a 403; 'Jane Doe' is a 403 and adds nothing;
        a text/plain change is a 415.
        """
        self.service = self.startDaemon()
        owner = (self.pki.owner_cert, self.pki.owner_key)
        _, bareCert, bareKey = issue(self.pki, "node-7", NO_EKU)
        _, janeCert, janeKey = issue(self.pki, "Jane Doe")
        status, body = await self.call("GET", "/v1/admin/whoami", owner)
        self.assertEqual(
            (status, json.loads(body)), (200, {"owner": "owner", "role": "owner"})
        )
        status, body = await self.call("GET", "/v1/admin/whoami", (bareCert, bareKey))
        self.assertEqual(status, 403)
        self.assertIn(b"no extended key usage", body)
        status, body = await self.call(
            "POST", "/v1/admin/devices", (janeCert, janeKey),
            json.dumps(W1).encode(), "application/json",
        )  # fmt: skip
        self.assertEqual(status, 403)
        self.assertIn(b"'Jane Doe'", body)
        status, body = await self.call(
            "POST", "/v1/admin/devices", owner, json.dumps(W1).encode(), "text/plain"
        )
        self.assertEqual(status, 415)
        status, body = await self.call("GET", "/v1/admin/devices", owner)
        self.assertEqual((status, json.loads(body)), (200, {"devices": []}))

    async def test_notOwner_bodyCappedAt64KiB_overTLS(self) -> None:
        """
        [O2] Over real TLS, a 1 MiB body without an owner certificate is a
        413 at the headers and no temp file appears; an owner's is read.
        """
        self.service = self.startDaemon()
        owner = (self.pki.owner_cert, self.pki.owner_key)
        tmp = Path(self.mktemp())
        tmp.mkdir()
        spooled = _tempFiles()
        big = b"a" * (1 << 20)
        status, body = await self.call(
            "POST", "/v1/admin/devices", None, big, "application/json"
        )
        self.assertEqual((status, body), (413, b"request body too large\n"))
        self.assertEqual(_tempFiles(), spooled)
        status, body = await self.call(
            "POST",
            "/v1/admin/devices/import",
            owner,
            b"name,serial\n" + big,
            "text/csv",
        )
        self.assertEqual(status, 400)  # an owner's megabyte is read, and parsed
        self.assertIn(b"line ", body)


def _tempFiles() -> set[str]:
    """Names of this process's open files that are deleted temp files."""
    import os

    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "(deleted)" in target:
            found.add(target)
    return found
