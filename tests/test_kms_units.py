"""
The KMS's pieces without a daemon (issue 30): the sealed blob and the
wrapped key [E2], who may ask [E1], the refusal throttle, the gRPC
request's decoding.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from fleetd.h2.grpcwire import GRPCStatus
from fleetd.kms import blob
from fleetd.kms.access import normalHost, normalUUID
from fleetd.kms.proto import kms_pb2
from fleetd.kms.throttle import JOURNALED, KEYS, REFUSAL_EVERY, SourceThrottle
from fleetd.kmsgrpc.call import PATHS, KMSCall, frame, readRequest
from fleetd.refused import Refused

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"
OTHER = "4c4c4544-0042-3510-8050-b4c04f4d3233"


class BlobTests(SynchronousTestCase):
    """[E2] A blob opens with its own key, for its own uuid, unchanged."""

    def setUp(self) -> None:
        self.kek, self.keyId = blob.newKey(), blob.newKeyId()
        self.data = os.urandom(blob.PASSPHRASE_SIZE)
        self.sealed = blob.seal(self.kek, self.keyId, UUID, self.data)

    def test_roundTrip_sizeAndHeader(self) -> None:
        """[E2] The blob is version, key id, nonce and AES-GCM output; it
        names its key and opens to the passphrase."""
        self.assertEqual(len(self.sealed), blob.BLOB_SIZE)
        head = blob.header(self.sealed)
        self.assertEqual((head.version, head.keyId), (1, self.keyId))
        self.assertEqual(blob.unseal(self.kek, UUID, self.sealed), self.data)

    def test_uuidBoundAsAssociatedData(self) -> None:
        """[E2] The node uuid is bound: another uuid does not open it."""
        with self.assertRaises(blob.BlobError):
            blob.unseal(self.kek, OTHER, self.sealed)

    def test_anyChangedByte_refused(self) -> None:
        """[E2] Each byte of the blob, header included, is checked: a
        changed one is a refusal, never a guess."""
        for i in range(len(self.sealed)):
            changed = bytearray(self.sealed)
            changed[i] ^= 0x40
            with self.assertRaises(blob.BlobError):
                blob.unseal(self.kek, UUID, bytes(changed))

    def test_otherKey_refused(self) -> None:
        with self.assertRaises(blob.BlobError):
            blob.unseal(blob.newKey(), UUID, self.sealed)

    def test_shortOrOtherVersion_refused(self) -> None:
        with self.assertRaises(blob.BlobError):
            blob.header(self.sealed[:20])
        with self.assertRaises(blob.BlobError):
            blob.header(b"\x02" + self.sealed[1:])

    def test_wrappedKey_opensOnlyForItsRowAndMasterKey(self) -> None:
        """[E2] A wrapped key opens with the master key's wrapping key for
        its own key id, device and uuid only."""
        wrapping = os.urandom(32)
        wrapped = blob.wrap(wrapping, self.keyId, "w1", UUID, self.kek)
        self.assertNotIn(self.kek, wrapped)
        self.assertEqual(
            blob.unwrap(wrapping, self.keyId, "w1", UUID, wrapped), self.kek
        )
        for args in (
            (os.urandom(32), self.keyId, "w1", UUID),
            (wrapping, blob.newKeyId(), "w1", UUID),
            (wrapping, self.keyId, "w2", UUID),
            (wrapping, self.keyId, "w1", OTHER),
        ):
            with self.assertRaises(blob.BlobError):
                blob.unwrap(*args, wrapped)


class AccessTests(SynchronousTestCase):
    """[E1] The uuid and the address, normalised as Talos and TCP give them."""

    def test_uuid_lowercasedAndChecked(self) -> None:
        self.assertEqual(normalUUID(UUID.upper()), UUID)
        for bad in ("", "not-a-uuid", "0" * 8 + "-0000-0000-0000-" + "0" * 12):
            with self.assertRaises(Refused) as caught:
                normalUUID(bad)
            self.assertEqual(caught.exception.reason, "malformed")

    def test_address_mappedAndCompressed(self) -> None:
        self.assertEqual(normalHost("::ffff:10.1.2.3"), "10.1.2.3")
        self.assertEqual(normalHost("2001:DB8:0:0::1"), "2001:db8::1")
        self.assertEqual(normalHost("10.1.2.3"), "10.1.2.3")


class ThrottleTests(SynchronousTestCase):
    """[E1] Refusals are journaled once per source and reason every 10 s,
    the next entry counting the ones only counted."""

    def test_perSourceAndReason(self) -> None:
        clock = Clock()
        throttle = SourceThrottle(clock)
        self.assertEqual(throttle.admit("10.0.0.1", "unknown-node"), 0)
        self.assertIsNone(throttle.admit("10.0.0.1", "unknown-node"))
        self.assertIsNone(throttle.admit("10.0.0.1", "unknown-node"))
        self.assertEqual(throttle.admit("10.0.0.1", "retired"), 0)
        self.assertEqual(throttle.admit("10.0.0.2", "unknown-node"), 0)
        clock.advance(REFUSAL_EVERY)
        self.assertEqual(throttle.admit("10.0.0.1", "unknown-node"), 2)

    def test_manySources_journalBudget_andBoundedKeys(self) -> None:
        """
        Refusals from ever new sources (twice refused each): at most
        JOURNALED entries per period across all of them, the rest only
        counted (and told by their key's next entry); the keys held never
        exceed 2 x KEYS, however many sources there were.
        """
        clock = Clock()
        throttle = SourceThrottle(clock)
        journaled = 0
        for n in range(3 * KEYS):
            source = f"2001:db8:{n >> 16:x}:{n & 0xFFFF:x}::/64"
            for _ in range(2):
                journaled += throttle.admit(source, "unknown-node") is not None
            self.assertLessEqual(len(throttle), 2 * KEYS)
            if n % 500 == 499:
                clock.advance(REFUSAL_EVERY)
        periods = 3 * KEYS // 500 + 1
        self.assertLessEqual(journaled, JOURNALED * periods)
        self.assertGreater(journaled, 0)
        clock.advance(REFUSAL_EVERY)
        last = f"2001:db8:0:{3 * KEYS - 1:x}::/64"
        self.assertEqual(throttle.admit(last, "unknown-node"), 2)


class RequestTests(SynchronousTestCase):
    """The kms listener reads one uncompressed sidero.kms.Request."""

    def test_paths_areTalos(self) -> None:
        self.assertEqual(
            sorted(PATHS),
            [b"/sidero.kms.KMSService/Seal", b"/sidero.kms.KMSService/Unseal"],
        )

    def test_oneMessage(self) -> None:
        message = kms_pb2.Request(node_uuid=UUID, data=b"x" * 32)
        request = readRequest(frame(message.SerializeToString()))
        self.assertEqual((request.node_uuid, request.data), (UUID, b"x" * 32))

    def test_malformed_refused(self) -> None:
        body = frame(kms_pb2.Request(node_uuid=UUID).SerializeToString())
        for bad in (b"", body[:-1], body + body, b"\x01" + body[1:], frame(b"\xff")):
            with self.assertRaises(Refused) as caught:
                readRequest(bad)
            self.assertEqual(caught.exception.reason, "malformed")


class Responder:
    """What a L{KMSCall} sends, recorded."""

    peerHost = "10.0.0.9"

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.log = Logger()

    def trailersOnly(self, status: GRPCStatus, message: str = "") -> None:
        self.sent.append(("status", (status, message)))

    def sendHeaders(self, headers: object, endStream: bool = False) -> None:
        self.sent.append(("headers", headers))

    def sendData(self, data: bytes) -> None:
        self.sent.append(("data", data))

    def sendTrailers(self, trailers: object) -> None:
        self.sent.append(("trailers", trailers))


class Keys:
    """A KMS whose answers the test gives."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, bytes, str]] = []
        self.pending: list[Deferred[bytes]] = []

    def _ask(self, method: str, uuid: str, data: bytes, peer: str) -> Deferred[bytes]:
        self.asked.append((method, uuid, data, peer))
        d: Deferred[bytes] = Deferred()
        self.pending.append(d)
        return d

    def seal(self, uuid: str, data: bytes, peer: str) -> Deferred[bytes]:
        return self._ask("seal", uuid, data, peer)

    def unseal(self, uuid: str, data: bytes, peer: str) -> Deferred[bytes]:
        return self._ask("unseal", uuid, data, peer)


class CallTests(SynchronousTestCase):
    """One unary call on the kms listener: answered once, in time."""

    def call(self, path: bytes = b"/sidero.kms.KMSService/Unseal") -> None:
        self.clock, self.responder, self.keys = Clock(), Responder(), Keys()
        self.handler = KMSCall(self.responder, self.keys, self.clock, 5.0)  # type: ignore[arg-type]
        self.handler.headersReceived([(b":path", path)])
        body = frame(
            kms_pb2.Request(node_uuid=UUID, data=b"b" * 60).SerializeToString()
        )
        self.handler.dataReceived(body[:3])
        self.handler.dataReceived(body[3:])
        self.handler.endReceived()

    def test_answer_dataThenStatusZero(self) -> None:
        """The KMS's answer goes out as one Response and grpc-status 0; the
        KMS was given the connection's source address."""
        self.call()
        self.assertEqual(self.keys.asked, [("unseal", UUID, b"b" * 60, "10.0.0.9")])
        self.keys.pending[0].callback(b"p" * 32)
        kinds = [kind for kind, _ in self.responder.sent]
        self.assertEqual(kinds, ["headers", "data", "trailers"])
        data = self.responder.sent[1][1]
        assert isinstance(data, bytes)
        self.assertEqual(kms_pb2.Response.FromString(data[5:]).data, b"p" * 32)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_refused_statusOfItsReason(self) -> None:
        """[E1] A refusal is the gRPC status of its reason, its line first."""
        self.call()
        self.keys.pending[0].errback(Refused("retired", "this node is retired"))
        [(kind, (status, message))] = self.responder.sent
        self.assertEqual((kind, status), ("status", GRPCStatus.PERMISSION_DENIED))
        self.assertEqual(message, "retired: this node is retired")

    def test_late_unavailableOnce(self) -> None:
        """A KMS that does not answer within kms.call_timeout: UNAVAILABLE,
        and its late answer is dropped."""
        self.call()
        self.clock.advance(5.0)
        self.keys.pending[0].callback(b"p" * 32)
        [(kind, (status, _))] = self.responder.sent
        self.assertEqual((kind, status), ("status", GRPCStatus.UNAVAILABLE))

    def test_reset_nothingSent(self) -> None:
        """A call the client reset is never answered."""
        self.call()
        self.handler.reset(8)
        self.keys.pending[0].callback(b"p" * 32)
        self.assertEqual(self.responder.sent, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_messagesWithoutEnd_refusedNotBuffered(self) -> None:
        """
        A stream that keeps sending messages (each within the server's
        per-message bound) and never half-closes is refused INVALID_ARGUMENT
        once its body passes one message, and nothing more is kept.
        """
        self.clock, self.responder, self.keys = Clock(), Responder(), Keys()
        handler = KMSCall(self.responder, self.keys, self.clock, 5.0, 64)  # type: ignore[arg-type]
        handler.headersReceived([(b":path", b"/sidero.kms.KMSService/Seal")])
        message = frame(b"x" * 60)
        for _ in range(1000):
            handler.dataReceived(message)
        [(kind, (status, line))] = self.responder.sent
        self.assertEqual((kind, status), ("status", GRPCStatus.INVALID_ARGUMENT))
        self.assertTrue(line.startswith("malformed: "), line)
        self.assertEqual(len(handler._body), 0)
        handler.endReceived()
        self.assertEqual(self.keys.asked, [])

    def test_otherPath_unimplemented_kmsNotAsked(self) -> None:
        self.call(b"/sidero.kms.KMSService/Other")
        self.assertEqual(self.keys.asked, [])
        [(kind, (status, _))] = self.responder.sent
        self.assertEqual((kind, status), ("status", GRPCStatus.UNIMPLEMENTED))
