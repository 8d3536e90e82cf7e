"""
No credential from a stale cache, and no provision of an ambiguous serial
(issue 17 items 11 and 12; design.md, NetBox).

The NetBox inventory keeps the device list NetBox last gave, for lists
people read while NetBox is down. Lookups that decide on a credential
(attestation, LDevID issue and renewal, provisioning) never answer from
it: while NetBox cannot be asked they refuse with C{busy} (503 with
Retry-After), and a token NetBox refuses (401, 403) is named as such.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource, getChildForRequest
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyRequest

from fleetd.admin.provision import ProvisionResource
from fleetd.attest.identity import Peer
from fleetd.attest.lookup import LookupService
from fleetd.attest.service import AttestationService
from fleetd.attest.tpm import ekDigest, spkiOf
from fleetd.device.attest import deviceAPI
from fleetd.device.refusals import statusOf
from fleetd.inventory.model import DeviceStatus, InventoryError
from fleetd.nodes import Refused as NodeRefused
from tests.attestserver import AttestServer, pki
from tests.fleetsupport import RENDERER, device
from tests.inventorysupport import W1
from tests.netbox_support import NetBoxFleet, NetBoxRig, seedFake
from tests.softtpm import SoftNode


class _Unauthorized(Resource):
    """A proxy in front of NetBox that wants other credentials: 401."""

    isLeaf = True

    def render(self, request: Request) -> bytes:
        request.setResponseCode(401)
        return b'{"detail": "Authentication credentials were not accepted."}'


class Rig(SynchronousTestCase):
    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)

    def cacheThenDecommissionInNetBox(self) -> None:
        """fleetd lists w1 (cached as it is), then an operator retires it in NetBox."""
        seedFake(self.rig.fake, W1)
        self.successResultOf(self.rig.inventory.list())
        self.rig.fake.edit(self.rig.fake.byName("w1")["id"], status="decommissioning")

    def refusedUnavailable(self, d: Deferred[Any]) -> InventoryError:
        self.rig.settle()
        error: InventoryError = self.failureResultOf(d, InventoryError).value
        self.assertEqual(error.kind, "unavailable", str(error))
        self.assertNotIn("\n", str(error))
        return error


class SerialLookupTests(Rig):
    """bySerial decides credentials: it asks NetBox or fails, never the cache."""

    def test_bySerial_netboxDown_unavailableNotCached(self) -> None:
        """
        Item 11: NetBox down, a device NetBox decommissioned since the
        last list is not answered from that list: the lookup fails
        C{unavailable}, whatever the cache says.
        """
        self.cacheThenDecommissionInNetBox()
        self.rig.http.down = True
        error = self.refusedUnavailable(self.rig.inventory.bySerial("SN-0001"))
        self.assertIn("unreachable", str(error))

    def test_bySerial_forbidden_namesTheToken(self) -> None:
        """
        Item 11: a token NetBox refuses (403) is an error naming the token
        (and not its secret), not a fall back to the cache as if NetBox
        were down.
        """
        self.cacheThenDecommissionInNetBox()
        self.rig.fake.tokens = {"nbt_other.x": True}
        error = self.refusedUnavailable(self.rig.inventory.bySerial("SN-0001"))
        self.assertIn("token", str(error))
        self.assertIn("403", str(error))
        self.assertNotIn("s3cret", str(error))

    def test_bySerial_401_namesTheToken(self) -> None:
        """Item 11: a 401 (from a proxy in front of NetBox, say) names the token too."""
        seedFake(self.rig.fake, W1)
        self.successResultOf(self.rig.inventory.list())
        self.rig.http.stub = StubTreq(_Unauthorized())
        error = self.refusedUnavailable(self.rig.inventory.bySerial("SN-0001"))
        self.assertIn("token", str(error))
        self.assertIn("401", str(error))

    def test_bySerial_netboxDown_counted(self) -> None:
        """Item 11: a lookup NetBox could not answer is counted by reason."""
        seedFake(self.rig.fake, W1)
        self.rig.http.down = True
        self.refusedUnavailable(self.rig.inventory.bySerial("SN-0001"))
        self.rig.http.down = False
        self.rig.fake.tokens = {}
        self.refusedUnavailable(self.rig.inventory.bySerial("SN-0001"))
        self.refusedUnavailable(self.rig.inventory.get("w1"))
        name = "fleetd_netbox_lookups_failed_total"
        self.assertEqual(self.rig.sample(name, reason="unavailable"), 1.0)
        self.assertEqual(self.rig.sample(name, reason="forbidden"), 2.0)


class CachedListTests(Rig):
    """Lists for people still use the cache, with fleetd's own last status."""

    def test_list_cached_showsStatusFleetdWroteAfterItSettled(self) -> None:
        """
        Item 11: fleetd retires w1 after the list was cached; the outbox row
        reaches NetBox and settles (it goes). With NetBox down, the cached
        list shows decommissioning, the last status fleetd wrote, not the
        status cached before.
        """
        seedFake(self.rig.fake, W1)
        self.successResultOf(self.rig.inventory.list())
        self.successResultOf(
            self.rig.inventory.setStatus("w1", DeviceStatus.DECOMMISSIONING, journal=())
        )
        self.rig.settle()
        self.assertEqual(self.rig.fake.byName("w1")["status"], "decommissioning")
        self.rig.http.down = True
        (cached,) = self.successResultOf(self.rig.inventory.list())
        self.assertEqual(cached.status, DeviceStatus.DECOMMISSIONING)

    def test_list_rowSettledDuringTheList_keepsFleetdsStatus(self) -> None:
        """
        Item 11: a status row that settles while a list is in flight (NetBox
        answered the list before the PATCH) is not lost: the list and the
        cache it leaves show the status fleetd wrote.
        """
        seedFake(self.rig.fake, W1)
        self.successResultOf(self.rig.worker.stop())
        self.successResultOf(
            self.rig.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        listAll = self.rig.client.listAll
        rig = self.rig

        async def pushDuring(path: str, params: Any = None) -> list[dict[str, Any]]:
            answer = await listAll(path, params)
            if path.endswith("devices/"):  # the PATCH lands after NetBox answered
                rig.worker.start()
                rig.settle()
            return answer

        self.rig.client.listAll = pushDuring  # type: ignore[method-assign]
        (listed,) = self.successResultOf(self.rig.inventory.list())
        self.assertEqual(self.rig.fake.byName("w1")["status"], "planned")
        self.assertEqual(listed.status, DeviceStatus.PLANNED)
        self.rig.client.listAll = listAll  # type: ignore[method-assign]
        self.rig.http.down = True
        (cached,) = self.successResultOf(self.rig.inventory.list())
        self.assertEqual(cached.status, DeviceStatus.PLANNED)

    def test_list_forbidden_cachedAndTokenNamed(self) -> None:
        """
        Item 11: a list for people while NetBox refuses the token answers
        from the cache (a start must still load its runs) and logs the
        token's refusal under its own event name.
        """
        seedFake(self.rig.fake, W1)
        self.successResultOf(self.rig.inventory.list())
        self.rig.fake.tokens = {}
        with capturedLogs() as seen:
            self.assertEqual(self.successResultOf(self.rig.inventory.list()), [W1])
        formats = [str(e.get("log_format", "")) for e in seen]
        self.assertTrue(
            any(f.startswith("netbox.list.cached-token-refused") for f in formats),
            formats,
        )


class AttestationTests(SynchronousTestCase):
    """
    Item 11 at the device listener: attestation and renewal over the
    NetBox inventory never issue from the cache.
    """

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        server = AttestServer(Path(self.mktemp()), pki(Path(self.mktemp())))
        self.server = server
        self.addCleanup(server.db.close)
        self.service = AttestationService(
            clock=server.clock,
            runner=server.runner,
            journal=server.journal,
            ekRoots=server.service.ekRoots,
            issuer=server.issuer,
            book=server.book,
            approvedSerialFor=server.bindings,
            deviceBySerial=self.rig.inventory.bySerial,
        )
        self.addCleanup(self.service.stop)
        server.service.stop()
        caCert = x509.load_pem_x509_certificate(server.pki.ek_ca.read_bytes())
        caKey = serialization.load_pem_private_key(
            server.pki.ek_ca_key.read_bytes(), None
        )
        self.node = SoftNode(caCert, caKey, serial="SN-0001")
        server.bindings.approved[ekDigest(spkiOf(self.node.ekPublic))] = "SN-0001"
        seedFake(self.rig.fake, W1)
        self.successResultOf(self.rig.inventory.list())

    def begin(self) -> Deferred[Any]:
        return Deferred.fromCoroutine(self.service.begin(self.node.claim()))

    def busy(self, d: Deferred[Any]) -> NodeRefused:
        refusal: NodeRefused = self.failureResultOf(d, NodeRefused).value
        self.assertEqual(refusal.reason, "busy", refusal.line())
        self.assertEqual(statusOf(refusal), 503)
        self.assertEqual(self.server.entries("ldevid.issued"), [])
        return refusal

    def attest(self) -> Peer:
        challenge = self.successResultOf(self.begin())
        issued = self.successResultOf(
            Deferred.fromCoroutine(self.service.prove(self.node.proof(challenge)))
        )
        cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
        return self.server.identify.checkCertificate(cert)

    def test_attest_serialTwiceInNetBox_refusedNamingNoDevice(self) -> None:
        """
        Item 12 at the device listener: the node's serial names two NetBox
        devices. An anonymous begin is refused C{inventory-ambiguous} (409)
        with a line that names neither device, and the refusal is journaled.
        """
        seedFake(
            self.rig.fake,
            replace(
                W1,
                name="secret-neighbour",
                uuid="11111111-2222-3333-4444-555555555555",
                macs=(),
            ),
        )
        refusal = self.failureResultOf(self.begin(), NodeRefused).value
        self.assertEqual(
            (refusal.reason, statusOf(refusal)), ("inventory-ambiguous", 409)
        )
        self.assertNotIn("secret-neighbour", refusal.line())
        self.assertNotIn("w1", refusal.line())
        (entry,) = self.server.entries("attest.refused")
        self.assertEqual(entry.fields["reason"], "inventory-ambiguous")
        self.assertEqual(self.server.entries("ldevid.issued"), [])

    def test_attest_netboxDown_busyNotCached(self) -> None:
        """
        Item 11: w1 was decommissioned in NetBox after fleetd cached the
        list; NetBox is down. The node gets no challenge and no LDevID:
        C{busy} (503), journaled.
        """
        self.rig.fake.edit(self.rig.fake.byName("w1")["id"], status="decommissioning")
        self.rig.http.down = True
        refusal = self.busy(self.begin())
        self.assertNotIn("NetBox", refusal.line())  # nothing about fleetd's peers
        entries = self.server.entries("attest.refused")
        self.assertEqual(entries[-1].fields["reason"], "busy")

    def test_prove_netboxDownSinceTheChallenge_busy(self) -> None:
        """
        Item 11: NetBox goes down between challenge and proof: the proof
        is refused C{busy}, no LDevID (the device is read again there).
        """
        challenge = self.successResultOf(self.begin())
        self.rig.http.down = True
        self.busy(
            Deferred.fromCoroutine(self.service.prove(self.node.proof(challenge)))
        )

    def test_renew_tokenRefused_busy(self) -> None:
        """Item 11: renewal while NetBox refuses the token: C{busy}, nothing issued."""
        peer = self.attest()
        issued = len(self.server.entries("ldevid.issued"))
        self.rig.fake.tokens = {}
        doc = {"csr": self.node.csr()}
        refusal = self.failureResultOf(
            Deferred.fromCoroutine(self.service.renew(peer, doc)), NodeRefused
        ).value
        self.assertEqual((refusal.reason, statusOf(refusal)), ("busy", 503))
        self.assertEqual(len(self.server.entries("ldevid.issued")), issued)

    def test_plan_netboxDown_busy(self) -> None:
        """
        Item 11: a node's record and plan lookups (its LDevID names it)
        while NetBox is down: C{busy}, not a bare 503 or a traceback.
        """
        peer = self.attest()
        lookups = LookupService(
            runner=self.server.runner,
            attestation=self.service,
            book=self.server.book,
            getDevice=self.rig.inventory.get,
            runs=self.server.runs,
            vault=self.server.vault,
            targetDiskFor=self.server.disks,
        )
        self.rig.http.down = True
        for lookup in (lookups.plan, lookups.record):
            refusal = self.failureResultOf(
                Deferred.fromCoroutine(lookup(peer, None)), NodeRefused
            ).value
            self.assertEqual((refusal.reason, statusOf(refusal)), ("busy", 503))

    def test_http_busyWithRetryAfter(self) -> None:
        """Item 11: the node's answer is 503, one line C{busy: ...}, Retry-After."""
        self.rig.http.down = True
        api = deviceAPI(self.service, self.server.identify, None)
        request = DummyRequest([b"attest", b"challenge"])
        request.method = b"POST"
        request.content = io.BytesIO(  # type: ignore[attr-defined]
            json.dumps(self.node.claim()).encode()
        )
        request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
        getChildForRequest(api, request).render(request)
        body = b"".join(request.written).decode()
        self.assertEqual(request.responseCode, 503)
        self.assertTrue(body.startswith("busy: "), body)
        self.assertEqual(body.count("\n"), 1)
        (retry,) = request.responseHeaders.getRawHeaders(b"retry-after", [])
        self.assertGreater(int(retry), 0)


class ProvisionTests(SynchronousTestCase):
    """Provisioning over NetBox: busy while NetBox cannot be asked; serials unique."""

    def setUp(self) -> None:
        self.fleet = NetBoxFleet(self)
        self.addCleanup(self.fleet.worker.stop)
        self.w1 = device("w1", "SER1")
        self.fleet.add(self.w1)
        self.resource = ProvisionResource(
            self.fleet.registry,
            self.fleet.inventory,
            RENDERER,
            self.fleet.journal,
            ownerName=lambda request: "ann",
        )

    def post(self, *names: str) -> tuple[Any, str, DummyRequest]:
        request = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(  # type: ignore[attr-defined]
            json.dumps({"devices": list(names)}).encode()
        )
        self.resource.render(request)  # type: ignore[arg-type]
        self.fleet.clock.advance(0)
        return request.responseCode, b"".join(request.written).decode(), request

    def assertNothingChanged(self) -> None:
        self.assertIsNone(self.fleet.registry.current("w1"))
        self.assertEqual(self.fleet.fake.byName("w1")["status"], "inventory")
        self.assertNotIn("PATCH", [m for m, _ in self.fleet.fake.requests])

    def test_ambiguousSerial_refusedBeforeAnythingChanges(self) -> None:
        """
        Item 12 (design.md, NetBox): w1's serial also matches w9 in NetBox (in
        another case: ?serial= is case-insensitive). Provisioning w1
        fails with one line naming the serial; no run, nothing PATCHed,
        journaled as provision.refused.
        """
        self.fleet.add(device("w9", "ser1"))
        code, body, _ = self.post("w1")
        self.assertEqual(code, 409, body)
        self.assertEqual(body.count("\n"), 1)
        self.assertIn("SER1", body)
        self.assertNothingChanged()
        self.assertEqual(self.fleet.events("w1"), ["provision.refused"])
        (entry,) = self.successResultOf(self.fleet.journal.query(device="w1"))
        self.assertEqual(entry.fields["reason"], "serial-ambiguous")

    def test_ambiguousSerial_notAFleetDevice_stillRefused(self) -> None:
        """
        Item 12: the other device need not be fleetd's (a PDU with the
        same serial): NetBox's ?serial= would still find two.
        """
        self.fleet.fake.addDevice("pdu1", "Ser1")
        code, body, _ = self.post("w1")
        self.assertEqual(code, 409, body)
        self.assertIn("SER1", body)
        self.assertNothingChanged()

    def test_uniqueSerial_provisioned(self) -> None:
        """Item 12: the check lets a serial NetBox holds once through."""
        self.fleet.add(device("w2", "SER2"))
        code, body, _ = self.post("w1")
        self.assertEqual(code, 201, body)
        self.assertEqual(self.fleet.fake.byName("w1")["status"], "planned")

    def test_netboxDown_busyWithRetryAfter(self) -> None:
        """Item 11: NetBox down: provisioning refuses busy (503, Retry-After)."""
        self.fleet.http.down = True
        code, body, request = self.post("w1")
        self.assertEqual(code, 503, body)
        self.assertTrue(body.startswith("busy: "), body)
        self.assertEqual(body.count("\n"), 1)
        (retry,) = request.responseHeaders.getRawHeaders(b"retry-after", [])
        self.assertGreater(int(retry), 0)
        self.assertIsNone(self.fleet.registry.current("w1"))

    def test_tokenRefused_lineNamesTheToken(self) -> None:
        """Item 11: NetBox refuses the token: the owner's line says so, not 'down'."""
        self.fleet.fake.tokens = {}
        code, body, request = self.post("w1")
        self.assertEqual(code, 503, body)
        self.assertIn("token", body)
        self.assertNotIn("s3cret", body)
        self.assertIsNotNone(request.responseHeaders.getRawHeaders(b"retry-after"))
        self.assertIsNone(self.fleet.registry.current("w1"))
