"""
Tests for C{fleetctl dns-check} against stand-in anchors, a fallback and TLS
listeners on loopback [A5] [A1].
"""

from __future__ import annotations

import argparse
import datetime
import io
import ipaddress
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry
from twisted.internet import reactor, ssl
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.interfaces import (
    IListeningPort,
    IReactorFromThreads,
    IReactorUDP,
)
from twisted.internet.protocol import DatagramProtocol, Factory, Protocol
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.cli.dnscheck import addArguments, dnsCheck, endpointAddress
from fleetd.config import Anchor, Settings, Topology, loadSettings
from fleetd.dns.service import DNSService, portNumber
from tests.dnssupport import NAME, TOPOLOGY, threadPool

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
DEV_CONFIG = Path(__file__).resolve().parent.parent / "conf" / "fleetd.dev.toml"


def _testCA() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A private CA, standing for a site's early CA (or any private one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dns-check test CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.datetime.now(datetime.UTC) - datetime.timedelta(1))
        .not_valid_after(NOW + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


TEST_CA = _testCA()


def certificate(
    names: list[str], days: int, issued: bool = False
) -> ssl.CertificateOptions:
    """
    Server TLS options with a P-256 certificate for C{names}: self-signed,
    or C{issued} by L{TEST_CA}. Valid from yesterday (real time, which the
    chain check uses) until C{days} after L{NOW} (the expiry check's clock).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    caKey, caCert = TEST_CA
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(caCert.subject if issued else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.datetime.now(datetime.UTC) - datetime.timedelta(1))
        .not_valid_after(NOW + datetime.timedelta(days=days, hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
            critical=False,
        )
    )
    if issued:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(caKey.public_key()),
            critical=False,
        )
    cert = builder.sign(caKey if issued else key, hashes.SHA256())
    pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    options: ssl.CertificateOptions = ssl.PrivateCertificate.loadPEM(pem).options()
    return options


class _Quiet(Protocol):
    def __init__(self, lost: list[Deferred[None]]) -> None:
        self.done: Deferred[None] = Deferred()
        lost.append(self.done)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.done.callback(None)


class Stage:
    """The loopback servers of one test, all stopped at its end."""

    def __init__(self, testCase: TestCase) -> None:
        self.testCase = testCase
        self.ports: list[IListeningPort] = []
        self.lost: list[Deferred[None]] = []
        testCase.addCleanup(self.stop)

    def dns(self, interface: str, address: str) -> int:
        """A DNSService on C{interface} answering C{address} for NAME."""
        topology = replace(TOPOLOGY, spore_bootstrap_ip=address)
        service = DNSService(
            cast(IReactorUDP, reactor),
            topology,
            port=0,
            interface=interface,
            ttl=60,
            registry=CollectorRegistry(),
            topologyLoader=lambda: topology,
        )
        service.startService()
        self.testCase.addCleanup(service.stopService)
        assert service.udpPort is not None
        return portNumber(service.udpPort)

    def silent(self, interface: str) -> int:
        """A UDP socket on C{interface} that never answers."""
        port = cast(IReactorUDP, reactor).listenUDP(
            0, DatagramProtocol(), interface=interface, maxPacketSize=8192
        )
        self.ports.append(port)
        return portNumber(port)

    def tls(
        self,
        names: list[str],
        days: int,
        alpn: list[bytes] | None = None,
        issued: bool = True,
    ) -> str:
        """A TLS listener on 127.0.0.1; its endpoint description."""
        options = certificate(names, days, issued)
        if alpn is not None:
            options = ssl.CertificateOptions(
                privateKey=options.privateKey,
                certificate=options.certificate,
                acceptableProtocols=alpn,
            )
        factory = Factory.forProtocol(lambda: _Quiet(self.lost))
        port = reactor.listenSSL(0, factory, options, interface="127.0.0.1")  # type: ignore[attr-defined]
        self.ports.append(port)
        return f"tcp:{portNumber(port)}:interface=127.0.0.1"

    def stop(self) -> Deferred[Any]:
        stopping = [maybeDeferred(p.stopListening) for p in self.ports]
        return gatherResults(stopping + self.lost)


def settingsFor(
    anchors: tuple[Anchor, ...],
    dnsPort: int,
    boot: str,
    tink: str,
    earlyCA: Path | None = None,
) -> Settings:
    """The dev settings pointed at the stage; every anchor on loopback."""
    for a in anchors:
        assert ipaddress.ip_address(a.dns).is_loopback, "tests talk to loopback only"
    settings = loadSettings(DEV_CONFIG)
    listen = replace(
        settings.listen,
        boot=boot,
        tink=tink,
        dns_port=dnsPort,
        dns_interface="127.0.0.1",
    )
    topology = Topology("10.20.0.5", "10.20.0.6", NAME, anchors)
    tls = replace(settings.tls, early_ca=earlyCA)
    return replace(settings, topology=topology, listen=listen, tls=tls)


ANCHORS = (Anchor("anchor-a", "127.0.0.2"), Anchor("anchor-b", "127.0.0.3"))


class DNSCheckTests(TestCase):
    """dns-check against loopback stand-ins [A5] [A1]."""

    def setUp(self) -> None:
        self.stage = Stage(self)
        self.pool = threadPool(self)
        self.fallback = self.stage.dns("127.0.0.1", "10.20.0.6")
        self.boot = self.stage.tls([NAME], 365)
        self.tink = self.stage.tls([NAME], 365, alpn=[b"h2", b"http/1.1"])
        self.earlyCA = Path(self.mktemp())
        self.earlyCA.write_bytes(TEST_CA[1].public_bytes(serialization.Encoding.PEM))

    def settings(
        self,
        anchors: tuple[Anchor, ...] = (),
        boot: str | None = None,
        tink: str | None = None,
        earlyCA: bool = True,
    ) -> Settings:
        return settingsFor(
            anchors,
            self.fallback,
            boot or self.boot,
            tink or self.tink,
            self.earlyCA if earlyCA else None,
        )

    async def check(
        self,
        settings: Settings,
        ports: dict[str, int],
        jsonOutput: bool = False,
        minDays: int = 14,
    ) -> tuple[int, str]:
        out = io.StringIO()

        def run() -> int:
            return dnsCheck(
                settings,
                timeout=1.0,
                minDays=minDays,
                out=out,
                jsonOutput=jsonOutput,
                anchorPorts=ports,
                clock=NOW.timestamp,
            )

        code = await deferToThreadPool(
            cast(IReactorFromThreads, reactor), self.pool, run
        )
        return code, out.getvalue()

    async def test_allGood(self) -> None:
        """Correct anchors, fallback and certificates: all OK, exit 0 [A5]."""
        ports = {
            "anchor-a": self.stage.dns("127.0.0.2", "10.20.0.6"),
            "anchor-b": self.stage.dns("127.0.0.3", "10.20.0.6"),
        }
        code, out = await self.check(self.settings(ANCHORS), ports)
        lines = out.splitlines()
        self.assertEqual(code, 0, out)
        self.assertEqual(len(lines), 7)
        self.assertEqual(
            lines[0],
            f"OK dns anchor-a 127.0.0.2:{ports['anchor-a']}: A {NAME} = 10.20.0.6",
        )
        self.assertEqual(
            lines[2], f"OK dns fleetd 127.0.0.1:{self.fallback}: A {NAME} = 10.20.0.6"
        )
        bootPort = self.boot.split(":")[1]
        self.assertEqual(
            lines[3],
            f"OK tls boot 127.0.0.1:{bootPort}: "
            f"certificate covers {NAME}, 365 days left",
        )
        self.assertEqual(
            lines[4],
            f"OK chain boot 127.0.0.1:{bootPort}: chains to certifi's roots"
            " and tls.early_ca",
        )
        self.assertTrue(lines[5].startswith("OK tls tink "), lines[5])
        self.assertTrue(lines[5].endswith("365 days left, ALPN h2"), lines[5])
        self.assertTrue(lines[6].startswith("OK chain tink "), lines[6])

    async def test_wrongAndSilent(self) -> None:
        """A wrong answer and a silent anchor are both reported; exit 1 [A5]."""
        ports = {
            "anchor-a": self.stage.dns("127.0.0.2", "10.9.9.9"),
            "anchor-b": self.stage.silent("127.0.0.3"),
        }
        code, out = await self.check(self.settings(ANCHORS), ports)
        lines = out.splitlines()
        self.assertEqual(code, 1, out)
        self.assertEqual(
            lines[0],
            f"FAIL dns anchor-a 127.0.0.2:{ports['anchor-a']}: "
            f"A {NAME} = 10.9.9.9, expected 10.20.0.6",
        )
        self.assertEqual(
            lines[1],
            f"FAIL dns anchor-b 127.0.0.3:{ports['anchor-b']}: timeout after 1.0s",
        )
        self.assertTrue(all(line.startswith("OK ") for line in lines[2:]), out)

    async def test_json(self) -> None:
        """--json prints one object with every check [A5]."""
        ports = {"anchor-a": self.stage.silent("127.0.0.2")}
        code, out = await self.check(self.settings(ANCHORS[:1]), ports, True)
        document = json.loads(out)
        self.assertEqual(code, 1)
        self.assertFalse(document["ok"])
        self.assertEqual(
            [(c["check"], c["ok"]) for c in document["checks"]],
            [
                ("dns", False),
                ("dns", True),
                ("tls", True),
                ("chain", True),
                ("tls", True),
                ("chain", True),
            ],
        )
        self.assertEqual(document["checks"][0]["detail"], "timeout after 1.0s")
        self.assertEqual(
            document["checks"][1]["target"], f"fleetd 127.0.0.1:{self.fallback}"
        )

    async def test_certificateNotCovering(self) -> None:
        """A certificate for another name fails the TLS check [A5]."""
        boot = self.stage.tls(["other.example"], 365)
        code, out = await self.check(self.settings(boot=boot), {})
        self.assertEqual(code, 1)
        self.assertIn(
            f"FAIL tls boot 127.0.0.1:{boot.split(':')[1]}: "
            f"certificate does not cover {NAME} (other.example)",
            out.splitlines(),
        )

    async def test_certificateExpiring(self) -> None:
        """A certificate with too few days left fails the TLS check [A5]."""
        code, out = await self.check(self.settings(), {}, minDays=366)
        self.assertEqual(code, 1)
        self.assertIn("365 days left (--min-days 366)", out)

    async def test_tinkWithoutALPN(self) -> None:
        """The Tink listener must select ALPN h2 [A5]."""
        tink = self.stage.tls([NAME], 365, alpn=[b"http/1.1"])
        code, out = await self.check(self.settings(tink=tink), {})
        self.assertEqual(code, 1)
        self.assertRegex(
            out.splitlines()[-2],
            r"^FAIL tls tink .*: TLS handshake failed \(ALPN h2 offered\)",
        )

    async def test_selfSigned_failsChain(self) -> None:
        """
        [A5] A self-signed certificate that covers the name still fails:
        Talos trusts only its bundled roots before it has a configuration.
        """
        boot = self.stage.tls([NAME], 365, issued=False)
        code, out = await self.check(self.settings(boot=boot), {})
        self.assertEqual(code, 1)
        port = boot.split(":")[1]
        lines = out.splitlines()
        self.assertIn(f"OK tls boot 127.0.0.1:{port}: certificate covers {NAME},"
                      " 365 days left", lines)  # fmt: skip
        chain = [line for line in lines if line.startswith("FAIL chain boot")]
        self.assertEqual(len(chain), 1, out)
        self.assertIn("does not chain to certifi's roots and tls.early_ca", chain[0])

    async def test_privateCA_withoutEarlyCA_failsChain(self) -> None:
        """
        [A5] A privately issued certificate fails unless the site names its
        CA as an early CA (tls.early_ca): with it, the same listener passes.
        """
        code, out = await self.check(self.settings(earlyCA=False), {})
        self.assertEqual(code, 1)
        failed = [line for line in out.splitlines() if line.startswith("FAIL")]
        self.assertEqual(len(failed), 2, out)
        self.assertTrue(all(" chain " in line for line in failed), out)
        self.assertIn("does not chain to certifi's roots:", failed[0])
        code, out = await self.check(self.settings(), {})
        self.assertEqual(code, 0, out)

    async def test_chainsButNameNotCovered_failsName(self) -> None:
        """[A5] A certificate that chains but covers another name fails."""
        boot = self.stage.tls(["other.example"], 365)
        code, out = await self.check(self.settings(boot=boot), {})
        self.assertEqual(code, 1)
        lines = out.splitlines()
        self.assertTrue(any(line.startswith("FAIL tls boot") for line in lines))
        self.assertTrue(any(line.startswith("OK chain boot") for line in lines))

    async def test_nothingListening(self) -> None:
        """A listener that is down fails with the reason [A5]."""
        closed = self.stage.silent("127.0.0.1")
        settings = settingsFor(
            (), self.fallback, f"tcp:{closed}:interface=127.0.0.1", self.tink
        )
        code, out = await self.check(settings, {})
        self.assertEqual(code, 1)
        self.assertIn("cannot connect: Connection refused", out)


class EndpointTests(SynchronousTestCase):
    """Where dns-check connects for an endpoint description."""

    def test_forms(self) -> None:
        """Listener addresses: ports, interfaces, wildcards and unix paths [A5]."""
        cases = {
            "tcp:8443:interface=127.0.0.1": ("127.0.0.1", 8443),
            "tcp:443": ("127.0.0.1", 443),
            "tcp:port=443:interface=0.0.0.0": ("127.0.0.1", 443),
            "tcp:42113:interface=10.20.0.5:backlog=50": ("10.20.0.5", 42113),
            r"tcp6:443:interface=\:\:1": ("::1", 443),
            "tcp6:443": ("::1", 443),
            "unix:/run/fleetd/boot.sock": "/run/fleetd/boot.sock",
            "unix:address=/x.sock:mode=600": "/x.sock",
        }
        for description, expected in cases.items():
            self.assertEqual(endpointAddress(description), expected, description)
        self.assertRaises(ValueError, endpointAddress, "ssl:443")

    def test_arguments(self) -> None:
        """--timeout defaults to 2 seconds and --min-days to 14 [A5]."""
        parser = argparse.ArgumentParser()
        addArguments(parser)
        args = parser.parse_args([])
        self.assertEqual((args.timeout, args.min_days), (2.0, 14))
        args = parser.parse_args(["--timeout", "0.5", "--min-days", "30"])
        self.assertEqual((args.timeout, args.min_days), (0.5, 30))
