"""
The client built from [kubernetes] (fleetd.k8s.connect) against the fake
API served over real TLS on loopback: CA verification of an IP address,
the bearer token file, a watch stream through a real HTTP/1.1 connection.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.ssl import PrivateCertificate
from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from fleetd.config import ConfigError, KubernetesSettings
from fleetd.k8s.client import KubeClient, KubeUnavailable
from fleetd.k8s.connect import clientFromSettings
from fleetd.reactors import fleetdReactor
from fleetd.testing.kube import FakeKube, csrPEM
from tests.daemonsupport import DaemonTestMixin
from tests.kubesupport import bootstrapSecret
from tests.tinkpeers import provisionedDevice


def selfSigned(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certPath, keyPath = directory / f"{name}.pem", directory / f"{name}.key"
    certPath.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyPath.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certPath, keyPath


class FakeOverTLS(TestCase):
    """The fake API on a loopback TLS listener with a self-signed IP cert."""

    def setUp(self) -> None:
        self.directory = Path(self.mktemp()).resolve()
        self.directory.mkdir()
        cert, key = selfSigned(self.directory, "server")
        self.fake = FakeKube(reactor)
        pem = cert.read_bytes() + key.read_bytes()
        options = PrivateCertificate.loadPEM(pem).options()
        self.port = reactor.listenSSL(  # type: ignore[attr-defined]
            0, Site(self.fake.resource()), options, interface="127.0.0.1"
        )
        self.addCleanup(self.port.stopListening)
        self.cert = cert
        self.tokenFile = self.directory / "token"
        self.tokenFile.write_text(self.fake.adminToken + "\n")


class TLSClientTests(FakeOverTLS):
    def client(self, ca: Path) -> KubeClient:
        settings = KubernetesSettings(
            api=f"https://127.0.0.1:{self.port.getHost().port}",
            ca=ca,
            token_file=self.tokenFile,
            client_cert=None,
            client_key=None,
        )
        client = clientFromSettings(fleetdReactor(reactor), settings)
        self.addCleanup(client.close)
        return client

    async def test_secretsAndWatch_overTLS(self) -> None:
        """The configured client creates a Secret and watches a CSR arrive."""
        client = self.client(self.cert)
        await client.createSecret(bootstrapSecret())
        got = await client.getSecret("bootstrap-token-abcdef")
        assert got is not None
        _, rv = await client.listCSRs()
        arrived: Deferred[dict[str, Any]] = Deferred()
        watch = client.watchCSRs(
            rv, lambda e: arrived.callback(e) if not arrived.called else None
        )
        reactor.callLater(
            0.05,
            self.fake.fileCSR,
            "abcdef.0123456789abcdef",
            csrPEM("system:node:w1"),
        )
        event = await arrived
        self.assertEqual(event["type"], "ADDED")
        watch.stop()
        await watch.done.addErrback(lambda _: None)
        self.fake.closeWatches()

    async def test_wrongCA_unavailable(self) -> None:
        """A server certificate the configured CA did not issue is refused."""
        other, _ = selfSigned(self.directory, "other")
        client = self.client(other)
        with self.assertRaises(KubeUnavailable):
            await client.listClusterRoleBindings()

    def test_badFiles_configError(self) -> None:
        """A missing token file or a CA that is not PEM is one configuration error."""
        settings = KubernetesSettings(
            api="https://127.0.0.1:1",
            ca=self.cert,
            token_file=self.directory / "no",
            client_cert=None,
            client_key=None,
        )
        error = self.assertRaises(ConfigError, clientFromSettings, reactor, settings)
        self.assertIn("kubernetes.token_file", str(error))
        junk = self.directory / "junk.pem"
        junk.write_text("junk")
        settings = KubernetesSettings(
            api="https://127.0.0.1:1",
            ca=junk,
            token_file=self.tokenFile,
            client_cert=None,
            client_key=None,
        )
        error = self.assertRaises(ConfigError, clientFromSettings, reactor, settings)
        self.assertIn("kubernetes.ca", str(error))


class DaemonWithClusterTests(FakeOverTLS, DaemonTestMixin):
    """The daemon with [kubernetes] set, against the fake over TLS."""

    async def test_provision_issuesToken_K1(self) -> None:
        """
        [K1] The daemon's provision creates the node's Secret in the cluster
        and writes the token into the configuration; the daemon starts the
        watch and the [K3] check, and stops leaving nothing behind.
        """
        kube = {
            "api": f"https://127.0.0.1:{self.port.getHost().port}",
            "ca": str(self.cert),
            "token_file": str(self.tokenFile),
        }
        service, fleetctl = await self.daemonWithDevice({"kubernetes": kube})
        code, out, err = await fleetctl("--json", "provision", "w1")
        self.assertEqual(code, 0, err)
        self.assertEqual(len(self.fake.secrets), 1)
        (name,) = self.fake.secrets
        code, out, err = await fleetctl("status", "w1")
        self.assertEqual(code, 0, err)
        self.assertIn(f"token:    {name.removeprefix('bootstrap-token-')}  live", out)
        self.assertTrue(self.fake.watchers)
        # [K5][K6] the cluster-wide token through fleetctl
        code, out, err = await fleetctl(
            "--json", "cluster-token", "request", "--node", "cp1", "--reason", "cp"
        )
        self.assertEqual(code, 0, err)
        request = json.loads(out)["request"]
        code, out, err = await fleetctl("cluster-token", "approve", request)
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"cluster.token: [a-z0-9]{6}\.[a-z0-9]{16}\n")
        code, out, err = await fleetctl("cluster-token", "rotate")
        self.assertEqual(code, 0, err)
        self.assertIn("what must change in the cluster's Talos configurations", out)
        self.assertIn("is deleted at", out)
        # [R1] retirement with a cluster
        self.fake.addNode("w1")
        code, out, err = await fleetctl("retire", "w1", "--yes")
        self.assertEqual(code, 0, err)
        self.assertIn("node:     deleted", out)
        self.assertNotIn("w1", self.fake.nodes)
        await service.stopService()
        self.fake.closeWatches()

    async def test_workflowState_secondSignal(self) -> None:
        """
        [B1] With tink.workflow_state = "kubernetes" the daemon watches the
        namespace's Workflows through its [kubernetes] client once the runs
        are loaded; a Workflow's SUCCESS puts the device's run in rebooting
        (journaled with the signal named), and stopping ends the watch.
        """
        from twisted.internet.task import deferLater

        kube = {
            "api": f"https://127.0.0.1:{self.port.getHost().port}",
            "ca": str(self.cert),
            "token_file": str(self.tokenFile),
        }
        self.makeSettings(
            {
                "kubernetes": kube,
                "tink": {
                    "upstream": "tcp:127.0.0.1:1",
                    "workflow_state": "kubernetes",
                    "workflow_namespace": "tink",
                },
            }
        )
        service = self.startDaemon()
        mac = "52:54:00:00:00:07"
        await provisionedDevice(service, mac)
        self.fake.addWorkflow("tink", "wf", mac, state="RUNNING")
        self.fake.setWorkflowState("tink", "wf", "SUCCESS")
        for _ in range(500):
            entries = await service.journal.query(device="w1")
            rebooting = [e for e in entries if e.event == "boot.rebooting"]
            if rebooting:
                break
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(
            [dict(e.fields) for e in rebooting],
            [{"workflow": "tink/wf", "signal": "kubernetes"}],
        )
        up = service.registry.get_sample_value("fleetd_tink_workflow_watch_up")
        self.assertEqual(up, 1.0)
        await service.stopService()
        self.assertEqual(
            service.registry.get_sample_value("fleetd_tink_workflow_watch_up"), 0.0
        )
        self.fake.closeWatches()
