"""
fleetd as the site's Talos KMS, end to end with real parts (issue 30):
a grpcio client generated from the proto plays Talos over TLS to the kms
listener, and cryptsetup formats and opens a LUKS2 volume on a file with
what it seals and unseals [E1] [E2] [E3].
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import yaml
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.kms import store
from fleetd.readiness import State
from tests.daemonsupport import UUID1, UUID2, configPath
from tests.kmssupport import KMS, KMSDaemonMixin, fetchFrom, luksFormat, luksOpens
from tests.support import exposedMetrics, ruleMetrics


class TalosUnlockTests(KMSDaemonMixin, TestCase):
    """A node seals its passphrase, unseals it at the next boot, and
    cannot once retired."""

    async def test_sealUnsealCryptsetup_thenRetired_nothingOpens(self) -> None:
        """
        [E1] [E2] [E3] w1 Seals a 32-byte passphrase from the address its
        configuration went to; cryptsetup formats a LUKS2 volume with it
        (as Talos does: base64 of the bytes); the Unseal of the blob opens
        the volume. After C{fleetctl retire}, the node's Unseal is refused
        with a reason, its keys are destroyed in the retirement's
        transaction, and no answer opens the volume.
        """
        service = await self.startNode()
        client, _ = self.kms()
        passphrase = os.urandom(32)
        sealed = await self.seal(client, UUID1, passphrase)
        self.assertNotIn(passphrase, sealed)
        volume = Path(self.mktemp())
        await deferToThread(luksFormat, volume, passphrase)
        unsealed = await self.unseal(client, UUID1, sealed)
        self.assertEqual(unsealed, passphrase)
        self.assertTrue(await deferToThread(luksOpens, volume, unsealed))
        # A second Seal (EPHEMERAL) uses the node's same key: one key made.
        await self.seal(client, UUID1, os.urandom(32))
        events = [e["event"] for e in await self.journal()]
        self.assertEqual(events.count("kms.key-created"), 1)

        status, doc = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, doc)
        self.assertEqual(doc["disk_keys"]["state"], "destroyed")
        code, message = await self.refused(client.unseal, UUID1, sealed)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertTrue(message.startswith("retired: "), message)
        rows = await service.runner.run(lambda db: store.keysOf(db, "w1"))
        self.assertEqual([r.live for r in rows], [False])
        entries = await self.journal()
        destroyed = [e for e in entries if e["event"] == "kms.key-destroyed"]
        self.assertEqual(destroyed[0]["fields"]["why"], "retired")
        self.assertFalse(await deferToThread(luksOpens, volume, os.urandom(32)))

    async def test_stranger_wrongAddress_tampered_refusedWithReasons(self) -> None:
        """
        [E1] A stranger's uuid is refused NOT_FOUND, never answered with
        random bytes; a tampered blob and a blob under another uuid are
        refused [E2]; each refusal is counted by reason and journaled.
        """
        service = await self.startNode()
        client, _ = self.kms()
        passphrase = os.urandom(32)
        sealed = await self.seal(client, UUID1, passphrase)
        code, message = await self.refused(client.unseal, UUID2, sealed)
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertTrue(message.startswith("unknown-node: "), message)
        code, message = await self.refused(client.seal, UUID2, passphrase)
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        tampered = bytearray(sealed)
        tampered[-1] ^= 1
        code, message = await self.refused(client.unseal, UUID1, bytes(tampered))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(message.startswith("blob-rejected: "), message)
        code, _ = await self.refused(client.unseal, UUID1, b"\x01" + b"\x00" * 59)
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)  # unknown-key
        code, _ = await self.refused(client.seal, "not-a-uuid", passphrase)
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        code, _ = await self.refused(client.seal, UUID1, b"short")
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        _, _, body = await self.get(service, "admin", "/metrics")
        text = body.decode()
        for reason, count in (
            ("unknown-node", 2),
            ("blob-rejected", 1),
            ("unknown-key", 1),
            ("malformed", 2),
        ):
            line = f'fleetd_kms_refusals_total{{reason="{reason}"}} {count}.0'
            self.assertIn(line, text)
        self.assertIn('fleetd_kms_answered_total{method="seal"} 1.0', text)
        refusals = [e for e in await self.journal() if e["event"] == "kms.refused"]
        self.assertEqual(
            sorted({e["fields"]["reason"] for e in refusals}),
            ["blob-rejected", "malformed", "unknown-key", "unknown-node"],
        )

    async def test_wrongSourceAddress_refused(self) -> None:
        """
        [E1] The configuration went to 127.0.0.2: the same uuid asking
        from 127.0.0.1 is refused PERMISSION_DENIED (wrong-address), and
        nothing is sealed.
        """
        service = await self.startNode(source="127.0.0.2")
        client, _ = self.kms()
        code, message = await self.refused(client.seal, UUID1, os.urandom(32))
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertTrue(message.startswith("wrong-address: "), message)
        self.assertNotIn("w1", message)
        rows = await service.runner.run(lambda db: store.keysOf(db, "w1"))
        self.assertEqual(rows, [])

    async def test_inventoryAddress_answeredFromIt(self) -> None:
        """
        [E1] The node's own address is also its inventory address: with the
        configuration delivered to 127.0.0.2 and the inventory holding
        127.0.0.1 for w1 (set in its row: the API refuses a loopback
        address), a Seal from 127.0.0.1 is answered and its blob opens.
        """
        service = await self.startNode(source="127.0.0.2")
        client, _ = self.kms()
        code, _ = await self.refused(client.seal, UUID1, os.urandom(32))
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        await service.runner.run(
            lambda db: db.execute(
                "UPDATE devices SET address = '127.0.0.1' WHERE name = 'w1'"
            )
        )
        passphrase = os.urandom(32)
        sealed = await self.seal(client, UUID1, passphrase)
        self.assertEqual(await self.unseal(client, UUID1, sealed), passphrase)

    async def test_noDeliveryNoAddress_refusedNamingNoDevice(self) -> None:
        """
        [E1] A provisioned device with neither a delivery nor an inventory
        address has no
        address to be answered from: refused FAILED_PRECONDITION (no-address)
        with a line that does not name the device to whoever asked.
        """
        await self.startLoaded(KMS)
        await self.addDevice("w1", "SN-1", UUID1)
        await self.approveBinding("SN-1")
        await self.provision("w1")  # a run, not yet delivered
        client, _ = self.kms()
        code, message = await self.refused(client.seal, UUID1, os.urandom(32))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, message)
        self.assertTrue(message.startswith("no-address: "), message)
        self.assertNotIn("w1", message)

    async def test_bindingNotApproved_refused(self) -> None:
        """[E1] Without an approved EK binding, Seal is refused
        FAILED_PRECONDITION and nothing is stored."""
        service = await self.startNode(approve=False)
        client, _ = self.kms()
        code, message = await self.refused(client.seal, UUID1, os.urandom(32))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertTrue(message.startswith("ek-binding-not-approved: "), message)
        rows = await service.runner.run(lambda db: store.keysOf(db, "w1"))
        self.assertEqual(rows, [])


class OptingClassTests(KMSDaemonMixin, TestCase):
    """[E4] The configuration of a class that opts in names the KMS."""

    async def test_delivered_namesTheBoundKmsPort_andItAnswers(self) -> None:
        """
        [E4] With C{[provision.class.worker] disk_encryption = "kms"} and the kms
        listener on C{tcp:0}, w1's delivered configuration carries STATE
        and EPHEMERAL keys whose endpoint is the enrollment name and the
        port the listener is bound to, and a Seal at that port answers.
        """
        optIn = {"class.worker.disk_encryption": "kms"}  # a dotted key
        await self.startLoaded({**KMS, "provision": optIn})
        await self.addDevice("w1", "SN-1", UUID1)
        await self.approveBinding("SN-1")
        code = (await self.provision("w1"))["w1"]
        status, body = await deferToThread(
            fetchFrom,
            self.port(self.service, "boot"),
            configPath(code, UUID1, "SN-1"),
            self.pki.public_ca,
            "127.0.0.1",
        )
        self.assertEqual(status, 200, body)
        machine = yaml.safe_load(body)["machine"]
        port = self.port(self.service, "kms")
        endpoint = f"https://{self.settings.topology.enrollment_name}:{port}"
        for partition in ("state", "ephemeral"):
            (key,) = machine["systemDiskEncryption"][partition]["keys"]
            self.assertEqual(key["kms"]["endpoint"], endpoint)
        await self.events("run.delivered")
        client, _ = self.kms()
        sealed = await self.seal(client, UUID1, os.urandom(32))
        self.assertTrue(sealed)


class KMSListenerTests(KMSDaemonMixin, TestCase):
    """The kms listener is one of fleetd's listeners: served with [kms]
    only, part of the TLS self-check that readiness waits for."""

    async def test_readyOnlyOnceKmsListenerPassesSelfCheck(self) -> None:
        """With C{[kms]}, fleetd is ready once a TLS handshake with ALPN h2
        succeeded on the kms listener too; its gauge says so."""
        await self.startLoaded(KMS)
        for _ in range(500):
            if self.service.readiness.state is State.READY:
                break
            await deferLater(reactor, 0.02, lambda: None)
        self.assertIs(self.service.readiness.state, State.READY)
        _, _, body = await self.get(self.service, "admin", "/metrics")
        self.assertIn(b'fleetd_listener_selfcheck_ok{listener="kms"} 1.0', body)

    async def test_alertRules_useExposedKmsMetrics(self) -> None:
        """Every fleetd_kms_ metric an alert rule uses is one fleetd
        exposes with C{[kms]} (FleetDiskUnlockRefused,
        FleetDiskKeyDestructionUnrecorded)."""
        await self.startLoaded(KMS)
        _, _, body = await self.get(self.service, "admin", "/metrics")
        exposed = exposedMetrics(body.decode())
        used = ruleMetrics("fleetd_kms_")
        self.assertEqual(
            used, {"fleetd_kms_refusals_total", "fleetd_kms_destructions_unrecorded"}
        )
        self.assertEqual(used - exposed, set())

    async def test_withoutKmsTable_noListener(self) -> None:
        """Without C{[kms]} nothing listens on C{listen.kms}, and no key is
        ever made."""
        await self.startLoaded({"listen": {"kms": "tcp:0:interface=127.0.0.1"}})
        self.assertNotIn("kms", self.service.listeners)
        self.assertIsNone(self.service.diskKeys)

    async def test_otherMethod_unimplemented(self) -> None:
        """A call to any other method of the kms listener is answered
        UNIMPLEMENTED, with no data; its lines name the kms listener, not
        the tink listener whose HTTP/2 server it shares."""
        logged = self.captureLogs()
        await self.startLoaded(KMS)
        await self.service.readiness.whenReady()
        before = len(logged)
        _, channel = self.kms()
        call = channel.unary_unary(
            "/sidero.kms.KMSService/Erase",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        code, _ = await self.refused(lambda u, d: call(d, timeout=10), UUID1, b"")
        self.assertEqual(code, grpc.StatusCode.UNIMPLEMENTED)
        formats = [str(e.get("log_format", "")) for e in logged[before:]]
        self.assertIn("kms.connected {source}", formats)
        self.assertEqual([f for f in formats if f.startswith("tink.")], [])
