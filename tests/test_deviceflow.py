"""Tests for L{fleetd.deviceflow.flow}: RFC 8628 as Talos's client uses it."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from fleetd.admin.deviceflow import requestJSON, verificationURI
from fleetd.deviceflow.flow import GRANT_TYPE, DeviceFlow, Reply
from fleetd.deviceflow.machine import Outcome, RequestCore, RequestMachine
from fleetd.deviceflow.model import (
    ALPHABET,
    DeviceFlowError,
    Grant,
    RequestView,
    displayUserCode,
    normaliseUserCode,
)
from fleetd.store import (
    AsyncJournal,
)
from tests.deviceflowsupport import IDENTITY, REPORTED, FakeRuns, makeJournal

USER_CODE = re.compile(f"[{ALPHABET}]{{4}}-[{ALPHABET}]{{4}}")


class SwitchableJournal:
    """A journal whose appends fail (C{broken}) or wait (C{held}) on demand."""

    def __init__(self, inner: AsyncJournal) -> None:
        self.inner = inner
        self.broken = False
        self.held: list[Deferred[Any]] = []
        self.hold = False

    def append(self, *args: Any, **kwargs: Any) -> Deferred[Any]:
        if self.broken:
            return fail(OSError("disk full"))
        if self.hold:
            d: Deferred[Any] = Deferred()
            self.held.append(d)
            return d.addCallback(lambda _: self.inner.append(*args, **kwargs))
        return self.inner.append(*args, **kwargs)

    def query(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.query(*args, **kwargs)


class FlowTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.runs = FakeRuns()
        self.journal = SwitchableJournal(makeJournal(self, self.clock))
        self.flow = self.makeFlow(maxPerSource=10_000, maxPerDevice=10_000)

    def makeFlow(self, **kwargs: Any) -> DeviceFlow:
        options: dict[str, Any] = {"verificationURI": "https://enroll.example/device"}
        options.update(kwargs)
        journal: Any = self.journal
        return DeviceFlow(self.clock, self.runs, journal, **options)

    def request(
        self, flow: DeviceFlow | None = None, peer: str = "192.0.2.10", **form: str
    ) -> dict[str, Any]:
        fields = {"client_id": "talos", **REPORTED}
        fields.update(form)
        reply = (flow or self.flow).requestCode(fields, peer)
        self.assertEqual(reply.status, 200, reply)
        return reply.document

    def poll(
        self, deviceCode: str, flow: DeviceFlow | None = None, **form: str
    ) -> Reply:
        fields = {
            "grant_type": GRANT_TYPE,
            "device_code": deviceCode,
            "client_id": "talos",
        }
        fields.update(form)
        return self.successResultOf(
            Deferred.fromCoroutine((flow or self.flow).poll(fields, "192.0.2.10"))
        )

    def approve(self, user: str, device: str = "w1", **kw: Any) -> RequestView:
        return self.successResultOf(
            Deferred.fromCoroutine(self.flow.approve(user, device, "alice", **kw))
        )

    def refused(self, coroutine: Any) -> DeviceFlowError:
        failure = self.failureResultOf(Deferred.fromCoroutine(coroutine))
        error = failure.value
        assert isinstance(error, DeviceFlowError)
        return error

    def events(self) -> list[str]:
        return [e.event for e in self.successResultOf(self.journal.query())]

    def assertError(self, reply: Reply, error: str) -> None:
        self.assertEqual((reply.status, reply.document["error"]), (400, error), reply)


class RequestCodeTests(FlowTestCase):
    def test_answer_rfc8628(self) -> None:
        """/device/code answers the RFC 8628 section 3.2 members, numbers as numbers."""
        document = self.request()
        self.assertEqual(
            set(document),
            {
                "device_code",
                "user_code",
                "verification_uri",
                "verification_uri_complete",
                "expires_in",
                "interval",
            },
        )
        self.assertEqual(document["verification_uri"], "https://enroll.example/device")
        self.assertEqual((document["expires_in"], document["interval"]), (600, 5))
        self.assertRegex(document["user_code"], USER_CODE)
        self.assertGreaterEqual(len(document["device_code"]), 43)
        json.dumps(document)

    def test_clientID_required(self) -> None:
        """A request without client_id is 400 invalid_request."""
        reply = self.flow.requestCode({"uuid": "u"}, "192.0.2.1")
        self.assertError(reply, "invalid_request")
        self.assertEqual(self.flow.pending(), [])

    def test_values_boundedAndPrintable(self) -> None:
        """Over-long or unprintable values are 400 invalid_request."""
        for bad in ({"serial": "x" * 257}, {"hostname": "a\nb"}, {"scope": "\x00"}):
            reply = self.flow.requestCode({"client_id": "talos", **bad}, "192.0.2.1")
            self.assertError(reply, "invalid_request")

    def test_reported_keptButCodeHidden(self) -> None:
        """
        What the node reported is kept, with the inventory device it names;
        the code is neither in the JSON listing nor in repr.
        """
        self.request(peer="192.0.2.44", whatever="1")
        (pending,) = self.flow.pending()
        self.assertEqual((pending.peer, pending.known), ("192.0.2.44", "w1"))
        listed = requestJSON(pending)
        self.assertTrue(listed["code_sent"])
        self.assertNotIn("code", listed["reported"])
        self.assertNotIn(REPORTED["code"], json.dumps(listed))
        self.assertNotIn(REPORTED["code"], repr(pending))
        self.assertNotIn(pending.user_code, repr(pending))

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


class AdmissionTests(FlowTestCase):
    """[F4] Who may hold how many live requests."""

    def test_perSource_429UntilOldestExpires(self) -> None:
        """
        [F4] A source holds at most maxPerSource live requests; then 429
        with Retry-After until its oldest expires. An IPv6 /64 is one
        source; another source is unaffected.
        """
        flow = self.makeFlow()
        self.request(flow, peer="2001:db8::1")
        self.clock.advance(100)
        self.request(flow, peer="2001:db8::2", serial="other")
        reply = flow.requestCode({"client_id": "t"}, "2001:db8::ffff")
        self.assertEqual((reply.status, reply.retryAfter), (429, 500))
        self.assertEqual(reply.document["error"], "rate_limited")
        self.request(flow, peer="2001:db8:0:1::1", serial="x")
        self.clock.advance(500)
        self.request(flow, peer="2001:db8::3", serial="y")

    def test_strangersFull_knownNodeAdmitted(self) -> None:
        """
        [F4] Requests naming no inventory identity share maxStrangers
        slots (then 503 with Retry-After); a node reporting w1's uuid and
        serial (any case) from a fresh address still gets its code.
        """
        flow = self.makeFlow(maxStrangers=4)
        for i in range(4):
            self.request(flow, peer=f"127.0.0.{i + 2}", uuid=f"u{i}")
        reply = flow.requestCode({"client_id": "t"}, "127.0.0.99")
        self.assertEqual(
            (reply.status, reply.document["error"]), (503, "temporarily_unavailable")
        )
        self.assertEqual(reply.retryAfter, 600)
        self.request(
            flow, peer="127.0.0.100", uuid=REPORTED["uuid"].upper(), serial="s1"
        )
        self.assertEqual([v.known for v in flow.pending()][-1], "w1")

    def test_successNeverSpendsSharedBudget(self) -> None:
        """
        [F4] Successful requests spend nothing shared: 2 requests from each
        of 128 sources all succeed, as many as the strangers' pool holds.
        """
        flow = self.makeFlow()
        for i in range(256):
            self.request(
                flow, peer=f"10.0.{i // 2 // 250}.{i // 2 % 250}", uuid=f"u{i}"
            )
        self.assertEqual(len(flow.pending()), 256)

    def test_perDevice_cap(self) -> None:
        """
        [F4] At most maxPerDevice live requests report one device's
        identity (429), so one machine's replays cannot fill the table.
        """
        flow = self.makeFlow()
        self.request(flow, peer="127.0.0.2")
        self.request(flow, peer="127.0.0.3")
        reply = flow.requestCode({"client_id": "t", **REPORTED}, "127.0.0.4")
        self.assertEqual(reply.status, 429)
        self.request(flow, peer="127.0.0.4", serial="not-w1")  # a stranger's slot

    def test_expired_freesSlotsThenForgotten(self) -> None:
        """
        [F4] An expired request frees its slots at once; it answers
        expired_token for one more lifetime, then invalid_grant.
        """
        flow = self.makeFlow(maxStrangers=1)
        document = self.request(flow, uuid="u")
        self.clock.advance(600)
        self.request(flow, peer="192.0.2.77", uuid="v")
        self.assertError(self.poll(document["device_code"], flow), "expired_token")
        self.clock.advance(600)
        self.assertError(self.poll(document["device_code"], flow), "invalid_grant")


class PollTests(FlowTestCase):
    def test_pending_thenToken(self) -> None:
        """authorization_pending until approved; then a Bearer token, journaled."""
        document = self.request()
        self.assertError(self.poll(document["device_code"]), "authorization_pending")
        self.approve(document["user_code"])
        self.clock.advance(5)
        reply = self.poll(document["device_code"])
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.document["token_type"], "Bearer")
        self.assertEqual(self.events(), ["deviceflow.approved", "deviceflow.issued"])

    def test_token_onlyOnce(self) -> None:
        """The token is handed out once; later polls get invalid_grant."""
        document = self.request()
        self.approve(document["user_code"])
        self.assertEqual(self.poll(document["device_code"]).status, 200)
        self.assertError(self.poll(document["device_code"]), "invalid_grant")

    def test_denied_accessDenied(self) -> None:
        """A denied request's next poll is access_denied."""
        document = self.request()
        self.successResultOf(
            Deferred.fromCoroutine(self.flow.deny(document["user_code"], "alice"))
        )
        self.assertError(self.poll(document["device_code"]), "access_denied")

    def test_probePairs_notTooFast(self) -> None:
        """
        [F1] x/oauth2 sends every poll twice back to back; pairs at the
        interval are never told slow_down.
        """
        document = self.request()
        for _ in range(10):
            for _ in range(2):
                self.assertError(
                    self.poll(document["device_code"]), "authorization_pending"
                )
            self.clock.advance(5)

    def test_hammering_slowDownNever429(self) -> None:
        """
        [F1] Polling far too fast gets slow_down, never 429 or 503; the
        interval expected grows by 5 s per window, and a client that obeys
        gets authorization_pending again.
        """
        document = self.request()
        errors = {
            self.poll(document["device_code"]).document["error"] for _ in range(200)
        }
        self.assertEqual(errors, {"authorization_pending", "slow_down"})
        self.clock.advance(10)
        self.assertError(self.poll(document["device_code"]), "authorization_pending")

    def test_badRequests(self) -> None:
        """Wrong grant type, missing parameters, unknown codes: RFC errors, 400."""
        document = self.request()
        self.assertError(
            self.poll(document["device_code"], grant_type="password"),
            "unsupported_grant_type",
        )
        self.assertError(
            self.poll(document["device_code"], client_id="x"), "invalid_grant"
        )
        self.assertError(self.poll("nope"), "invalid_grant")
        reply = self.successResultOf(
            Deferred.fromCoroutine(self.flow.poll({"grant_type": GRANT_TYPE}, "p"))
        )
        self.assertError(reply, "invalid_request")

    def test_noTimers(self) -> None:
        """The flow arms no timers: expiry is read from the clock."""
        document = self.request()
        self.approve(document["user_code"])
        self.poll(document["device_code"])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class TokenTests(FlowTestCase):
    def issue(self, **form: str) -> str:
        document = self.request(None, "192.0.2.10", **form)
        self.approve(document["user_code"])
        reply = self.poll(document["device_code"])
        self.assertEqual(reply.status, 200)
        return str(reply.document["access_token"])

    def test_grant_boundToDeviceAndReportedIdentity(self) -> None:
        """
        [F2] The token authorizes the device and the machine that reported
        its uuid and serial, with the inventory identity of the approval;
        no run is named.
        """
        token = self.issue(serial="s1")
        grant = self.flow.authorize(token)
        self.assertEqual(grant, Grant("w1", REPORTED["uuid"], "s1", IDENTITY))
        self.assertIsNone(self.flow.authorize("x" + token))

    def test_lifetime_3h(self) -> None:
        """[F2] A token lives 3 h by default (Talos reuses it that long)."""
        token = self.issue()
        self.assertEqual(self.flow.tokenExpiresIn, 3 * 3600)
        self.clock.advance(3 * 3600 - 1)
        self.assertIsNotNone(self.flow.authorize(token))
        self.clock.advance(1)
        self.assertIsNone(self.flow.authorize(token))

    def test_delivered_recorded(self) -> None:
        """[F2] Once a delivery finished, the grant names the run it delivered."""
        token = self.issue()
        grant = self.flow.authorize(token)
        assert grant is not None
        self.flow.delivered(grant, "run-1")
        again = self.flow.authorize(token)
        assert again is not None
        self.assertEqual(again.delivered, "run-1")

    def test_issueNotJournaled_noToken(self) -> None:
        """
        [J1] When the journal refuses the token's entry, no token is handed
        out (authorization_pending); the next poll tries again.
        """
        document = self.request()
        self.approve(document["user_code"])
        self.journal.broken = True
        self.assertError(self.poll(document["device_code"]), "authorization_pending")
        self.assertEqual(self.flow._tokens, {})
        self.journal.broken = False
        self.assertEqual(self.poll(document["device_code"]).status, 200)


class ApproveTests(FlowTestCase):
    def test_approve_normalisesInput(self) -> None:
        """The user code is accepted in any case, with or without dashes."""
        document = self.request()
        view = self.approve(document["user_code"].lower().replace("-", " "))
        self.assertEqual(
            (view.state, view.device, view.decided_by), ("approved", "w1", "alice")
        )

    def test_refusals(self) -> None:
        """Unknown code, bad device, unknown device, no ready run: refused."""
        user = self.request()["user_code"]
        flow = self.flow
        cases = [
            (flow.approve("BBBB-BBBB", "w1", "alice"), "unknown-user-code"),
            (flow.approve(user, "a\nb", "alice"), "invalid"),
            (flow.approve(user, "w9", "alice"), "unknown-device"),
        ]
        for coroutine, kind in cases:
            self.assertEqual(self.refused(coroutine).kind, kind)
        del self.runs.ready["w1"]
        self.assertEqual(
            self.refused(flow.approve(user, "w1", "alice")).kind, "no-ready-run"
        )
        self.assertEqual(len(flow.pending()), 1)  # every refusal left it pending
        self.assertEqual(self.events(), [])

    def test_alreadyDecidedAndExpired(self) -> None:
        """A decided request cannot be decided again; an expired one is gone."""
        user = self.request()["user_code"]
        self.approve(user)
        error = self.refused(self.flow.deny(user, "bob"))
        self.assertEqual(error.kind, "already-decided")
        self.assertNotIn(user, str(error))  # the message names the request id
        other = self.request(serial="x")["user_code"]
        self.clock.advance(600)
        self.assertEqual(self.refused(self.flow.deny(other, "bob")).kind, "expired")

    def test_tooManyAttempts(self) -> None:
        """RFC 8628 5.1: after 5 unknown codes, even a right one is refused."""
        user = self.request()["user_code"]
        for _ in range(5):
            self.refused(self.flow.approve("BBBB-BBBB", "w1", "alice"))
        error = self.refused(self.flow.approve(user, "w1", "alice"))
        self.assertEqual(error.kind, "too-many-attempts")

    def test_mismatch_refusedUnlessExactlyAccepted(self) -> None:
        """
        A reported serial unlike the inventory's is refused; accepting the
        wrong field, or accepting a mismatch where none is, is refused too
        (the server's check is never off); accepting exactly serial
        approves, journaled forced=true with what differed.
        """
        user = self.request(serial="OTHER")["user_code"]
        flow = self.flow
        for accept in ((), ("uuid",), ("uuid", "serial")):
            error = self.refused(
                flow.approve(user, "w1", "alice", acceptMismatch=accept)
            )
            self.assertEqual(error.kind, "mismatch", accept)
        self.approve(user, acceptMismatch=["serial"])
        (entry,) = self.successResultOf(self.journal.query())
        self.assertEqual(entry.fields["forced"], True)
        self.assertEqual(entry.fields["mismatch"], "serial")
        self.assertEqual(
            (entry.fields["serial"], entry.fields["inventory_serial"]), ("OTHER", "S1")
        )
        good = self.request()["user_code"]
        error = self.refused(
            flow.approve(good, "w1", "alice", acceptMismatch=["serial"])
        )
        self.assertEqual(error.kind, "mismatch")

    def test_unreported_countsAsMismatch(self) -> None:
        """A request that reported no uuid/serial differs in both."""
        status = self.flow.requestCode({"client_id": "talos"}, "192.0.2.1")
        user = str(status.document["user_code"])
        self.assertEqual(
            self.refused(self.flow.approve(user, "w1", "alice")).kind, "mismatch"
        )
        self.approve(user, acceptMismatch=["uuid", "serial"])

    def test_serialCaseInsensitive(self) -> None:
        """Serials compare without regard to case, uuids in lower case."""
        user = self.request(serial="s1", uuid=REPORTED["uuid"].upper())["user_code"]
        self.approve(user)

    def test_journalFails_nothingChanges(self) -> None:
        """
        [J1] An approval or denial whose journal entry fails changes
        nothing: the owner gets not-recorded, the node hears
        authorization_pending and gets no token, and the request can be
        decided again later.
        """
        document = self.request()
        self.journal.broken = True
        for coroutine in (
            self.flow.approve(document["user_code"], "w1", "alice"),
            self.flow.deny(document["user_code"], "alice"),
        ):
            error = self.refused(coroutine)
            self.assertEqual(error.kind, "not-recorded")
            self.assertError(
                self.poll(document["device_code"]), "authorization_pending"
            )
            self.clock.advance(5)
        self.assertEqual([v.state for v in self.flow.pending()], ["pending"])
        self.assertEqual(self.flow._tokens, {})
        self.journal.broken = False
        self.assertEqual(self.events(), [])
        self.approve(document["user_code"])
        self.assertEqual(self.poll(document["device_code"]).status, 200)

    def test_beingDecided_nodeWaits(self) -> None:
        """
        [J1] While an approval's entry is being written, the node hears
        authorization_pending and a second decision is refused; the
        approval takes effect only once the entry is durable.
        """
        document = self.request()
        self.journal.hold = True
        approving = Deferred.fromCoroutine(
            self.flow.approve(document["user_code"], "w1", "alice")
        )
        self.assertNoResult(approving)
        self.assertError(self.poll(document["device_code"]), "authorization_pending")
        error = self.refused(self.flow.deny(document["user_code"], "bob"))
        self.assertEqual(error.kind, "being-decided")
        self.journal.hold = False
        self.journal.held.pop().callback(None)
        self.assertEqual(self.successResultOf(approving).state, "approved")
        self.clock.advance(5)
        self.assertEqual(self.poll(document["device_code"]).status, 200)


class ExpiryWhileDecidingTests(FlowTestCase):
    def test_expiresWhileApprovalRecorded_noToken(self) -> None:
        """
        [J1] [F2] A request that expires while its approval's entry is being
        written never yields a token: the owner hears it expired, the node
        gets expired_token, and the journal says so.
        """
        document = self.request()
        self.journal.hold = True
        approving = Deferred.fromCoroutine(
            self.flow.approve(document["user_code"], "w1", "alice")
        )
        self.clock.advance(601)  # past the request's 600 s lifetime
        self.flow.sweep()
        self.journal.hold = False
        while self.journal.held:
            self.journal.held.pop().callback(None)
        error = self.failureResultOf(approving).value
        self.assertIsInstance(error, DeviceFlowError)
        self.assertEqual(error.kind, "expired")
        for _ in range(3):
            self.assertError(self.poll(document["device_code"]), "expired_token")
            self.clock.advance(5)
        self.assertEqual(self.flow._tokens, {})
        self.assertEqual(self.events(), ["deviceflow.approved", "deviceflow.expired"])

    def test_expiresWhileDenialFails_staysExpired(self) -> None:
        """A decision that fails after the lifetime ended leaves it expired."""
        document = self.request()
        self.journal.hold = True
        denying = Deferred.fromCoroutine(self.flow.deny(document["user_code"], "al"))
        self.clock.advance(601)
        self.flow.sweep()
        self.journal.hold = False
        self.journal.held.pop().errback(OSError("disk full"))
        self.assertEqual(self.failureResultOf(denying).value.kind, "not-recorded")
        self.assertError(self.poll(document["device_code"]), "expired_token")


class MachineTests(SynchronousTestCase):
    def test_settlingStatesIgnoreExpiry(self) -> None:
        """
        An entry being written settles before expiry applies: deciding and
        issuing ignore expire, and a request left approved then expires.
        """
        machine = RequestMachine(RequestCore(5))
        self.assertEqual(machine.decide(), Outcome.DECIDE)
        machine.expire()
        machine.approved(Grant("w1", None, None, IDENTITY))
        self.assertEqual(machine.status(), "approved")
        self.assertEqual(machine.poll(0.0), Outcome.ISSUE)
        machine.expire()
        machine.notIssued()
        machine.expire()
        self.assertEqual(machine.poll(0.0), Outcome.EXPIRED)
        self.assertEqual(machine.decide(), Outcome.EXPIRED)


class SecretsTests(FlowTestCase):
    def test_noSecretInLogsJournalOrListings(self) -> None:
        """
        Device codes, access tokens, user codes and the reported code never
        appear in a log line, a journal entry or an error message.
        """
        with capturedLogs() as events:
            document = self.request()
            view = self.approve(document["user_code"])
            reply = self.poll(document["device_code"])
            self.refused(self.flow.deny(document["user_code"], "alice"))
        text = "\n".join(formatEvent(e) + repr(e) for e in events)
        text += json.dumps(
            [e.toJSON() for e in self.successResultOf(self.journal.query())]
        )
        text += repr(view)
        for secret in (
            document["device_code"],
            document["user_code"],
            document["user_code"].replace("-", ""),
            str(reply.document["access_token"]),
            REPORTED["code"],
        ):
            self.assertNotIn(secret, text)


class VerificationURITests(SynchronousTestCase):
    def test_adminPort(self) -> None:
        """[F3] The admin listener's port, left out when 443 or unknown."""
        self.assertEqual(
            verificationURI("enroll.example", 8446),
            "https://enroll.example:8446/device",
        )
        self.assertEqual(verificationURI("e.example", 443), "https://e.example/device")
        self.assertEqual(verificationURI("e.example", None), "https://e.example/device")


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
