"""
A device listener for attestation tests: the real services over a real
database, behind the real TLS listener (loopback, port 0), with test
doubles for the other helper's binding lookup and disk choice; and the
two base cases that drive it with a software node (L{ChecklistTestCase},
L{HoldsTestCase}).
"""

from __future__ import annotations

import sqlite3
import time
import uuid as uuidlib
from datetime import timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.attest.ekroots import EKRoots
from fleetd.attest.identity import LDevIDBook, LDevIDIdentifier, Peer
from fleetd.attest.lookup import LookupService
from fleetd.attest.service import AttestationService
from fleetd.attest.tpm import ekDigest, spkiOf
from fleetd.config import TLSFiles
from fleetd.device.attest import deviceAPI
from fleetd.device.refusals import statusOf
from fleetd.inventory.model import Device, DeviceStatus
from fleetd.inventory.sqlite import SQLiteInventory
from fleetd.listen.tls import loadTLSOptions, tlsFactory
from fleetd.nodes import Refused
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from fleetd.pki.ldevid import Issuer, TrustBundle
from fleetd.store.db import Database
from fleetd.store.entries import JournalEntry
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import InlineRunner
from fleetd.vault import MemoryVault
from fleetd.web.resources import Router
from fleetd.web.site import BoundedSite
from tests.faultsupport import FaultyJournal, FaultyRunner
from tests.softtpm import SoftNode

PKI: Any = None


def pki(base: Path) -> Any:
    """The dev PKI under C{base}, made once per process and shared."""
    global PKI
    if PKI is None:
        PKI = ensureDevPKI(base.resolve() / "pki", "localhost")
    return PKI


class Bindings:
    """Test double for fleetd.trust.bindings.approvedSerialFor."""

    def __init__(self) -> None:
        self.approved: dict[str, str] = {}

    def __call__(self, db: sqlite3.Connection, ekSha256: str) -> str | None:
        assert isinstance(db, sqlite3.Connection)
        return self.approved.get(ekSha256)


class Disks:
    """Test double for fleetd.trust.disks.targetDiskFor."""

    def __init__(self) -> None:
        self.targets: dict[str, str] = {}

    def __call__(self, db: sqlite3.Connection, device: str) -> str | None:
        assert isinstance(db, sqlite3.Connection)
        return self.targets.get(device)


class ReadyRuns:
    def __init__(self) -> None:
        self.ready: dict[str, str] = {}

    def readyRun(self, device: str) -> str | None:
        return self.ready.get(device)


class AttestServer:
    def __init__(self, directory: Path, pki: DevPKIPaths | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.pki = pki or ensureDevPKI(directory / "pki", "localhost")
        self.clock = Clock()
        # Injected, but starting at the wall time: TLS peers check the
        # certificates this clock dates against their own clocks.
        self.clock.advance(time.time())
        self.db = Database.open(directory / "state.sqlite3")
        # Real runner and journal, each able to fail on demand [J1].
        self.runner = FaultyRunner(InlineRunner(self.db))
        self.journalCore = FaultyJournal(b"j" * 32)
        self.journal = AsyncJournal(self.runner, self.journalCore, self.clock)
        self.inventory = SQLiteInventory(self.runner, self.journal)
        self.bindings = Bindings()
        self.disks = Disks()
        self.runs = ReadyRuns()
        self.vault = MemoryVault()
        self.issuer = Issuer.load(
            self.pki.devid_issuer, self.pki.devid_issuer_key, timedelta(days=365)
        )
        self.bundle = TrustBundle.load(self.pki.bundle, self.issuer.cert)
        self.book = LDevIDBook()
        self.registry = CollectorRegistry()
        self.service = AttestationService(
            clock=self.clock,
            runner=self.runner,
            journal=self.journal,
            ekRoots=EKRoots.load(self.pki.ek_roots),
            issuer=self.issuer,
            book=self.book,
            approvedSerialFor=self.bindings,
            deviceBySerial=self.inventory.bySerial,
            metrics=self.registry,
        )
        self.identify = LDevIDIdentifier(self.bundle, self.book)
        self.lookups = LookupService(
            runner=self.runner,
            attestation=self.service,
            book=self.book,
            getDevice=self.inventory.get,
            runs=self.runs,
            vault=self.vault,
            targetDiskFor=self.disks,
        )
        self.port: IListeningPort | None = None

    def addDevice(self, name: str, serial: str, deviceClass: str = "worker") -> Device:
        uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name))
        device = Device(name, serial, uuid, (), deviceClass, None)
        result: list[Any] = []
        self.inventory.add(device, journal=[]).addBoth(result.append)
        assert isinstance(result[0], Device), result
        return result[0]

    def root(self) -> Router:
        root = Router()
        root.putChild(b"v1", deviceAPI(self.service, self.identify, self.lookups))
        return root

    async def listen(self) -> str:
        site = BoundedSite(
            self.root(),
            maxHeaderBytes=8192,
            maxHeaders=64,
            maxBodyBytes=65536,
            idleTimeout=30,
            clock=reactor,
        )
        options = loadTLSOptions(
            TLSFiles(self.pki.public_cert, self.pki.public_key, self.pki.public_ca),
            clientCA=self.pki.bundle,
            clientCAKey="pki.bundle",
        )
        factory = tlsFactory(
            options,
            site,
            name="device",
            clock=reactor,
            maxConnections=64,
            idleTimeout=30,
        )
        self.factory = factory
        endpoint = serverFromString(reactor, "tcp:0:interface=127.0.0.1")
        self.port = await endpoint.listen(factory)
        address: Any = self.port.getHost()
        return f"https://localhost:{address.port}"

    async def stop(self) -> None:
        self.service.stop()
        if self.port is not None:
            await maybeDeferred(self.port.stopListening)
            await self.factory.closeAll()
        self.db.close()

    def results(self) -> dict[str, float]:
        """C{fleetd_attest_results_total} by result, zeros left out."""
        return {
            sample.labels["result"]: sample.value
            for metric in self.registry.collect()
            for sample in metric.samples
            if sample.name == "fleetd_attest_results_total" and sample.value
        }

    def entries(self, event: str | None = None) -> list[JournalEntry]:
        result: list[Any] = []
        self.journal.query(limit=10000).addBoth(result.append)
        entries = result[0]
        return [e for e in entries if event is None or e.event == event]


def serverAndNode(
    test: SynchronousTestCase,
) -> tuple[AttestServer, Any, Any, SoftNode]:
    """
    An L{AttestServer} with device w1 (SER1), stopped and closed with
    C{test}, and a software node whose EK the server's EK CA certified.
    """
    server = AttestServer(Path(test.mktemp()), pki(Path(test.mktemp())))
    test.addCleanup(server.db.close)
    test.addCleanup(server.service.stop)
    caCert = x509.load_pem_x509_certificate(server.pki.ek_ca.read_bytes())
    caKey = serialization.load_pem_private_key(server.pki.ek_ca_key.read_bytes(), None)
    server.addDevice("w1", "SER1")
    return server, caCert, caKey, SoftNode(caCert, caKey)


class ChecklistTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server, self.caCert, self.caKey, self.node = serverAndNode(self)
        self.server.bindings.approved[ekDigest(spkiOf(self.node.ekPublic))] = "SER1"

    def begin(self, doc: dict[str, Any]) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.service.begin(doc))

    def prove(self, doc: dict[str, Any]) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.service.prove(doc))

    def assertRefused(self, d: Deferred[Any], reason: str) -> Refused:
        refusal: Refused = self.failureResultOf(d, Refused).value
        self.assertEqual(refusal.reason, reason, refusal.line())
        self.assertTrue(400 <= statusOf(refusal) < 500)
        entries = self.server.entries("attest.refused")
        self.assertEqual(entries[-1].fields["reason"], reason)
        self.assertEqual(self.server.entries("ldevid.issued"), [])
        return refusal

    def challenge(self) -> dict[str, Any]:
        result: dict[str, Any] = self.successResultOf(self.begin(self.node.claim()))
        return result


WHY = (
    "ek-binding-not-approved: the binding of serial SER1 to EK 0123456789abcdef..."
    " is suspended: its receiving-scan evidence was withdrawn"
)


class HoldsTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server, self.caCert, self.caKey, self.node = serverAndNode(self)
        self.server.addDevice("w2", "SER2")
        self.digest = ekDigest(spkiOf(self.node.ekPublic))
        self.server.bindings.approved[self.digest] = "SER1"
        self.reasons: list[str] = []

        def why(db: sqlite3.Connection, ekSha256: str) -> str:
            self.reasons.append(ekSha256)
            return WHY

        self.server.service._bindingRefusal = why

    def begin(self, doc: dict[str, Any]) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.service.begin(doc))

    def prove(self, doc: dict[str, Any]) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.server.service.prove(doc))

    def challenge(self, node: SoftNode | None = None) -> dict[str, Any]:
        node = node or self.node
        result: dict[str, Any] = self.successResultOf(self.begin(node.claim()))
        return result

    def attest(self) -> Peer:
        """Attest the software node; the peer its new LDevID makes it."""
        issued = self.successResultOf(self.prove(self.node.proof(self.challenge())))
        cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
        return self.server.identify.checkCertificate(cert)

    def renew(self, peer: Peer) -> Deferred[Any]:
        doc = {"csr": self.node.csr()}
        return Deferred.fromCoroutine(self.server.service.renew(peer, doc))

    def retire(self, name: str = "w1") -> None:
        self.successResultOf(
            self.server.inventory.setStatus(
                name, DeviceStatus.DECOMMISSIONING, journal=[]
            )
        )

    def refused(self, d: Deferred[Any], reason: str) -> Refused:
        """C{d} failed with C{reason}, journaled as the last refusal."""
        refusal: Refused = self.failureResultOf(d, Refused).value
        self.assertEqual(refusal.reason, reason, refusal.line())
        self.assertEqual(refusal.line().count("\n"), 0)
        entries = self.server.entries("attest.refused")
        self.assertEqual(entries[-1].fields["reason"], reason)
        return refusal

    def issued(self) -> list[str]:
        return [str(e.fields["how"]) for e in self.server.entries("ldevid.issued")]
