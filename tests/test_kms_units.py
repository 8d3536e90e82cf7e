"""
The KMS's pieces without a daemon (issue 30): the sealed blob and the
wrapped key [E2], who may ask [E1], the refusal throttle, the gRPC
request's decoding.
"""

from __future__ import annotations

import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.kms import blob
from fleetd.kms.access import normalHost, normalUUID
from fleetd.kms.proto import kms_pb2
from fleetd.kms.throttle import REFUSAL_EVERY, SourceThrottle
from fleetd.kmsgrpc.call import PATHS, frame, readRequest
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
