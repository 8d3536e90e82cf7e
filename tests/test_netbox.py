"""
The NetBox inventory's behaviour beyond the shared contract: the outbox
(deliveries never wait for NetBox), If-Match and 412, statuses fleetd
leaves alone, duplicates, the custom-field check, the journal mirror,
and faults (NetBox down, hung, refusing). All over the fake NetBox.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.admin.provision import ProvisionResource
from fleetd.admin.refusals import statusOf
from fleetd.inventory.model import DeviceStatus, InventoryError, ServedRecord
from fleetd.netbox.client import NetBoxClient, NetBoxError
from fleetd.netbox.devices import CUSTOM_FIELD_TYPES, findBySerial
from fleetd.netbox.inventory import NetBoxInventory, digestOf
from fleetd.netbox.mirror import carries, codeSpan
from fleetd.netbox.outbox import pendingCount
from fleetd.netbox.service import NetBoxService
from fleetd.refused import Refused
from fleetd.runs.machine import Outcome
from fleetd.store.db import StoreError
from fleetd.store.entries import Entry
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.testing.netbox import FakeNetBox
from tests.fleetsupport import KEY, RENDERER, device
from tests.inventorysupport import W1, W2
from tests.netbox_support import TOKEN, URL, NetBoxFleet, NetBoxRig, seedFake
from tests.support import REPO


def _events(rig: NetBoxRig, device: str | None = None) -> list[str]:
    entries = rig.journal.query(device=device)
    result: list[Any] = []
    entries.addCallback(result.append)
    return [e.event for e in result[0]]


def _spanContent(text: str) -> str:
    """
    What CommonMark shows for C{text} when it is exactly one code span
    (fails otherwise): the content between an opening backtick run and
    the first later run of the same length, line breaks as spaces, one
    edge space stripped each side when both are there.
    """
    opening = re.match("`+", text)
    assert opening is not None, text
    n = opening.end()
    closing = next(r for r in re.finditer("`+", text[n:]) if len(r.group()) == n)
    assert n + closing.end() == len(text), f"{text!r} is more than one span"
    content = text[n : n + closing.start()].replace("\n", " ")
    if content.startswith(" ") and content.endswith(" ") and content.strip(" "):
        content = content[1:-1]
    return content


class OutboxTests(SynchronousTestCase):
    """Status changes and releases reach NetBox through the outbox."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.fake = self.rig.fake
        self.w1 = seedFake(self.fake, W1)
        self.inventory = self.rig.inventory

    def test_setStatus_patchesWithIfMatch(self) -> None:
        """A status change PATCHes the device's detail with its ETag in If-Match."""
        etag = self.fake.etag(self.w1)
        self.successResultOf(
            self.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        self.rig.settle()
        self.assertEqual(self.fake.devices[self.w1]["status"], "planned")
        self.assertEqual(self.fake.ifMatches, [etag])
        self.assertIn(
            ("PATCH", f"/netbox/api/dcim/devices/{self.w1}/"), self.fake.requests
        )

    def test_release_writesReleaseFieldNeverSecrets(self) -> None:
        """
        The release writes fleetd_release (run, served_at, digest) and
        stages a planned device; no peer, body or code goes to NetBox.
        """
        self.fake.edit(self.w1, status="planned")
        record = ServedRecord("r-0123456789abcdef", "w1", 86400.0, "10.0.0.7")
        self.successResultOf(self.inventory.release(record, journal=()))
        self.rig.settle()
        stored = self.fake.devices[self.w1]
        self.assertEqual(stored["status"], "staged")
        self.assertEqual(
            stored["custom_fields"]["fleetd_release"],
            {
                "run": "r-0123456789abcdef",
                "served_at": "1970-01-02T00:00:00Z",
                "digest": "sha256:" + "ab" * 32,
            },
        )
        self.assertNotIn("10.0.0.7", json.dumps(stored))

    def test_race_operatorEditBetweenReadAndPatch(self) -> None:
        """
        A 412 (the device changed between fleetd's read and its PATCH)
        re-reads and decides again: the operator's edit survives.
        """
        edits: list[int] = []

        def operator(ident: int) -> None:
            if not edits:
                edits.append(ident)
                self.fake.edit(ident, serial="SN-0001-REPLACED")

        self.fake.beforePatch = operator
        self.successResultOf(
            self.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        self.rig.settle()
        stored = self.fake.devices[self.w1]
        self.assertEqual(
            (stored["status"], stored["serial"]), ("planned", "SN-0001-REPLACED")
        )
        self.assertEqual(len(self.fake.ifMatches), 2)
        self.assertNotEqual(self.fake.ifMatches[0], self.fake.ifMatches[1])

    def test_race_operatorDecommissionsInBetween(self) -> None:
        """
        An operator who decommissions the device between fleetd's read and
        its PATCH wins: after the 412 fleetd decides again and leaves it,
        journaling that it did.
        """

        def operator(ident: int) -> None:
            if self.fake.devices[ident]["status"] != "decommissioning":
                self.fake.edit(ident, status="decommissioning")

        self.fake.beforePatch = operator
        self.successResultOf(
            self.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        self.rig.settle()
        self.assertEqual(self.fake.devices[self.w1]["status"], "decommissioning")
        self.assertIn("netbox.push.skipped", _events(self.rig, "w1"))
        skipped = self.rig.sample("fleetd_netbox_pushes_total", outcome="skipped")
        self.assertEqual(skipped, 1.0)
        got = self.successResultOf(self.inventory.get("w1"))
        assert got is not None
        self.assertEqual(got.status, DeviceStatus.DECOMMISSIONING)

    def test_siteStatus_leftAlone(self) -> None:
        """A status the site added (not NetBox's own) is left alone by fleetd."""
        self.fake.statuses.append("burn-in")
        self.fake.edit(self.w1, status="burn-in")
        self.rig.runner.run(
            lambda db: self.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        self.assertEqual(self.fake.devices[self.w1]["status"], "burn-in")
        self.assertEqual(self.fake.ifMatches, [])
        self.assertIn("netbox.push.skipped", _events(self.rig, "w1"))

    def test_release_leavesNonPlannedStatus(self) -> None:
        """A release stages only a planned device; the record is written anyway."""
        self.fake.edit(self.w1, status="active")
        record = ServedRecord("r-1", "w1", 5.0, "p")
        self.successResultOf(self.inventory.release(record, journal=()))
        self.rig.settle()
        stored = self.fake.devices[self.w1]
        self.assertEqual(stored["status"], "active")
        self.assertEqual(stored["custom_fields"]["fleetd_release"]["run"], "r-1")

    def test_netboxDown_changeCommitsPushWaits(self) -> None:
        """
        [J1] With NetBox down, a change inside a transaction commits
        locally at once; the push retries with backoff and lands once
        NetBox answers; reads meanwhile show fleetd's status.
        """
        self.rig.http.down = True
        self.rig.runner.run(
            lambda db: self.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        self.assertEqual(self.fake.devices[self.w1]["status"], "inventory")
        self.rig.clock.advance(1)  # first retry, still down
        self.assertEqual(self.fake.devices[self.w1]["status"], "inventory")
        self.assertEqual(self.rig.sample("fleetd_netbox_outbox_pending"), 1.0)
        self.rig.http.down = False
        got = self.successResultOf(self.inventory.get("w1"))
        assert got is not None
        self.assertEqual(got.status, DeviceStatus.PLANNED)  # the outbox overlays
        self.rig.clock.advance(2)
        self.assertEqual(self.fake.devices[self.w1]["status"], "planned")
        self.rig.clock.advance(5)  # the next poll reads the outbox again
        self.assertEqual(self.rig.sample("fleetd_netbox_outbox_pending"), 0.0)
        pushed = self.rig.sample("fleetd_netbox_pushes_total", outcome="done")
        self.assertEqual(pushed, 1.0)

    def test_netboxHung_pushTimesOutAndRetries(self) -> None:
        """A hung NetBox costs the push a timeout on the clock, then a retry."""
        self.fake.hang = True
        self.rig.runner.run(
            lambda db: self.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        self.rig.clock.advance(10)  # the client's timeout
        self.fake.hang = False
        self.rig.clock.advance(1)
        self.assertEqual(self.fake.devices[self.w1]["status"], "planned")

    def test_badRequest_refusedAndJournaled(self) -> None:
        """
        A 400 (the site dropped the status planned) settles the entry as
        refused, journaled with NetBox's field message; only the poll is armed.
        """
        self.fake.statuses.remove("planned")
        self.rig.runner.run(
            lambda db: self.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        entries = self.successResultOf(self.rig.journal.query(device="w1"))
        (refused,) = [e for e in entries if e.event == "netbox.push.refused"]
        self.assertIn("not a valid choice", str(refused.fields["reason"]))
        self.assertEqual(
            self.rig.clock.getDelayedCalls()[0].getTime(), 5.0
        )  # poll only

    def test_readOnlyToken_retriedWithClearError(self) -> None:
        """A read-only token (403) keeps the entry pending, retried with backoff."""
        self.fake.tokens[TOKEN] = False
        self.rig.runner.run(
            lambda db: self.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        self.assertEqual(self.fake.devices[self.w1]["status"], "inventory")
        self.fake.tokens[TOKEN] = True
        self.rig.clock.advance(1)
        self.assertEqual(self.fake.devices[self.w1]["status"], "planned")

    def test_unexpectedError_loggedAndRetried(self) -> None:
        """
        M9: an error the push does not know (a bug, not NetBox's answer)
        is logged with its traceback and the entry is retried with
        backoff; the outbox does not stall until a restart.
        """
        request = self.rig.http.request
        broken = [True]

        def once(method: str, url: str, **kwargs: Any) -> Deferred[Any]:
            if broken:
                broken.clear()
                return fail(RuntimeError("boom"))
            return request(method, url, **kwargs)

        self.rig.http.request = once  # type: ignore[method-assign]
        self.rig.runner.run(
            lambda db: self.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(self.fake.devices[self.w1]["status"], "inventory")
        self.rig.clock.advance(1)  # the backoff
        self.assertEqual(self.fake.devices[self.w1]["status"], "planned")
        self.rig.clock.advance(5)  # the next poll settles the row
        self.assertEqual(self.rig.sample("fleetd_netbox_outbox_pending"), 0.0)

    def test_stop_cancelsTimers(self) -> None:
        """Stopping the worker while it backs off leaves no delayed call."""
        self.rig.http.down = True
        self.rig.runner.run(
            lambda db: self.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        self.assertTrue(self.rig.clock.getDelayedCalls())
        self.successResultOf(self.rig.worker.stop())
        self.successResultOf(self.rig.mirror.stop())
        self.assertEqual(self.rig.clock.getDelayedCalls(), [])


class ClientCloseTests(SynchronousTestCase):
    """Stopping the client leaves no connection behind."""

    def test_close_cancelsRequestsInFlight(self) -> None:
        """A request still unanswered when fleetd stops is cancelled before
        the idle connections are closed (else its connection, once the
        answer came, would go back to the pool and stay open); a call
        after that fails at once."""
        pending: list[Deferred[Any]] = []
        cancelled: list[bool] = []

        class Hung:
            def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
                d: Deferred[Any] = Deferred(lambda _: cancelled.append(True))
                pending.append(d)
                return d

        closed: list[bool] = []

        def closer() -> Deferred[None]:
            closed.append(bool(cancelled))  # were requests cancelled first?
            return Deferred.fromCoroutine(_nothing())

        clock = Clock()
        client = NetBoxClient(Hung(), clock, URL, TOKEN, timeout=10.0, closer=closer)
        call = client.call("GET", client.url("api/dcim/devices/"))
        closing = client.close()
        self.assertEqual(cancelled, [True])
        clock.advance(0)  # closed on the next turn
        self.successResultOf(closing)
        self.assertEqual(closed, [True])
        self.failureResultOf(call)
        self.assertEqual(client._inflight, set())
        self.assertEqual(clock.getDelayedCalls(), [])
        # Nothing opens a connection once stopping (an inventory read from
        # another service shutting down, say): the call fails at once.
        late = client.call("GET", client.url("api/dcim/devices/"))
        self.assertEqual(len(pending), 1)
        error = self.failureResultOf(late, NetBoxError).value
        self.assertEqual(error.kind, "unavailable")
        self.assertIn("stopping", str(error))


async def _nothing() -> None:
    return None


class LookupTests(SynchronousTestCase):
    """Names and serials: zero or several matches are errors naming them."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)

    def test_duplicateNames_errorNamingIt(self) -> None:
        """Two NetBox devices named w1 and W1: get fails as a duplicate naming w1."""
        seedFake(self.rig.fake, W1)
        self.rig.fake.addDevice("W1", "OTHER", uuid=W2.uuid, deviceClass="worker-g3")
        failure = self.failureResultOf(self.rig.inventory.get("w1"), InventoryError)
        self.assertEqual(failure.value.kind, "duplicate")
        self.assertIn("named w1", str(failure.value))
        self.assertEqual(self.successResultOf(self.rig.inventory.list()), [])

    def test_serial_caseInsensitiveAndDuplicates(self) -> None:
        """?serial= matches case-insensitively; none or several are errors naming it."""
        seedFake(self.rig.fake, W1)
        found = self.successResultOf(
            Deferred.fromCoroutine(findBySerial(self.rig.client, "sn-0001"))
        )
        self.assertEqual(found["name"], "w1")
        none = self.failureResultOf(
            Deferred.fromCoroutine(findBySerial(self.rig.client, "SN-404")),
            InventoryError,
        )
        self.assertEqual(none.value.kind, "not-found")
        self.assertIn("SN-404", str(none.value))
        self.rig.fake.addDevice("w9", "sn-0001")
        two = self.failureResultOf(
            Deferred.fromCoroutine(findBySerial(self.rig.client, "SN-0001")),
            InventoryError,
        )
        self.assertEqual(two.value.kind, "duplicate")
        self.assertIn("w1, w9", str(two.value))

    def test_macs_notManagementOnly(self) -> None:
        """MACs come from interfaces that are not management-only, in any case."""
        seedFake(self.rig.fake, W2)
        got = self.successResultOf(self.rig.inventory.get("w2"))
        assert got is not None
        self.assertEqual(got.macs, W2.macs)

    def test_list_followsNext(self) -> None:
        """list follows next to the end of every page."""
        self.rig.fake.maxPageSize = 7
        for n in range(30):
            self.rig.fake.addDevice(
                f"w{n:02d}",
                f"SN{n}",
                uuid=f"4c4c4544-0042-3510-8052-{n:012d}",
                deviceClass="worker-g3",
            )
        self.rig.fake.addDevice("switch1", "SW1")  # not fleetd's: no class
        names = [d.name for d in self.successResultOf(self.rig.inventory.list())]
        self.assertEqual(names, [f"w{n:02d}" for n in range(30)])

    def test_customFields_missingNamed(self) -> None:
        """The start-up check names each missing (or mistyped) custom field."""
        fake = FakeNetBox(
            basePath="/netbox/",
            customFields={"fleetd_uuid": "text", "fleetd_class": "integer"},
        )
        rig = NetBoxRig(Path(self.mktemp()) / "db.sqlite3", fake)
        self.addCleanup(rig.close)
        missing = self.successResultOf(
            Deferred.fromCoroutine(rig.inventory.checkCustomFields())
        )
        self.assertEqual(
            missing, ["fleetd_class (is integer, must be text)", "fleetd_release"]
        )
        ok = self.successResultOf(
            Deferred.fromCoroutine(self.rig.inventory.checkCustomFields())
        )
        self.assertEqual(ok, [])

    def test_forbidden_clearError(self) -> None:
        """A wrong token gives one line saying so and naming the key to check."""
        self.rig.fake.tokens = {"nbt_other.x": True}
        failure = self.failureResultOf(self.rig.inventory.get("w1"), InventoryError)
        self.assertEqual(failure.value.kind, "unavailable")
        self.assertIn("forbidden (403)", str(failure.value))
        self.assertIn("token_file", str(failure.value))
        self.assertNotIn("\n", str(failure.value))
        self.assertNotIn("s3cret", str(failure.value))


class MirrorTests(SynchronousTestCase):
    """The journal mirror: at least once, never twice."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.w1 = seedFake(self.rig.fake, W1)

    def append(self, event: str, device: str | None = "w1") -> None:
        self.successResultOf(
            self.rig.journal.append(event, actor="owner:ann", device=device)
        )

    def mirrored(self) -> list[str]:
        return [
            e["comments"]
            for e in sorted(self.rig.fake.journal.values(), key=lambda e: e["id"])
        ]

    def test_mirror_postsDeviceEntriesWithMarker(self) -> None:
        """Each device entry is posted once to its device, carrying fleetd-entry."""
        self.append("provision.requested")
        self.append("fleetd.started", device=None)
        self.rig.mirror.start()
        self.assertEqual(self.rig.sample("fleetd_netbox_mirror_behind"), 0.0)
        (comments,) = self.mirrored()
        self.assertIn("provision.requested", comments)
        self.assertRegex(comments, r"(?m)^fleetd-entry: 1-[0-9a-f]{16}$")
        self.rig.mirror.kick()
        self.assertEqual(len(self.mirrored()), 1)

    def test_mirror_timeoutThenRetry_postsOnce(self) -> None:
        """
        A POST that landed but timed out is found by the retry's search
        (exact marker), so exactly one entry is mirrored.
        """
        self.append("provision.requested")
        self.rig.fake.swallowWrites = 1
        self.rig.mirror.start()
        self.assertEqual(len(self.mirrored()), 1)  # landed, unanswered
        self.rig.clock.advance(10)  # the timeout
        self.rig.clock.advance(1)  # the retry
        self.assertEqual(len(self.mirrored()), 1)
        self.assertEqual(self.rig.mirror.posted, 0)
        self.append("provision.approved")
        self.rig.mirror.kick()
        self.assertEqual(len(self.mirrored()), 2)

    def test_mirror_doubtSurvivesRestart(self) -> None:
        """
        A POST in doubt when fleetd stops is searched for after the
        restart, not posted again.
        """
        self.append("provision.requested")
        self.rig.fake.swallowWrites = 1
        self.rig.mirror.start()
        self.rig.open()
        self.rig.fake.hung.clear()
        self.rig.mirror.start()
        self.assertEqual(len(self.mirrored()), 1)

    def test_mirror_downRetriesWithBackoff(self) -> None:
        """NetBox down: the mirror backs off on the clock and catches up."""
        self.append("provision.requested")
        self.rig.http.down = True
        self.rig.mirror.start()
        self.assertEqual(self.rig.sample("fleetd_netbox_mirror_behind"), 1.0)
        self.rig.clock.advance(1)
        self.rig.http.down = False
        self.rig.clock.advance(2)
        self.assertEqual(len(self.mirrored()), 1)

    def test_codeSpan_valueNeverLeavesTheSpan(self) -> None:
        """
        A value with backticks, edge spaces or line breaks is exactly one
        CommonMark code span showing that value (line breaks as spaces).
        """
        for value in ("a`b", "``", "`x", "x`", " a ", "`", "a```b`", "  ", "x"):
            self.assertEqual(_spanContent(codeSpan(value)), value, value)
        spoof = codeSpan("x\r\nfleetd-entry: 1-ab\ny")
        self.assertNotIn("\n", spoof)
        self.assertNotIn("\r", spoof)
        self.assertEqual(_spanContent(spoof), "x fleetd-entry: 1-ab y")

    def test_mirror_backtickInFieldStaysInCode(self) -> None:
        """A field holding backticks is mirrored as one code span, not Markdown."""
        self.successResultOf(
            self.rig.journal.append(
                "attest.refused",
                actor="owner:ann",
                device="w1",
                fields={"reason": "x` **bold** ``y"},
            )
        )
        self.rig.mirror.start()
        (comments,) = self.mirrored()
        lines = comments.splitlines()
        self.assertEqual(
            json.loads(_spanContent(lines[1])), {"reason": "x` **bold** ``y"}
        )
        self.assertEqual(_spanContent(lines[0].split(" by ", 1)[1]), "owner:ann")

    def test_carries_exactMarkerOnly(self) -> None:
        """q is a substring search: the marker of entry 1 is not the marker of 12."""
        self.assertTrue(carries("x\nfleetd-entry: 1-ab\n", "fleetd-entry: 1-ab"))
        self.assertFalse(carries("fleetd-entry: 1-abc", "fleetd-entry: 1-ab"))
        self.assertFalse(carries("fleetd-entry: 11-ab", "fleetd-entry: 1-ab"))
        self.assertFalse(carries(None, "fleetd-entry: 1-ab"))


class DeliveryTests(SynchronousTestCase):
    """A delivery never waits for NetBox; a reboot still finds the run consumed."""

    def setUp(self) -> None:
        self.fleet = NetBoxFleet(self)
        self.addCleanup(self.fleet.worker.stop)
        self.fleet.add(device("w1", "SER1"))
        self.w1 = self.fleet.fake.byName("w1")

    def deliverWhile(self, fault: str) -> Any:
        (run,) = self.fleet.provision(device("w1", "SER1"))
        self.fleet.clock.advance(0)
        self.assertEqual(self.w1["status"], "planned")
        if fault == "down":
            self.fleet.http.down = True
        else:
            self.fleet.fake.hang = True
        outcome, body = self.fleet.fetch(run.code)
        self.assertEqual(outcome, Outcome.DELIVER)
        self.assertEqual(self.fleet.registry.releaser.pending(), 0)
        self.assertEqual(
            self.fleet.events("w1"),
            ["run.provisioned", "run.delivered"],
        )
        self.fleet.clock.advance(0)
        self.assertEqual(self.w1["status"], "planned")
        return run, body

    def test_netboxDown_deliveryNotDelayed(self) -> None:
        """
        [J1][C1] NetBox down: the delivery and its release commit at once;
        the push lands when NetBox is back, with the config's digest.
        """
        run, body = self.deliverWhile("down")
        self.fleet.clock.advance(1)
        self.fleet.http.down = False
        self.fleet.clock.advance(2)
        self.assertEqual(self.w1["status"], "staged")
        release = self.w1["custom_fields"]["fleetd_release"]
        self.assertEqual(release["run"], run.run)
        self.assertEqual(release["digest"], digestOf(body))
        dumped = json.dumps(self.fleet.fake.devices)
        self.assertNotIn(run.code, dumped)
        self.assertNotIn(body.decode("utf-8", "replace")[:40], dumped)

    def test_netboxHung_deliveryNotDelayed(self) -> None:
        """NetBox hung: the delivery commits at once; the push times out and retries."""
        self.deliverWhile("hung")
        self.fleet.clock.advance(10)
        self.fleet.fake.hang = False
        self.fleet.clock.advance(1)
        self.assertEqual(self.w1["status"], "staged")

    def test_reboot_consumedThoughNetBoxNeverHeard(self) -> None:
        """
        [C1][V4] A spore reboot after a delivery NetBox has not heard of
        yet still finds the run consumed: the outbox is the release.
        """
        run, _ = self.deliverWhile("down")
        self.fleet.restart(wipeVault=True)
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)
        self.fleet.http.down = False
        self.fleet.clock.advance(5)
        self.assertEqual(self.w1["status"], "staged")


class NetBoxServiceTests(SynchronousTestCase):
    """Start-up: fleetd's custom fields are checked before anything is pushed."""

    def make(self, fake: FakeNetBox | None = None) -> tuple[NetBoxRig, Any, list[str]]:
        rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3", fake)
        rig.worker.stop()
        self.addCleanup(rig.close)
        refusals: list[str] = []
        service = NetBoxService(
            rig.clock,
            rig.client,
            rig.runner,
            rig.journal,
            configDigest=lambda run: None,
            onRefused=refusals.append,
            wake=lambda f: rig.clock.callLater(0, f),
        )
        return rig, service, refusals

    def test_missingFields_refuseStartNamingThem(self) -> None:
        """A missing custom field refuses the start, naming it; nothing is pushed."""
        fake = FakeNetBox(basePath="/netbox/", customFields={"fleetd_uuid": "text"})
        rig, service, refusals = self.make(fake)
        service.startService()
        (message,) = refusals
        self.assertIn("fleetd_class, fleetd_release", message)
        self.assertIn("conf/netbox/custom-fields.json", message)
        self.assertIsNone(service.worker.push)
        self.assertEqual(rig.clock.getDelayedCalls(), [])  # worker, mirror idle
        self.successResultOf(service.stopService())

    def test_unreachable_retriedThenStarted(self) -> None:
        """NetBox down at start: the check retries with backoff, then starts."""
        rig, service, refusals = self.make()
        seedFake(rig.fake, W1)
        rig.http.down = True
        service.startService()
        rig.clock.advance(1)
        rig.http.down = False
        rig.clock.advance(2)
        self.assertEqual(refusals, [])
        rig.runner.run(
            lambda db: service.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        rig.clock.advance(0)
        self.assertEqual(rig.fake.byName("w1")["status"], "planned")
        self.successResultOf(service.stopService())
        self.assertEqual(rig.clock.getDelayedCalls(), [])

    def test_stop_whileChecking_cancels(self) -> None:
        """Stopping while the check backs off leaves no timer behind."""
        rig, service, _ = self.make()
        rig.http.down = True
        service.startService()
        self.successResultOf(service.stopService())
        self.assertEqual(rig.clock.getDelayedCalls(), [])


class ProvisionTests(SynchronousTestCase):
    """A device NetBox holds as decommissioning cannot be provisioned."""

    def test_decommissioning_refusedAndJournaled(self) -> None:
        """Provisioning a decommissioning device is refused (409) and journaled."""
        rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(rig.close)
        seedFake(rig.fake, W1)
        rig.fake.edit(rig.fake.byName("w1")["id"], status="decommissioning")
        registry: Any = None  # never reached
        resource = ProvisionResource(registry, rig.inventory, RENDERER, rig.journal)
        failure = self.failureResultOf(
            Deferred.fromCoroutine(resource.provisioner.provision(["w1"], "owner:ann")),
            Refused,
        )
        self.assertEqual(statusOf(failure.value), 409)
        self.assertIn("decommissioning", str(failure.value))
        self.assertEqual(_events(rig, "w1"), ["provision.refused"])


class ShippedFieldsTests(SynchronousTestCase):
    def test_conf_createsExactlyTheCheckedFields(self) -> None:
        """conf/netbox/custom-fields.json creates the fields fleetd checks for."""
        shipped = json.loads(
            (REPO / "conf" / "netbox" / "custom-fields.json").read_text()
        )
        self.assertEqual(
            {f["name"]: f["type"] for f in shipped}, dict(CUSTOM_FIELD_TYPES)
        )
        for field in shipped:
            self.assertEqual(field["object_types"], ["dcim.device"])


class _FailingRunner:
    """A runner whose every call fails as a broken database does."""

    def run(self, f: Any) -> Deferred[Any]:
        return fail(StoreError("disk I/O error"))


class FaultTests(SynchronousTestCase):
    """[J1] Faults change nothing and give the caller one clear line."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.w1 = seedFake(self.rig.fake, W1)

    def pending(self) -> int:
        count: int = self.successResultOf(self.rig.runner.run(pendingCount))
        return count

    def test_journalRefuses_nothingQueued(self) -> None:
        """[J1] When the journal refuses the entry, no change is queued for NetBox."""
        bad = Entry("device.status", actor="owner:ann", fields={"token": "x"})
        d = self.rig.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=[bad])
        failure = self.failureResultOf(d, InventoryError)
        self.assertIn("journal refused", str(failure.value))
        self.assertNotIn("\n", str(failure.value))
        self.assertEqual(self.pending(), 0)
        self.rig.settle()
        self.assertEqual(self.rig.fake.devices[self.w1]["status"], "inventory")

    def test_databaseFails_unavailable(self) -> None:
        """[J1] A failing database: the change fails (unavailable), NetBox untouched."""
        inventory = NetBoxInventory(
            self.rig.client,
            _FailingRunner(),
            AsyncJournal(_FailingRunner(), Journal(KEY), self.rig.clock),
            self.rig.clock,
        )
        record = ServedRecord("r-1", "w1", 1.0, "p")
        for d in (
            inventory.setStatus("w1", DeviceStatus.PLANNED, journal=()),
            inventory.release(record, journal=()),
            inventory.releasedRuns(),
        ):
            failure = self.failureResultOf(d, InventoryError)
            self.assertEqual(failure.value.kind, "unavailable")
            self.assertIn("disk I/O error", str(failure.value))
        self.assertEqual(self.rig.fake.devices[self.w1]["status"], "inventory")

    def test_netboxDown_changeRefusedBeforeCommit(self) -> None:
        """
        NetBox down when an owner's change needs the device read first:
        one line saying NetBox is unreachable, nothing queued or journaled.
        """
        self.rig.http.down = True
        entry = Entry("device.status", actor="owner:ann", device="w1")
        d = self.rig.inventory.setStatus("w1", DeviceStatus.ACTIVE, journal=[entry])
        failure = self.failureResultOf(d, InventoryError)
        self.assertEqual(failure.value.kind, "unavailable")
        self.assertIn("unreachable", str(failure.value))
        self.assertEqual(self.pending(), 0)
        self.assertEqual(_events(self.rig, "w1"), [])


class OutboxRowTests(SynchronousTestCase):
    def test_settled_statusRowsGoReleaseRowsStay(self) -> None:
        """Settled status changes leave the outbox; releases stay as served records."""
        rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(rig.close)
        seedFake(rig.fake, W1)
        self.successResultOf(
            rig.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=())
        )
        record = ServedRecord("r-1", "w1", 1.0, "p")
        self.successResultOf(rig.inventory.release(record, journal=()))
        rig.settle()
        rows = self.successResultOf(
            rig.runner.run(
                lambda db: db.execute("SELECT run, state FROM netbox_outbox").fetchall()
            )
        )
        self.assertEqual(rows, [("r-1", "done")])
