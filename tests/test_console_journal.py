"""
The console's journal view, C{/journal} (issue 20 item 4): entries with
their event names, the filters by device and run, paging by seq, the
chain's verification state [J2] and "verify now".
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.console.journal import PAGE, Chained
from fleetd.store.verify import JournalVerification
from tests.consolesupport import ConsoleMixin, text
from tests.daemonsupport import UUID1, UUID2


def seqs(body: str) -> list[int]:
    """The seq column of the entries table, top to bottom."""
    return [int(s) for s in re.findall(r'<td class="mono">(\d+)</td>', body)]


def deviceColumn(body: str) -> set[str]:
    return set(re.findall(r'<a href="/devices/([^"]+)">', body))


class JournalViewTests(ConsoleMixin, TestCase):
    """C{/journal} over a real daemon's console."""

    async def fleet(self) -> list[dict[str, Any]]:
        """Two devices, both provisioned; the journal's entries."""
        await self.startConsole()
        await self.addDevice("w1", "SER-1", UUID1)
        await self.addDevice("w2", "SER-2", UUID2)
        await self.provision("w1", "w2")
        return await self.journal()

    def tamper(self, sql: str) -> None:
        """Change the daemon's database behind its back."""
        db = sqlite3.connect(self.settings.state / "fleetd.sqlite3")
        try:
            with db:
                db.execute(sql)
        finally:
            db.close()

    async def test_entries_eventNamesNewestFirst(self) -> None:
        entries = await self.fleet()
        code, headers, body = await self.page("GET", "/journal")
        self.assertEqual(code, 200, body)
        shown = text(body)
        for event in {e["event"] for e in entries}:
            self.assertIn(event, shown)
        self.assertEqual(seqs(body), sorted((e["seq"] for e in entries), reverse=True))
        self.assertIn('<a href="/devices/w1">w1</a>', body)
        self.assertIn("owner:owner", shown)  # fleetctl's certificate
        self.assertEqual(headers.getRawHeaders("x-frame-options"), ["DENY"])

    async def test_filter_byDevice(self) -> None:
        entries = await self.fleet()
        code, _, body = await self.page("GET", "/journal?device=W1")
        self.assertEqual(code, 200, body)
        self.assertEqual(deviceColumn(body), {"w1"})
        wanted = [e["seq"] for e in entries if e["device"] == "w1"]
        self.assertEqual(seqs(body), sorted(wanted, reverse=True))
        self.assertIn('name="device" value="w1"', body)

    async def test_filter_byRun(self) -> None:
        entries = await self.fleet()
        run = next(e["run"] for e in entries if e["device"] == "w2" and e["run"])
        code, _, body = await self.page("GET", f"/journal?run={run}")
        self.assertEqual(code, 200, body)
        wanted = [e["seq"] for e in entries if e["run"] == run]
        self.assertEqual(seqs(body), sorted(wanted, reverse=True))
        self.assertEqual(deviceColumn(body), {"w2"})

    async def test_unknownDeviceOrRun_404Page(self) -> None:
        await self.fleet()
        code, headers, body = await self.page("GET", "/journal?device=w9")
        self.assertEqual(code, 404, body)
        self.assertIn("text/html", headers.getRawHeaders("content-type")[0])
        self.assertIn("no device named w9 in the inventory or the journal", text(body))
        code, _, body = await self.page("GET", "/journal?run=r-nope")
        self.assertEqual(code, 404, body)
        self.assertIn("no run named r-nope in the journal", text(body))

    async def test_badSeqOrRepeatedField_400(self) -> None:
        await self.startConsole()
        for path in ("/journal?since=-1", "/journal?before=x", "/journal?run=a&run=b"):
            code, _, body = await self.page("GET", path)
            self.assertEqual(code, 400, path)
            self.assertIn("Refused", body)

    async def test_fieldValue_escaped(self) -> None:
        await self.startConsole()
        await self.service.journal.append(
            "test.note",
            actor="fleetd",
            fields={"note": "<script>alert(1)</script>", "n": 3, "ok": True},
        )
        code, _, body = await self.page("GET", "/journal")
        self.assertEqual(code, 200, body)
        self.assertNotIn("<script>", body)
        self.assertIn("&lt;script&gt;alert(1)&lt;/script&gt;", body)
        self.assertIn("<script>alert(1)</script>", text(body))
        self.assertIn('<span class="muted">ok</span>=true', body)

    async def test_paging_bySeq(self) -> None:
        await self.startConsole()
        total = PAGE + 50

        def notes(db: Any, record: Any) -> None:
            for n in range(total):
                record("test.note", actor="fleetd", fields={"n": n})

        await self.service.journal.change(notes)
        last = (await self.service.journal.query(newest_first=True, limit=1))[0].seq
        code, _, body = await self.page("GET", "/journal")
        self.assertEqual(seqs(body), list(range(last, last - PAGE, -1)))
        self.assertNotIn('rel="prev"', body)
        older = re.search(r'href="(/journal\?before=\d+)" rel="next"', body)
        assert older is not None, body
        code, _, body = await self.page("GET", older.group(1))
        self.assertEqual(code, 200, body)
        self.assertEqual(seqs(body), list(range(last - PAGE, 0, -1)))
        self.assertNotIn('rel="next"', body)
        newer = re.search(r'href="(/journal\?since=\d+)" rel="prev"', body)
        assert newer is not None, body
        code, _, body = await self.page("GET", newer.group(1))
        self.assertEqual(seqs(body), list(range(last, last - PAGE, -1)))
        self.assertNotIn('rel="prev"', body)  # nothing newer than the newest

    async def test_chain_verifiedThenBroken(self) -> None:
        """
        The view shows the monitor's last verdict; after a row is edited
        behind fleetd's back, "verify now" walks the chain and the view
        shows it broken, as an alert.
        """
        await self.fleet()
        await self.service.chain.verify()
        code, _, body = await self.page("GET", "/journal")
        self.assertRegex(text(body), r"Verified through seq \d+")
        self.assertIn("Last verified", text(body))
        self.assertNotIn('role="alert"', body)
        self.tamper("UPDATE journal SET device = 'w9' WHERE seq = 2")
        code, _, body = await self.page("GET", "/journal")
        self.assertIn("Verified through seq", text(body), "a load does not walk")
        # The client follows the 303 back to the view, filter kept.
        code, _, body = await self.page("POST", "/journal/verify", {"device": "w1"})
        self.assertEqual(code, 200, body)
        self.assertIn('name="device" value="w1"', body)
        self.assertEqual(deviceColumn(body), {"w1"})
        alert = re.search(r'role="alert">(.*?)</div>', body, re.S)
        assert alert is not None, body
        self.assertIn("BROKEN at seq 2: entry 2 fails its digest", text(alert.group(1)))
        self.assertNotIn("Verified through", text(body))

    async def test_chain_reanchored_showsTheAcknowledgedBreak(self) -> None:
        await self.fleet()
        self.tamper("UPDATE journal SET device = 'w9' WHERE seq = 2")
        done = await self.service.journal.reanchor(actor="owner:alice", reason="test")
        await self.service.chain.verify()
        code, _, body = await self.page("GET", "/journal")
        self.assertEqual(code, 200, body)
        shown = " ".join(text(body).split())
        self.assertIn("Verified through seq", shown)
        self.assertIn(
            f"1 acknowledged break (re-anchored at seq {done.entry.seq};"
            f" the last re-anchor is at seq {done.entry.seq})",
            shown,
        )
        self.assertIn("journal.reanchored", shown)

    async def test_notVerifiedYet_saysSo(self) -> None:
        await self.startConsole()
        chain = self.service.chain
        for _ in range(200):  # the first walk, once the load settled
            if chain.checkedAt is not None:
                break
            await deferLater(reactor, 0.01, lambda: None)
        chain._verdict = chain._checkedAt = None  # as before the first walk
        code, _, body = await self.page("GET", "/journal")
        self.assertEqual(code, 200, body)
        self.assertIn("Not verified yet", text(body))
        self.assertIn('action="/journal/verify"', body)

    async def test_noOwner_403(self) -> None:
        await self.startConsole()
        for method, path in (("GET", "/journal"), ("POST", "/journal/verify")):
            code, _, body = await self.page(method, path, {}, owner=None)
            self.assertEqual(
                (code, body), (403, "owner client certificate required\n"), path
            )
        code, _, body = await self.page("POST", "/journal/verify", {}, csrf=False)
        self.assertEqual(code, 403)
        self.assertIn("CSRF", body)
        code, _, body = await self.page("GET", "/journal/verify")
        self.assertEqual(code, 405)


class ChainedTests(SynchronousTestCase):
    """L{Chained}: one walk at a time, the next shared by who waits for it."""

    def test_askersDuringAWalk_shareTheNextOne(self) -> None:
        walks: list[Deferred[JournalVerification | None]] = []

        def walk() -> Deferred[JournalVerification | None]:
            walks.append(Deferred())
            return walks[-1]

        verify = Chained(walk)
        first = verify()
        second, third = verify(), verify()
        self.assertEqual(len(walks), 1)
        one = JournalVerification(ok=True, entries=1)
        walks[0].callback(one)
        self.assertIs(self.successResultOf(first), one)
        self.assertNoResult(second)
        self.assertEqual(len(walks), 2)
        two = JournalVerification(ok=False, entries=1, problem="x", seq=2)
        walks[1].callback(two)
        self.assertIs(self.successResultOf(second), two)
        self.assertIs(self.successResultOf(third), two)
        fourth = verify()
        self.assertEqual(len(walks), 3)
        walks[2].errback(RuntimeError("unreadable"))
        self.failureResultOf(fourth, RuntimeError)
        self.assertIsNone(self.successResultOf(Chained(lambda: succeed(None))()))
