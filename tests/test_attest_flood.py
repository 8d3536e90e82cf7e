"""
A stranger replaying a node's public claim (issue 17, item 9) [T1] [T3].

The EK certificate, the EK and AK public areas and the bound serial are
not secrets: anyone can send a node's claim again. Doing so must not
cancel the node's outstanding challenge, must not lock out an honest node
that restarts its attest action for long, must not fill the challenge
book, and must not write a journal entry (mirrored to NetBox) per request
naming the device [J1].
"""

from __future__ import annotations

import io
import json
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import getChildForRequest
from twisted.web.test.requesthelper import DummyRequest

from fleetd import nodes
from fleetd.attest.challenge import PER_KEY
from fleetd.attest.results import AttestResults
from fleetd.attest.throttle import KEYS, NAMED_EVERY, JournalThrottle
from fleetd.attest.tpm import ekDigest, spkiOf
from fleetd.device.attest import deviceAPI
from fleetd.device.refusals import statusOf
from tests.attestserver import HoldsTestCase
from tests.softtpm import SoftNode


class PendingChallengeTests(HoldsTestCase):
    """[T1] [T3] A pending challenge stays until answered or expired."""

    def test_strangerReplay_keepsNodesChallenge(self) -> None:
        """
        [T1] Someone sending the node's claim again after the node got its
        challenge (the same EK certificate, public areas and serial) gets a
        challenge of their own; the node's challenge is still answered and
        the node gets its LDevID.
        """
        mine = self.challenge()
        stranger = self.successResultOf(self.begin(self.node.claim()))
        self.assertNotEqual(stranger["challenge"], mine["challenge"])
        self.successResultOf(self.prove(self.node.proof(mine)))
        self.assertEqual(self.issued(), ["attest"])

    def test_fewPerEK_thenRefusedUntilOneExpires(self) -> None:
        """
        [T1] An EK holds at most PER_KEY pending challenges; the next begin
        is refused (challenges-pending, 429) with the seconds until the
        oldest expires, and once it expires a new begin (an honest node
        restarting its attest action) gets a challenge at once.
        """
        first = self.challenge()
        for _ in range(PER_KEY - 1):
            self.challenge()
        self.server.clock.advance(20)
        refusal = self.refused(self.begin(self.node.claim()), "challenges-pending")
        self.assertEqual(statusOf(refusal), 429)
        self.assertIn("retry in 40 s", refusal.line())
        self.assertEqual(len(self.server.service.challenges), PER_KEY)
        # The pending ones are intact: the first is still answered.
        self.successResultOf(self.prove(self.node.proof(first)))
        # Answering made room; so does expiry.
        self.challenge()
        self.refused(self.begin(self.node.claim()), "challenges-pending")
        self.server.clock.advance(first["ttl"])
        self.challenge()

    def test_pendingOverHTTP_429WithRetryAfter(self) -> None:
        """
        [T1] Over the device listener the refusal is a 429 line starting
        with challenges-pending, and Retry-After carries the same seconds.
        """
        for _ in range(PER_KEY):
            self.challenge()
        self.server.clock.advance(15)
        api = deviceAPI(self.server.service, self.server.identify, None)
        request = DummyRequest([b"attest", b"challenge"])
        request.method = b"POST"
        request.content = io.BytesIO(json.dumps(self.node.claim()).encode())  # type: ignore[attr-defined]
        request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
        getChildForRequest(api, request).render(request)
        body = b"".join(request.written).decode()
        self.assertEqual(request.responseCode, 429)
        self.assertTrue(body.startswith("challenges-pending: "), body)
        self.assertIn("retry in 45 s", body)
        self.assertEqual(request.responseHeaders.getRawHeaders(b"retry-after"), [b"45"])

    def test_answeredAndExpired_makeRoom(self) -> None:
        """
        [T3] Answered or expired challenges (remembered one more TTL for
        late nodes) give way to new ones: consuming one's own challenges
        cannot fill the book, and a full book of such entries still takes
        another EK. Only pending challenges make it busy; timers stay one
        per entry.
        """
        book = self.server.service.challenges
        book.limit = PER_KEY + 1
        other = SoftNode(self.caCert, self.caKey, serial="SER2")
        self.server.bindings.approved[ekDigest(spkiOf(other.ekPublic))] = "SER2"
        for _ in range(20):
            answer = self.node.proof(self.challenge(), secret="QUFBQQ==")
            self.refused(self.prove(answer), "activation-failed")
        self.assertLessEqual(len(book), book.limit)
        self.challenge(other)
        for _ in range(PER_KEY):
            self.challenge()
        self.assertEqual(len(book), book.limit)
        third = SoftNode(self.caCert, self.caKey, serial="SER3")
        self.server.addDevice("w3", "SER3")
        self.server.bindings.approved[ekDigest(spkiOf(third.ekPublic))] = "SER3"
        self.refused(self.begin(third.claim()), "busy")
        self.assertEqual(len(self.server.clock.getDelayedCalls()), len(book))


class NamedRefusalThrottleTests(HoldsTestCase):
    """[J1] Refusals that name a device: one entry per device and reason."""

    def named(self, reason: str, device: str = "w1") -> list[Any]:
        return [
            e
            for e in self.server.entries("attest.refused")
            if e.device == device and e.fields["reason"] == reason
        ]

    def test_floodOfBegins_oneEntryThenSkippedCount(self) -> None:
        """
        [J1] 200 refused begins naming one device within a second are
        journaled once per NAMED_EVERY seconds, the next entry of
        that device and reason saying how many were not journaled. Another
        reason, or another device, is journaled on its own.
        """
        self.retire("w1")
        for _ in range(200):
            self.begin(self.node.claim()).addErrback(lambda f: None)
        self.assertEqual(len(self.named("device-retired")), 1)
        self.assertEqual(len(self.server.entries("attest.refused")), 1)
        self.server.clock.advance(NAMED_EVERY - 1)
        self.begin(self.node.claim()).addErrback(lambda f: None)
        self.assertEqual(len(self.named("device-retired")), 1)
        self.server.clock.advance(1)
        self.refused(self.begin(self.node.claim()), "device-retired")
        entries = self.named("device-retired")
        self.assertEqual(len(entries), 2)
        self.assertNotIn("not_journaled", entries[0].fields)
        self.assertEqual(entries[1].fields["not_journaled"], 200)
        # Another device, and another reason of the same device: at once.
        other = SoftNode(self.caCert, self.caKey, serial="SER2")
        self.server.bindings.approved[ekDigest(spkiOf(other.ekPublic))] = "SER2"
        self.refused(self.begin(other.claim(ak_public="AAAA")), "malformed")
        self.retire("w2")
        self.refused(self.begin(other.claim()), "device-retired")
        self.assertEqual(len(self.named("malformed", "w2")), 1)
        self.assertEqual(len(self.named("device-retired", "w2")), 1)
        self.assertEqual(len(self.server.entries("attest.refused")), 4)
        # Four entries; every refusal counted, journaled or not.
        self.assertEqual(self.server.results(), {"device-retired": 203, "malformed": 1})

    def test_pendingRefusals_throttledToo(self) -> None:
        """
        [J1] [T1] Begins refused because the EK's challenges are pending name
        the device and are journaled once per device and reason too.
        """
        for _ in range(200):
            self.begin(self.node.claim()).addErrback(lambda f: None)
        self.assertEqual(len(self.server.service.challenges), PER_KEY)
        self.assertEqual(len(self.named("challenges-pending")), 1)
        self.server.clock.advance(NAMED_EVERY)
        self.refused(self.begin(self.node.claim()), "challenges-pending")
        last = self.named("challenges-pending")[-1]
        self.assertEqual(last.fields["not_journaled"], 200 - PER_KEY - 1)


class JournalThrottleTests(SynchronousTestCase):
    """[J1] The throttle's memory stays bounded."""

    def test_keysWithNothingToTell_pruned(self) -> None:
        """
        Past KEYS keys, those whose window has passed with nothing skipped
        are forgotten; a key with a skipped count is kept until it is told.
        """
        clock = Clock()
        throttle = JournalThrottle(clock)
        self.assertEqual(throttle.admit("w0", "r"), 0)
        self.assertIsNone(throttle.admit("w0", "r"))
        for n in range(1, KEYS):
            self.assertEqual(throttle.admit(f"w{n}", "r"), 0)
        clock.advance(NAMED_EVERY)
        self.assertEqual(len(throttle), KEYS)
        self.assertEqual(throttle.admit(None, "r"), 0)
        self.assertEqual(len(throttle), 2)
        self.assertEqual(throttle.admit("w0", "r"), 1)


class ResultLabelsTests(SynchronousTestCase):
    """fleetd_attest_results_total's result label is a closed set."""

    def test_everyReasonCode_aLabel(self) -> None:
        """Every refusal code of L{fleetd.nodes} is in REASONS, created at 0."""
        codes = {
            value
            for name, value in vars(nodes).items()
            if name.isupper() and isinstance(value, str)
        }
        self.assertEqual(nodes.REASONS, codes)
        registry = CollectorRegistry()
        AttestResults(registry)
        for result in codes | {"accepted", "renewed", "other"}:
            value = registry.get_sample_value(
                "fleetd_attest_results_total", {"result": result}
            )
            self.assertEqual(value, 0.0, result)

    def test_unknownCode_countedAsOther(self) -> None:
        """A code outside the set never becomes a label value of its own."""
        registry = CollectorRegistry()
        AttestResults(registry).refused("w1<script>")
        name = "fleetd_attest_results_total"
        self.assertEqual(registry.get_sample_value(name, {"result": "other"}), 1.0)
        self.assertIsNone(registry.get_sample_value(name, {"result": "w1<script>"}))
