"""
Looking a device-flow request up without deciding it (the console's
C{/device} page, issue 20 item 1), the C{via} a decision is journaled
with, and the C{verification_uri_complete} a node is handed.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred

from fleetd.deviceflow.model import DeviceFlowError
from tests.deviceflowsupport import REPORTED
from tests.test_deviceflow import FlowTestCase


class LookupTests(FlowTestCase):
    def lookupRefused(self, userCode: str, owner: str = "alice") -> DeviceFlowError:
        error: DeviceFlowError = self.assertRaises(
            DeviceFlowError, self.flow.lookup, userCode, owner
        )
        return error

    def test_lookup_showsWithoutDeciding(self) -> None:
        """
        A lookup returns the request as reported (in any case, with or
        without dashes), decides nothing and journals nothing: the node
        keeps waiting and the request can still be approved.
        """
        document = self.request()
        user = document["user_code"]
        view = self.flow.lookup(user.lower().replace("-", ""), "alice")
        self.assertEqual((view.user_code, view.state), (user, "pending"))
        self.assertEqual(dict(view.reported), REPORTED)
        self.assertEqual(view.known, "w1")
        self.assertEqual(self.flow.lookup(user, "bob").id, view.id)
        self.assertEqual(self.events(), [])
        self.assertError(self.poll(document["device_code"]), "authorization_pending")
        self.assertEqual([v.id for v in self.flow.pending()], [view.id])
        self.assertEqual(self.approve(user).state, "approved")

    def test_lookup_unknownSpendsTheBudget(self) -> None:
        """
        RFC 8628 5.1: a lookup is no free guessing oracle. Unknown and
        malformed codes spend the same budget as approvals; once spent,
        even a right code is refused, to lookups and decisions alike.
        """
        user = self.request()["user_code"]
        for guess in ("BBBB-BBBB", "not a code", "CCCC-CCCC", "DDDD-DDDD"):
            self.assertEqual(self.lookupRefused(guess).kind, "unknown-user-code")
        self.refused(self.flow.approve("FFFF-FFFF", "w1", "alice"))  # the 5th
        self.assertEqual(self.lookupRefused(user).kind, "too-many-attempts")
        error = self.refused(self.flow.approve(user, "w1", "alice"))
        self.assertEqual(error.kind, "too-many-attempts")
        # The budget is per owner (and overall): bob has not spent his.
        self.assertEqual(self.flow.lookup(user, "bob").state, "pending")

    def test_lookup_rightCodesSpendNothing(self) -> None:
        """Looking a live request up, however often, spends no budget."""
        user = self.request()["user_code"]
        for _ in range(20):
            self.flow.lookup(user, "alice")
        self.assertEqual(self.approve(user).state, "approved")

    def test_lookup_decidedExpiredBeingDecided(self) -> None:
        """A lookup refuses what a decision refuses, with the same kinds."""
        approved = self.request()["user_code"]
        self.approve(approved)
        self.assertEqual(self.lookupRefused(approved).kind, "already-decided")
        denied = self.request(serial="x")["user_code"]
        self.successResultOf(Deferred.fromCoroutine(self.flow.deny(denied, "al")))
        self.assertEqual(self.lookupRefused(denied).kind, "already-decided")
        deciding = self.request(serial="y")["user_code"]
        self.journal.hold = True
        held = Deferred.fromCoroutine(self.flow.deny(deciding, "al"))
        self.assertEqual(self.lookupRefused(deciding).kind, "being-decided")
        self.journal.hold = False
        self.journal.held.pop().callback(None)
        self.successResultOf(held)
        late = self.request(serial="z")["user_code"]
        self.clock.advance(600)
        self.assertEqual(self.lookupRefused(late).kind, "expired")


class ViaTests(FlowTestCase):
    def test_via_journaledWhenGiven(self) -> None:
        """
        A decision made with C{via} says so in its journal entry; one made
        without (fleetctl's) has no C{via} field.
        """
        first = self.request()["user_code"]
        self.approve(first, via="console")
        second = self.request(serial="x")["user_code"]
        self.successResultOf(
            Deferred.fromCoroutine(self.flow.deny(second, "alice", via="console"))
        )
        third = self.request(serial="y")["user_code"]
        self.successResultOf(Deferred.fromCoroutine(self.flow.deny(third, "alice")))
        entries = self.successResultOf(self.journal.query())
        self.assertEqual(
            [(e.event, e.actor, e.fields.get("via")) for e in entries],
            [
                ("deviceflow.approved", "owner:alice", "console"),
                ("deviceflow.denied", "owner:alice", "console"),
                ("deviceflow.denied", "owner:alice", None),
            ],
        )
        self.assertNotIn("via", entries[2].fields)


class VerificationURICompleteTests(FlowTestCase):
    def test_complete_namesThePageWithTheCode(self) -> None:
        """
        RFC 8628 3.3.1: verification_uri_complete is the verification page
        with the user code as C{user_code}, so a QR code of it opens the
        console's lookup pre-filled [F3].
        """
        document = self.request()
        self.assertEqual(
            document["verification_uri_complete"],
            "https://enroll.example/device?user_code=" + document["user_code"],
        )
