"""
Tests for L{fleetd.store.anchor}: a journal break has a way back (issue 19
item 5) that never erases the break [J2].
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.store import (
    AsyncJournal,
    Database,
    InlineRunner,
    Journal,
    JournalVerification,
    StoreError,
)
from fleetd.store.anchor import ReanchorRefused
from fleetd.store.append import ChainKey
from fleetd.store.chain import ChainMonitor
from fleetd.store.verify import REANCHORED, Acknowledged
from tests.test_journal import KEY, JournalFixture


class ReanchorTests(JournalFixture):
    """[J2] A re-anchor acknowledges a break; the break stays in the chain."""

    def reanchor(self, reason: str = "edited by hand; checked against NetBox") -> Any:
        return self.journal.reanchor(
            self.db, at=5000.0, actor="owner:alice", reason=reason
        )

    def verify(self) -> JournalVerification:
        return self.journal.verify(self.db)

    def count(self) -> int:
        (count,) = self.db.execute("SELECT count(*) FROM journal").fetchone()
        return int(count)

    def test_intact_refused(self) -> None:
        """[J2] An intact chain has nothing to acknowledge: refused, none appended."""
        self.fill(3)
        e = self.assertRaises(ReanchorRefused, self.reanchor)
        self.assertIn("intact", str(e))
        self.assertEqual(self.count(), 3)

    def test_noReason_refused(self) -> None:
        """[J2] A re-anchor without a reason (or a multi-line one) is refused."""
        self.fill(3)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        for reason in ("", "   ", "two\nlines", "x" * 513):
            self.assertRaises(ReanchorRefused, self.reanchor, reason)
        self.assertEqual(self.count(), 3)
        self.assertFalse(self.verify().ok)

    def test_editedEntry_reanchored(self) -> None:
        """
        [J2] After an edit of entry 2, the re-anchor entry is appended after
        the last entry, names the break's seq, the digest found and the one
        expected, and the owner's reason; verification is then intact since
        the re-anchor and still reports the break, which is left as found.
        """
        entries = self.fill(5)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        broken = self.verify()
        done = self.reanchor()
        entry = done.entry
        self.assertEqual(
            (entry.seq, entry.event, entry.actor), (6, REANCHORED, "owner:alice")
        )
        self.assertEqual(
            dict(entry.fields),
            {
                "reason": "edited by hand; checked against NetBox",
                "break_seq": 2,
                "problem": "entry 2 fails its digest (edited or moved)",
                "found": entries[1].digest,
                "expected": broken.expected,
            },
        )
        self.assertNotEqual(broken.expected, entries[1].digest)
        # Chained from the last entry as stored.
        chain = ChainKey(KEY)
        self.assertEqual(
            chain.digest(bytes.fromhex(entries[4].digest), entry).hex(), entry.digest
        )
        result = self.verify()
        self.assertTrue(result.ok, result)
        self.assertEqual(result.entries, 6)
        self.assertEqual(result.acknowledged, (Acknowledged(6, 2),))
        self.assertEqual(result.anchoredAt, 6)
        # The break itself is never erased.
        (actor,) = self.db.execute("SELECT actor FROM journal WHERE seq = 2").fetchone()
        self.assertEqual(actor, "mallory")
        self.assertEqual(self.count(), 6)

    def test_appendsAfterReanchor_verify(self) -> None:
        """[J2] Entries appended after a re-anchor chain onto it and verify."""
        self.fill(3)
        self.tamper("UPDATE journal SET event = 'x.y' WHERE seq = 1")
        self.reanchor()
        self.fill(2)
        result = self.verify()
        self.assertEqual((result.ok, result.entries, result.anchoredAt), (True, 6, 4))

    def test_secondBreak_isNew(self) -> None:
        """
        [J2] A break after the re-anchor is a new, unacknowledged break
        (the acknowledged one is still listed); it can be re-anchored in
        turn, and both stay acknowledged.
        """
        self.fill(3)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        self.reanchor()
        self.fill(2)  # seqs 5 and 6
        self.tamper("UPDATE journal SET device = 'node-9' WHERE seq = 5")
        result = self.verify()
        self.assertEqual((result.ok, result.seq), (False, 5))
        self.assertEqual(result.acknowledged, (Acknowledged(4, 2),))
        self.reanchor("second edit; restored devices from NetBox")
        result = self.verify()
        self.assertTrue(result.ok, result)
        self.assertEqual(result.acknowledged, (Acknowledged(4, 2), Acknowledged(7, 5)))

    def test_editBeforeAcknowledgedBreak_isNew(self) -> None:
        """[J2] The entries before an acknowledged break are still checked."""
        self.fill(4)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 3")
        self.reanchor()
        self.tamper("UPDATE journal SET actor = 'eve' WHERE seq = 1")
        result = self.verify()
        self.assertEqual((result.ok, result.seq), (False, 1))

    def test_acknowledgedBreakChanged_isNew(self) -> None:
        """[J2] Editing the broken entry again is not covered by the re-anchor."""
        self.fill(4)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        self.reanchor()
        self.tamper("UPDATE journal SET actor = 'eve' WHERE seq = 2")
        result = self.verify()
        self.assertEqual((result.ok, result.seq), (False, 2))

    def test_acknowledgedDigestChanged_isNew(self) -> None:
        """
        [J2] A re-anchor acknowledges the digest it found: writing another
        digest into the broken entry is a new break.
        """
        self.fill(4)
        self.tamper("UPDATE journal SET digest = ? WHERE seq = 2", "ab" * 32)
        self.reanchor()
        self.assertTrue(self.verify().ok)
        self.tamper("UPDATE journal SET digest = ? WHERE seq = 2", "cd" * 32)
        result = self.verify()
        self.assertEqual((result.ok, result.seq), (False, 2))

    def test_reanchorEdited_isBroken(self) -> None:
        """[J2] The re-anchor entry is itself in the chain: editing it is a break."""
        self.fill(3)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        self.reanchor()
        fields = json.loads(
            self.db.execute("SELECT fields FROM journal WHERE seq = 4").fetchone()[0]
        )
        fields["reason"] = "nothing to see"
        self.tamper(
            "UPDATE journal SET fields = ? WHERE seq = 4",
            json.dumps(fields, sort_keys=True, separators=(",", ":")),
        )
        result = self.verify()
        self.assertEqual((result.ok, result.seq), (False, 4))

    def test_forgedReanchor_notAcknowledged(self) -> None:
        """
        [J2] A re-anchor row written without the key (naming the break
        exactly) acknowledges nothing.
        """
        self.fill(3)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        broken = self.verify()
        fields = {
            "break_seq": 2, "expected": broken.expected, "found": broken.found,
            "problem": broken.problem, "reason": "forged",
        }  # fmt: skip
        self.tamper(
            "INSERT INTO journal (seq, at, event, actor, device, run, fields, digest)"
            " VALUES (4, 1.0, ?, 'owner:alice', NULL, NULL, ?, ?)",
            REANCHORED,
            json.dumps(fields, sort_keys=True, separators=(",", ":")),
            "ab" * 32,
        )
        result = self.verify()
        self.assertFalse(result.ok)
        self.assertEqual(result.acknowledged, ())

    def test_reanchorDeleted_isBroken(self) -> None:
        """[J2] Deleting the re-anchor (the last entry) is a break again."""
        self.fill(3)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        self.reanchor()
        self.tamper("DELETE FROM journal WHERE seq = 4")
        self.assertFalse(self.verify().ok)

    def test_everyBreakKind_reanchored(self) -> None:
        """
        [J2] Every break verification reports can be re-anchored: an edited,
        deleted or inserted entry, a truncated tail, a forged, missing or
        stale head. Appends work again afterwards (a bad head stops them).
        """
        tampering = {
            "edited": ["UPDATE journal SET run = 'run-9' WHERE seq = 3"],
            "digest": ["UPDATE journal SET digest = ? WHERE seq = 3"],
            "deleted": ["DELETE FROM journal WHERE seq = 3"],
            "first": ["DELETE FROM journal WHERE seq = 1"],
            "tail": ["DELETE FROM journal WHERE seq >= 4"],
            "head-missing": ["DELETE FROM journal_head"],
            "head-forged": ["UPDATE journal_head SET mac = ?"],
            "head-stale": ["UPDATE journal_head SET seq = 3"],
        }
        for kind, statements in tampering.items():
            self.path, self.db = self.openFresh()
            self.fill(5)
            for sql in statements:
                self.tamper(sql, *(["cd" * 32] if "?" in sql else []))
            broken = self.verify()
            self.assertFalse(broken.ok, kind)
            done = self.reanchor()
            self.assertEqual(done.breakSeq, broken.seq, kind)
            assert broken.seq is not None
            self.fill(1)
            result = self.verify()
            self.assertTrue(result.ok, (kind, result))
            self.assertEqual(
                result.acknowledged, (Acknowledged(done.entry.seq, broken.seq),), kind
            )

    def test_badHead_appendsRefusedUntilReanchored(self) -> None:
        """[J1] [J2] A missing head stops appends; the re-anchor lets them go on."""
        self.fill(2)
        self.tamper("DELETE FROM journal_head")
        self.assertRaises(StoreError, self.fill, 1)
        self.reanchor()
        self.fill(1)
        self.assertTrue(self.verify().ok)

    def test_reanchor_logged(self) -> None:
        """The re-anchor is logged with a stable event name, seq and break."""
        self.fill(2)
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 1")
        with capturedLogs() as events:
            self.reanchor()
        (event,) = [e for e in events if "journal.reanchored" in e["log_format"]]
        self.assertEqual((event["seq"], event["breakSeq"]), (3, 1))


class ReanchorGaugeTests(SynchronousTestCase):
    """[J2] The chain gauge after a re-anchor, and after a later break."""

    def test_gauge_clearsAfterReanchor_dropsOnNewBreak(self) -> None:
        """
        [J2] A break sets C{fleetd_journal_chain_ok} to 0; after the
        re-anchor it is 1 and C{fleetd_journal_acknowledged_breaks} is 1; a
        later break sets it to 0 again (FleetJournalChainBroken fires again).
        """
        path = Path(self.mktemp()) / "db.sqlite3"
        db = Database.open(path)
        self.addCleanup(db.close)
        clock = Clock()
        journal = AsyncJournal(InlineRunner(db), Journal(KEY), clock)
        registry = CollectorRegistry()
        monitor = ChainMonitor(clock, journal, registry, 60.0)
        for n in range(3):
            self.successResultOf(journal.append("test.event", actor=f"a{n}"))
        raw = sqlite3.connect(path, isolation_level=None)
        self.addCleanup(raw.close)
        raw.execute("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        self.successResultOf(monitor.verify())
        value = registry.get_sample_value
        self.assertEqual(value("fleetd_journal_chain_ok"), 0.0)
        self.assertEqual(value("fleetd_journal_acknowledged_breaks"), 0.0)
        self.successResultOf(journal.reanchor(actor="owner:alice", reason="checked"))
        self.successResultOf(monitor.verify())
        self.assertEqual(value("fleetd_journal_chain_ok"), 1.0)
        self.assertEqual(value("fleetd_journal_acknowledged_breaks"), 1.0)
        self.successResultOf(journal.append("test.after", actor="fleetd"))
        raw.execute("UPDATE journal SET actor = 'mallory' WHERE seq = 5")
        self.successResultOf(monitor.verify())
        self.assertEqual(value("fleetd_journal_chain_ok"), 0.0)
        self.assertEqual(value("fleetd_journal_acknowledged_breaks"), 1.0)
