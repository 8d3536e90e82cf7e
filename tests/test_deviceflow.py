"""Tests for L{fleetd.boot.deviceflow}: RFC 8628 as Talos's client uses it."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from fleetd.boot.deviceflow import (
    ALPHABET,
    GRANT_TYPE,
    DeviceFlow,
    DeviceFlowError,
    Grant,
    displayUserCode,
    normaliseUserCode,
)
from fleetd.boot.deviceflow_resource import requestJSON
from fleetd.boot.ratelimit import RateLimiter

USER_CODE = re.compile(f"[{ALPHABET}]{{4}}-[{ALPHABET}]{{4}}")
REPORTED = {
    "uuid": "4c4c4544-0037-3010-8052-b4c04f4e3332",
    "serial": "S1",
    "mac": "12:34:56:78:9a:bc",
    "hostname": "talos-abc",
    "code": "one-time-secret-code-value",
}


class FakeRuns:
    """An L{IRunLookup} over a dict, recording what it was asked."""

    def __init__(self, ready: dict[str, str] | None = None) -> None:
        self.ready = {"w1": "run-1"} if ready is None else ready
        self.asked: list[str] = []

    def readyRun(self, device: str) -> str | None:
        self.asked.append(device)
        return self.ready.get(device)

    def identity(self, device: str) -> tuple[str, str] | None:
        # By default every device is the machine REPORTED describes.
        return self.identities.get(device, (REPORTED["uuid"], REPORTED["serial"]))

    identities: dict[str, tuple[str, str]] = {}


class FlowTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.runs = FakeRuns()
        self.flow = self.makeFlow()

    def makeFlow(self, **kwargs: Any) -> DeviceFlow:
        options: dict[str, Any] = {
            "verificationURI": "https://enroll.example/device",
            "maxPerSource": 10_000,  # most tests ask from one address
        }
        options.update(kwargs)
        return DeviceFlow(self.clock, self.runs, **options)

    def request(
        self, flow: DeviceFlow | None = None, peer: str = "192.0.2.10", **form: str
    ) -> dict[str, Any]:
        fields = {"client_id": "talos", **REPORTED}
        fields.update(form)
        status, document = (flow or self.flow).requestCode(fields, peer)
        self.assertEqual(status, 200, document)
        return document

    def poll(
        self,
        deviceCode: str,
        flow: DeviceFlow | None = None,
        peer: str = "192.0.2.10",
        **form: str,
    ) -> tuple[int, dict[str, object]]:
        fields = {
            "grant_type": GRANT_TYPE,
            "device_code": deviceCode,
            "client_id": "talos",
        }
        fields.update(form)
        return (flow or self.flow).poll(fields, peer)

    def assertError(self, answer: tuple[int, dict[str, object]], error: str) -> None:
        self.assertEqual((answer[0], answer[1]["error"]), (400, error), answer)


class RequestCodeTests(FlowTestCase):
    def test_answer_rfc8628(self) -> None:
        """/device/code answers the RFC 8628 section 3.2 members, numbers as numbers."""
        document = self.request()
        self.assertEqual(
            set(document),
            {"device_code", "user_code", "verification_uri", "expires_in", "interval"},
        )
        self.assertEqual(document["verification_uri"], "https://enroll.example/device")
        self.assertEqual((document["expires_in"], document["interval"]), (600, 5))
        self.assertIsInstance(document["interval"], int)
        self.assertRegex(document["user_code"], USER_CODE)
        # token_urlsafe(32): 32 random bytes, 43 base64url characters
        self.assertGreaterEqual(len(document["device_code"]), 43)
        json.dumps(document)

    def test_clientID_required(self) -> None:
        """A request without client_id is 400 invalid_request."""
        status, document = self.flow.requestCode({"uuid": "u"}, "192.0.2.1")
        self.assertEqual((status, document["error"]), (400, "invalid_request"))
        self.assertEqual(self.flow.pending(), [])

    def test_values_boundedAndPrintable(self) -> None:
        """Over-long or unprintable values are 400 invalid_request."""
        for bad in ({"serial": "x" * 257}, {"hostname": "a\nb"}, {"scope": "\x00"}):
            status, document = self.flow.requestCode(
                {"client_id": "talos", **bad}, "192.0.2.1"
            )
            self.assertEqual((status, document["error"]), (400, "invalid_request"))

    def test_unknownFields_ignored(self) -> None:
        """Unrecognised parameters are ignored (RFC 6749 section 3.1)."""
        self.request(audience="x", scope="openid", whatever="1")
        (pending,) = self.flow.pending()
        self.assertEqual(set(pending.reported), set(REPORTED))

    def test_reported_keptButCodeHidden(self) -> None:
        """
        What the node reported is kept; the code is neither in the JSON
        listing nor in repr, only whether it was sent.
        """
        self.request(peer="192.0.2.44")
        (pending,) = self.flow.pending()
        self.assertEqual(pending.reported["serial"], "S1")
        self.assertEqual(pending.peer, "192.0.2.44")
        self.assertEqual(pending.state, "pending")
        listed = requestJSON(pending)
        self.assertTrue(listed["code_sent"])
        self.assertNotIn("code", listed["reported"])
        self.assertNotIn(REPORTED["code"], json.dumps(listed))
        self.assertNotIn(REPORTED["code"], repr(pending))
        self.request(code="")  # sent, even if empty
        fields = dict(REPORTED)
        del fields["code"]
        self.flow.requestCode({"client_id": "talos", **fields}, "192.0.2.1")
        self.assertEqual(
            [p.code_sent for p in self.flow.pending()], [True, True, False]
        )

    def test_rateLimited_429(self) -> None:
        """Beyond the per-source budget, /device/code is 429 rate_limited."""
        limiter = RateLimiter(
            self.clock, rate=0.1, burst=2, globalRate=100, globalBurst=100
        )
        flow = self.makeFlow(limiter=limiter)
        self.request(flow)
        self.request(flow)
        status, document = flow.requestCode({"client_id": "t"}, "192.0.2.10")
        self.assertEqual((status, document), (429, {"error": "rate_limited"}))
        self.assertEqual(flow.retryAfter("192.0.2.10"), 10)
        self.request(flow, peer="192.0.2.11")  # another source is unaffected

    def test_maxPending_503(self) -> None:
        """
        At most maxPending requests are held; then 503 until the oldest
        expires, when it makes room.
        """
        flow = self.makeFlow(maxPending=2)
        self.request(flow)
        self.clock.advance(100)
        self.request(flow)
        status, document = flow.requestCode({"client_id": "t"}, "192.0.2.10")
        self.assertEqual((status, document["error"]), (503, "temporarily_unavailable"))
        self.assertEqual(flow.retryAfter("192.0.2.10"), 501)
        self.clock.advance(500)
        self.request(flow)
        self.assertEqual(len(flow.pending()), 2)

    def test_userCode_alphabetAndUnique(self) -> None:
        """User codes are 8 letters of BCDFGHJKLMNPQRSTVWXZ, XXXX-XXXX, unique."""
        codes = {self.request()["user_code"] for _ in range(300)}
        self.assertEqual(len(codes), 300)
        for code in codes:
            self.assertRegex(code, USER_CODE)

    def test_userCode_collisionRedrawn(self) -> None:
        """A user code already held is never handed out again; a new one is drawn."""
        letters: Iterator[str] = iter("BBBBBBBBBBBBBBBBCCCCCCCC")
        self.patch(secrets, "choice", lambda _: next(letters))
        self.assertEqual(self.request()["user_code"], "BBBB-BBBB")
        self.assertEqual(self.request()["user_code"], "CCCC-CCCC")


class UserCodeTests(SynchronousTestCase):
    def test_normalise_ignoresCaseDashesSpace(self) -> None:
        """Input is case-insensitive and ignores dashes and whitespace (6.1)."""
        for text in (
            "BCDF-GHJK",
            "bcdf-ghjk",
            " bcdf ghjk\t",
            "BC-DF-GH-JK",
            "bcdfghjk",
        ):
            self.assertEqual(normaliseUserCode(text), "BCDFGHJK", text)

    def test_normalise_refusesOthers(self) -> None:
        """Vowels, digits, wrong lengths and huge inputs are not user codes."""
        for text in (
            "BCDF-GHJA",
            "BCDF-GHJ1",
            "BCDF-GHJ",
            "BCDF-GHJKL",
            "",
            "-" * 9999,
        ):
            self.assertIsNone(normaliseUserCode(text), text)

    def test_display(self) -> None:
        """User codes are displayed as XXXX-XXXX."""
        self.assertEqual(displayUserCode("WDJBMJHT"), "WDJB-MJHT")


class PollTests(FlowTestCase):
    def test_pending_thenToken(self) -> None:
        """
        Polls answer authorization_pending until approval; the next poll
        gets a Bearer token, whose Grant is the device's ready run.
        """
        document = self.request()
        self.assertError(self.poll(document["device_code"]), "authorization_pending")
        view = self.flow.approve(document["user_code"], "w1", "alice")
        self.assertEqual(
            (view.state, view.device, view.run), ("approved", "w1", "run-1")
        )
        self.clock.advance(5)
        status, token = self.poll(document["device_code"])
        self.assertEqual(status, 200)
        self.assertEqual(token["token_type"], "Bearer")
        self.assertEqual(token["expires_in"], 3600)
        self.assertEqual(
            self.flow.authorize(str(token["access_token"])), Grant("w1", "run-1")
        )

    def test_token_onlyOnce(self) -> None:
        """The token is handed out once; later polls are invalid_grant."""
        document = self.request()
        self.flow.approve(document["user_code"], "w1", "alice")
        self.assertEqual(self.poll(document["device_code"])[0], 200)
        self.assertError(self.poll(document["device_code"]), "invalid_grant")
        with self.assertRaises(DeviceFlowError) as e:
            self.flow.deny(document["user_code"], "alice")
        self.assertEqual(e.exception.kind, "already-decided")

    def test_authorize_unknownAndExpired(self) -> None:
        """authorize is None for unknown tokens and once the token expired."""
        document = self.request()
        self.flow.approve(document["user_code"], "w1", "alice")
        token = str(self.poll(document["device_code"])[1]["access_token"])
        self.assertIsNone(self.flow.authorize(token[:-1] + "x"))
        self.assertIsNone(self.flow.authorize(""))
        self.assertIsNone(self.flow.authorize("x" * 10_000))
        self.clock.advance(3599)
        self.assertIsNotNone(self.flow.authorize(token))
        self.clock.advance(1)
        self.assertIsNone(self.flow.authorize(token))

    def test_denied_accessDenied(self) -> None:
        """After deny, every poll is access_denied (the client stops)."""
        document = self.request()
        view = self.flow.deny(document["user_code"], "alice")
        self.assertEqual((view.state, view.decided_by), ("denied", "alice"))
        for _ in range(2):
            self.clock.advance(5)
            self.assertError(self.poll(document["device_code"]), "access_denied")

    def test_expired_expiredToken(self) -> None:
        """
        After expires_in, polls are expired_token for one more lifetime,
        then the request is forgotten (invalid_grant).
        """
        document = self.request()
        self.clock.advance(600)
        self.assertError(self.poll(document["device_code"]), "expired_token")
        self.assertEqual(self.flow.pending(), [])
        self.clock.advance(600)
        self.assertError(self.poll(document["device_code"]), "invalid_grant")

    def test_firstPollAndProbePairs_notTooFast(self) -> None:
        """
        golang.org/x/oauth2 polls once right away, then every interval, and
        sends each unsuccessful poll twice back to back: no slow_down.
        """
        code = self.request()["device_code"]
        for _ in range(6):
            self.assertError(self.poll(code), "authorization_pending")
            self.assertError(self.poll(code), "authorization_pending")
            self.clock.advance(5)

    def test_slowDown_intervalGrowsBy5(self) -> None:
        """
        Polling faster than the interval is slow_down, and the interval for
        that request grows by 5 s each time (RFC 8628 section 3.5).
        """
        code = self.request()["device_code"]
        interval = 5
        for _ in range(3):
            self.assertError(self.poll(code), "authorization_pending")
            self.assertError(self.poll(code), "authorization_pending")
            self.assertError(self.poll(code), "slow_down")
            self.assertError(self.poll(code), "slow_down")  # the probe's twin
            interval += 5
            self.clock.advance(interval - 5)
            self.assertError(self.poll(code), "slow_down")  # old interval: too soon
            self.clock.advance(5)
        self.assertError(self.poll(code), "authorization_pending")

    def test_badGrantType(self) -> None:
        """Another grant_type is unsupported_grant_type; none is invalid_request."""
        code = self.request()["device_code"]
        self.assertError(
            self.poll(code, grant_type="authorization_code"), "unsupported_grant_type"
        )
        status, document = self.flow.poll({"device_code": code}, "192.0.2.10")
        self.assertEqual((status, document["error"]), (400, "invalid_request"))

    def test_missingParameters_invalidRequest(self) -> None:
        """A poll without device_code or client_id is invalid_request."""
        for missing in ("device_code", "client_id"):
            form = {"grant_type": GRANT_TYPE, "device_code": "x", "client_id": "t"}
            del form[missing]
            status, document = self.flow.poll(form, "192.0.2.10")
            self.assertEqual((status, document["error"]), (400, "invalid_request"))

    def test_unknownDeviceCode_invalidGrant(self) -> None:
        """An unknown device code, or another client's, is invalid_grant."""
        code = self.request()["device_code"]
        self.assertError(self.poll("nope"), "invalid_grant")
        self.assertError(self.poll(code, client_id="other"), "invalid_grant")

    def test_unknownDeviceCode_rateLimited(self) -> None:
        """
        Unknown device codes and bad polls spend from the source's budget,
        then get 429; known device codes are never limited.
        """
        limiter = RateLimiter(
            self.clock, rate=0.01, burst=4, globalRate=100, globalBurst=100
        )
        flow = self.makeFlow(limiter=limiter)
        code = self.request(flow)["device_code"]  # spends one
        self.assertError(self.poll("guess-1", flow), "invalid_grant")
        self.assertError(
            self.poll("guess-2", flow, grant_type="x"), "unsupported_grant_type"
        )
        self.assertEqual(flow.malformed("192.0.2.10", "bad")[0], 400)
        self.assertEqual(self.poll("guess-3", flow), (429, {"error": "rate_limited"}))
        self.assertGreaterEqual(flow.retryAfter("192.0.2.10"), 1)
        self.clock.advance(5)
        self.assertError(self.poll(code, flow), "authorization_pending")

    def test_hammering_slowDownThen429(self) -> None:
        """
        slow_down answers spend from the source's budget: a node hammering
        with a valid device code ends up with cheap 429s.
        """
        limiter = RateLimiter(
            self.clock, rate=0.01, burst=5, globalRate=100, globalBurst=100
        )
        flow = self.makeFlow(limiter=limiter)
        code = self.request(flow)["device_code"]
        answers = [self.poll(code, flow)[1]["error"] for _ in range(8)]
        self.assertEqual(
            answers,
            ["authorization_pending"] * 2 + ["slow_down"] * 4 + ["rate_limited"] * 2,
        )

    def test_noTimers(self) -> None:
        """The flow arms no timers: expiry is lazy, so nothing to cancel."""
        document = self.request()
        self.poll(document["device_code"])
        self.flow.approve(document["user_code"], "w1", "alice")
        self.poll(document["device_code"])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class ApproveTests(FlowTestCase):
    def test_approve_normalisesInput(self) -> None:
        """The owner may type the user code in any case, with or without dash."""
        document = self.request()
        typed = document["user_code"].lower().replace("-", " ")
        self.assertEqual(self.flow.approve(typed, "w1", "alice").device, "w1")

    def test_approve_noReadyRun(self) -> None:
        """Approving for a device without a ready run is refused: provision first."""
        document = self.request()
        with self.assertRaises(DeviceFlowError) as e:
            self.flow.approve(document["user_code"], "w2", "alice")
        self.assertEqual(e.exception.kind, "no-ready-run")
        self.assertIn("provision w2 first", str(e.exception))
        self.assertEqual(self.flow.pending()[0].state, "pending")

    def test_approve_unknownAndExpired(self) -> None:
        """Unknown user codes and expired requests are refused with their kind."""
        document = self.request()
        with self.assertRaises(DeviceFlowError) as e:
            self.flow.approve("BBBB-BBBB", "w1", "alice")
        self.assertEqual(e.exception.kind, "unknown-user-code")
        self.clock.advance(600)
        with self.assertRaises(DeviceFlowError) as e:
            self.flow.approve(document["user_code"], "w1", "alice")
        self.assertEqual(e.exception.kind, "expired")

    def test_approve_alreadyDecided(self) -> None:
        """A request is decided once: approve or deny again is refused."""
        document = self.request()
        self.flow.deny(document["user_code"], "alice")
        for decide in (
            lambda: self.flow.approve(document["user_code"], "w1", "bob"),
            lambda: self.flow.deny(document["user_code"], "bob"),
        ):
            with self.assertRaises(DeviceFlowError) as e:
                decide()
            self.assertEqual(e.exception.kind, "already-decided")
            self.assertIn("already denied", str(e.exception))

    def test_approve_badDeviceName(self) -> None:
        """A device name that cannot be one is refused as invalid."""
        document = self.request()
        with self.assertRaises(DeviceFlowError) as e:
            self.flow.approve(document["user_code"], "a\nb", "alice")
        self.assertEqual(e.exception.kind, "invalid")

    def test_approve_tooManyAttempts(self) -> None:
        """
        After 5 unknown user codes (RFC 8628 section 5.1's budget) every
        approval is refused for a while, a right one included; the budget
        comes back with time.
        """
        document = self.request()
        for n in range(5):
            with self.assertRaises(DeviceFlowError) as e:
                self.flow.approve(f"BBBB-BBB{ALPHABET[n]}", "w1", "mallory")
            self.assertEqual(e.exception.kind, "unknown-user-code")
        with self.assertRaises(DeviceFlowError) as e:
            self.flow.approve(document["user_code"], "w1", "mallory")
        self.assertEqual(e.exception.kind, "too-many-attempts")
        self.clock.advance(120)
        self.flow.approve(document["user_code"], "w1", "mallory")

    def test_approve_globalBudget(self) -> None:
        """Failed approvals are also capped overall, across owners."""
        document = self.request()
        for n in range(10):
            with self.assertRaises(DeviceFlowError):
                self.flow.approve("BBBB-BBBB", "w1", f"owner{n % 3}")
        with self.assertRaises(DeviceFlowError) as e:
            self.flow.approve(document["user_code"], "w1", "someone-else")
        self.assertEqual(e.exception.kind, "too-many-attempts")

    def test_approve_touchesNoBinding(self) -> None:
        """
        [T1] A device-flow approval only asks for the device's ready run;
        it has no access to EK bindings and approves none.
        """
        document = self.request()
        self.flow.approve(document["user_code"], "w1", "alice")
        self.assertEqual(self.runs.asked, ["w1"])

    def test_pending_onlyUndecided(self) -> None:
        """pending() lists undecided, unexpired requests, oldest first."""
        first = self.request()
        self.clock.advance(1)
        second = self.request()
        self.clock.advance(1)
        third = self.request()
        self.flow.deny(second["user_code"], "alice")
        self.assertEqual(
            [p.user_code for p in self.flow.pending()],
            [first["user_code"], third["user_code"]],
        )


class SecretsTests(FlowTestCase):
    def test_noSecretInLogsOrListings(self) -> None:
        """
        Device codes, access tokens and the reported code never appear in a
        log event or the pending listing; user codes and peers do.
        """
        with capturedLogs() as events:
            document = self.request()
            self.poll(document["device_code"])
            listing = json.dumps([requestJSON(p) for p in self.flow.pending()])
            self.flow.approve(document["user_code"], "w1", "alice")
            token = str(self.poll(document["device_code"])[1]["access_token"])
            self.flow.authorize(token)
            self.poll(document["device_code"])
            self.poll("unknown-device-code")
            with self.assertRaises(DeviceFlowError):
                self.flow.approve("BBBB-BBBB", "w1", "alice")
        text = "\n".join(formatEvent(e) + repr(e) for e in events)
        for secret in (document["device_code"], token, REPORTED["code"]):
            self.assertNotIn(secret, text)
            self.assertNotIn(secret, listing)
        self.assertIn(document["user_code"], text)
        names = {e["log_format"].split(" ", 1)[0] for e in events}
        self.assertTrue(
            {
                "deviceflow.requested",
                "deviceflow.approved",
                "deviceflow.issued",
                "deviceflow.refused",
            }
            <= names,
            names,
        )


class PerSourceTests(SynchronousTestCase):
    def test_maxPerSource_fewAddressesCannotFillEverySlot(self) -> None:
        """
        Live requests are capped per source (IPv6 by /64), so a handful of
        addresses cannot hold every pending slot; forgetting frees the slot.
        """
        clock = Clock()
        flow = DeviceFlow(
            clock, FakeRuns(), verificationURI="https://e/device",
            maxPerSource=2, maxPending=100, expiresIn=60,
        )  # fmt: skip
        form = {"client_id": "talos"}
        answers = [flow.requestCode(form, f"2001:db8::{i}")[0] for i in range(1, 4)]
        self.assertEqual(answers, [200, 200, 429])
        self.assertEqual(flow.requestCode(form, "192.0.2.1")[0], 200)
        clock.advance(61)  # expired requests no longer count
        self.assertEqual(flow.requestCode(form, "2001:db8::9")[0], 200)


class MismatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.runs = FakeRuns()
        self.runs.identities = {
            "w1": (REPORTED["uuid"], "S1"),
            "w2": (REPORTED["uuid"], "S9"),
        }
        self.runs.ready["w2"] = "run-2"
        self.flow = DeviceFlow(Clock(), self.runs, verificationURI="https://e/device")
        status, self.document = self.flow.requestCode(
            {"client_id": "talos", **REPORTED}, "192.0.2.10"
        )
        self.assertEqual(status, 200)

    def test_approve_refusesMismatchUnlessForced(self) -> None:
        """
        The server refuses to bind a request whose reported serial differs
        from the device's (RFC 8628 5.4 remote phishing), unless forced.
        """
        userCode = str(self.document["user_code"])
        error = self.assertRaises(
            DeviceFlowError, self.flow.approve, userCode, "w2", "o"
        )
        self.assertEqual(error.kind, "mismatch")
        self.assertIn("serial", str(error))
        view = self.flow.approve(userCode, "w2", "o", force=True)
        self.assertEqual((view.state, view.run), ("approved", "run-2"))

    def test_approve_matchingIdentity(self) -> None:
        """Matching uuid and serial (serial case-insensitively) approve."""
        view = self.flow.approve(str(self.document["user_code"]), "w1", "o")
        self.assertEqual(view.device, "w1")

    def test_approve_nothingReported_refusedUnlessForced(self) -> None:
        """
        A request that reported no uuid/serial cannot be bound without force:
        its bearer token would skip the boot path's identity check.
        """
        status, document = self.flow.requestCode({"client_id": "talos"}, "192.0.2.99")
        self.assertEqual(status, 200)
        userCode = str(document["user_code"])
        error = self.assertRaises(
            DeviceFlowError, self.flow.approve, userCode, "w1", "o"
        )
        self.assertEqual(error.kind, "mismatch")
        self.assertIn("did not report", str(error))
        self.assertEqual(
            self.flow.approve(userCode, "w1", "o", force=True).run, "run-1"
        )

    def test_approve_unknownIdentity_refused(self) -> None:
        """A device whose uuid/serial fleetd does not know cannot be approved."""
        self.runs.identities = {"w1": None}  # type: ignore[dict-item]
        error = self.assertRaises(
            DeviceFlowError,
            self.flow.approve,
            str(self.document["user_code"]),
            "w1",
            "o",
        )
        self.assertEqual(error.kind, "mismatch")
