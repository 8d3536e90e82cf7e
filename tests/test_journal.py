"""Tests for L{fleetd.store.journal}: durable, queryable, hash-chained (§4)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.store import (
    JOURNAL_PURPOSE,
    AsyncJournal,
    Database,
    FieldValue,
    InlineRunner,
    Journal,
    JournalEntry,
    StoreError,
    deriveKey,
)

KEY = deriveKey(b"m" * 32, JOURNAL_PURPOSE)
ENTRY_COLUMNS = ("at", "event", "actor", "device", "run", "fields", "digest")


class JournalFixture(SynchronousTestCase):
    """A fresh database and journal per test, plus raw SQL for tampering."""

    def setUp(self) -> None:
        self.journal = Journal(KEY)
        self.path, self.db = self.openFresh()

    def openFresh(self) -> tuple[Path, Database]:
        path = Path(self.mktemp()) / "fleetd.sqlite3"
        db = Database.open(path)
        self.addCleanup(db.close)
        return path, db

    def fill(self, count: int, db: Database | None = None) -> list[JournalEntry]:
        """Append C{count} entries alternating between two devices and runs."""
        return [
            self.journal.append(
                db or self.db,
                "run.provisioned",
                at=1000.0 + n,
                actor="fleetd",
                device=f"node-{n % 2}",
                run=f"run-{n % 3}",
                fields={"n": n, "state": "ok", "ratio": n / 4, "final": n % 2 == 0},
            )
            for n in range(count)
        ]

    def tamper(self, sql: str, *parameters: object, path: Path | None = None) -> None:
        """Change the database behind fleetd's back, as an attacker would."""
        raw = sqlite3.connect(path or self.path, isolation_level=None)
        try:
            raw.execute(sql, parameters)
        finally:
            raw.close()

    def assertBroken(self, problem: str, seq: int | None) -> None:
        result = self.journal.verify(self.db)
        self.assertFalse(result.ok, result)
        self.assertIn(problem, result.problem or "")
        self.assertEqual(result.seq, seq)


class JournalAppendTests(JournalFixture):
    """Appending and querying entries."""

    def test_append_first(self) -> None:
        """The first entry has seq 1, the given values and a hex digest."""
        entry = self.journal.append(
            self.db,
            "run.provisioned",
            at=5,
            actor="owner:alice",
            device="node-1",
            run="run-1",
            fields={"disk": "/dev/sda"},
        )
        self.assertEqual(
            (entry.seq, entry.at, entry.event, entry.actor, entry.device, entry.run),
            (1, 5.0, "run.provisioned", "owner:alice", "node-1", "run-1"),
        )
        self.assertEqual(dict(entry.fields), {"disk": "/dev/sda"})
        self.assertEqual(len(bytes.fromhex(entry.digest)), 32)

    def test_append_contiguous(self) -> None:
        """Seqs count up from 1 and every digest differs."""
        entries = self.fill(4)
        self.assertEqual([e.seq for e in entries], [1, 2, 3, 4])
        self.assertEqual(len({e.digest for e in entries}), 4)

    def test_append_keyed(self) -> None:
        """The chain depends on the key: another key gives other digests."""
        other = Journal(deriveKey(b"n" * 32, JOURNAL_PURPOSE))
        _, db = self.openFresh()
        mine = self.journal.append(self.db, "a", at=1, actor="fleetd")
        theirs = other.append(db, "a", at=1, actor="fleetd")
        self.assertNotEqual(mine.digest, theirs.digest)

    def test_append_fieldsFrozen(self) -> None:
        """An entry's fields are a snapshot that cannot be changed."""
        fields: dict[str, FieldValue] = {"n": 1}
        entry = self.journal.append(self.db, "a", at=1, actor="fleetd", fields=fields)
        fields["n"] = 2
        self.assertEqual(entry.fields["n"], 1)

        def mutate() -> None:
            entry.fields["n"] = 3  # type: ignore[index]

        self.assertRaises(TypeError, mutate)

    def test_query_byDeviceAndRun(self) -> None:
        """Queries filter by device, by run, or both, in ascending seq order."""
        self.fill(6)
        byDevice = self.journal.query(self.db, device="node-1")
        self.assertEqual([e.seq for e in byDevice], [2, 4, 6])
        byRun = self.journal.query(self.db, run="run-0")
        self.assertEqual([e.seq for e in byRun], [1, 4])
        both = self.journal.query(self.db, device="node-1", run="run-0")
        self.assertEqual([e.seq for e in both], [4])
        self.assertEqual(self.journal.query(self.db, device="node-9"), [])

    def test_query_sinceAndLimit(self) -> None:
        """C{since_seq} is exclusive; C{limit} caps the page size."""
        self.fill(6)
        page = self.journal.query(self.db, since_seq=2, limit=3)
        self.assertEqual([e.seq for e in page], [3, 4, 5])
        self.assertRaises(ValueError, self.journal.query, self.db, limit=0)

    def test_query_newestFirst(self) -> None:
        """
        C{newest_first} takes the last C{limit} entries of the window,
        descending; C{before_seq} is exclusive and combines with the
        filters and C{since_seq}.
        """
        self.fill(8)
        newest = self.journal.query(self.db, newest_first=True, limit=3)
        self.assertEqual([e.seq for e in newest], [8, 7, 6])
        older = self.journal.query(self.db, before_seq=6, newest_first=True, limit=3)
        self.assertEqual([e.seq for e in older], [5, 4, 3])
        window = self.journal.query(self.db, since_seq=2, before_seq=6)
        self.assertEqual([e.seq for e in window], [3, 4, 5])
        device = self.journal.query(
            self.db, device="node-1", before_seq=8, newest_first=True
        )
        self.assertEqual([e.seq for e in device], [6, 4, 2])

    def test_query_roundTrip(self) -> None:
        """Read-back entries equal the appended ones, field types included."""
        appended = self.fill(3)
        self.assertEqual(self.journal.query(self.db), appended)
        fields = self.journal.query(self.db)[1].fields
        self.assertEqual(
            [type(fields[k]) for k in ("n", "state", "ratio", "final")],
            [int, str, float, bool],
        )

    def test_journal_survivesReopen(self) -> None:
        """Entries persist across close/reopen and the chain continues."""
        appended = self.fill(2)
        self.db.close()
        self.db = Database.open(self.path)
        self.addCleanup(self.db.close)
        self.assertEqual(self.journal.query(self.db), appended)
        self.assertEqual(self.fill(1)[0].seq, 3)
        self.assertTrue(self.journal.verify(self.db).ok)

    def test_toJSON(self) -> None:
        """C{toJSON} gives every attribute as plain JSON-serialisable values."""
        entry = self.fill(1)[0]
        encoded = json.loads(json.dumps(entry.toJSON()))
        self.assertEqual(
            encoded,
            {
                "seq": 1,
                "at": 1000.0,
                "event": "run.provisioned",
                "actor": "fleetd",
                "device": "node-0",
                "run": "run-0",
                "fields": {"n": 0, "state": "ok", "ratio": 0.0, "final": True},
                "digest": entry.digest,
            },
        )


class HeadCacheTests(JournalFixture):
    """
    Inside one group commit the journal chains onto the head it wrote
    last instead of reading it back; that must never outlive a rollback
    or the transaction.
    """

    def test_groupCommit_rolledBackAppend_nextChainsOnStoredHead(self) -> None:
        """[J2] An append rolled back to its savepoint leaves no gap or fork."""
        with self.db.groupCommit():
            self.journal.append(self.db, "a.one", at=1.0, actor="fleetd")
            with self.assertRaises(KeyError):
                with self.db.transaction():
                    self.journal.append(self.db, "a.two", at=2.0, actor="fleetd")
                    raise KeyError("the change failed after its entry")
            self.journal.append(self.db, "a.three", at=3.0, actor="fleetd")
        result = self.journal.verify(self.db)
        self.assertTrue(result.ok, result)
        self.assertEqual(
            [e.event for e in self.journal.query(self.db)], ["a.one", "a.three"]
        )

    def test_nextTransaction_readsHead_tamperingRefused(self) -> None:
        """[J2] A head changed between two transactions is read, not trusted."""
        self.fill(2)
        self.tamper("UPDATE journal_head SET mac = 'forged'")
        with self.assertRaises(StoreError):
            self.journal.append(self.db, "a.late", at=9.0, actor="fleetd")


class SecretGuardTests(JournalFixture):
    """No secret ever appears in the journal (§4)."""

    def assertRefused(self, **kwargs: Any) -> ValueError:
        arguments: dict[str, Any] = {"at": 1.0, "actor": "fleetd"}
        arguments.update(kwargs)
        event = arguments.pop("event", "run.provisioned")
        error: ValueError = self.assertRaises(
            ValueError, self.journal.append, self.db, event, **arguments
        )
        self.assertEqual(self.journal.query(self.db), [])
        return error

    def test_append_refusesSecretFieldNames(self) -> None:
        """Field names containing a secret word, in any case, are refused."""
        for name in [
            "code",
            "bootCode",
            "TOKEN",
            "join_token",
            "config",
            "machineConfig",
            "body",
            "apiKey",
            "KEY",
            "secret",
            "Password",
            "cert_pem",
            "CERT_PEM",
        ]:
            error = self.assertRefused(fields={name: "x"})
            self.assertIn("secret", str(error))

    def test_append_refusesLongString(self) -> None:
        """String values over 512 characters are refused, without echoing them."""
        self.journal.append(self.db, "a", at=1, actor="fleetd", fields={"s": "x" * 512})
        self.db.execute("DELETE FROM journal")
        self.db.execute("DELETE FROM journal_head")
        error = self.assertRefused(fields={"reason": "hunter2" * 80})
        self.assertNotIn("hunter2", str(error))

    def test_append_refusesPEM(self) -> None:
        """A PEM block in a value is refused whatever the field is called."""
        self.assertRefused(fields={"note": "-----BEGIN " + "PRIVATE KEY-----\nMIIE"})

    def test_append_refusesBadValues(self) -> None:
        """Only finite scalars are accepted as field values."""
        for value in [["a"], {"a": 1}, b"raw", float("nan"), float("inf"), 2**64]:
            self.assertRefused(fields={"v": value})

    def test_append_refusesBadNames(self) -> None:
        """Events, actors, devices, runs and field names are checked."""
        for event in ["", "Run.Provisioned", "run provisioned", "a" * 129, "a:b"]:
            self.assertRefused(event=event)
        for actor in ["", "owner alice", "a" * 129, ":x"]:
            self.assertRefused(actor=actor)
        for name in ["", "x" * 129, "node\n1"]:
            self.assertRefused(device=name)
            self.assertRefused(run=name)
        for field in ["", "a b", "x" * 65]:
            self.assertRefused(fields={field: 1})
        self.assertRefused(fields={f"f{n}": n for n in range(65)})

    def test_append_acceptsLimits(self) -> None:
        """The longest names and values allowed are accepted."""
        entry = self.journal.append(
            self.db,
            "a" * 128,
            at=1,
            actor="node:" + "n" * 123,
            device="d" * 128,
            run="r" * 128,
            fields={"s": "x" * 512, "none": None, "big": 2**63 - 1},
        )
        self.assertEqual(self.journal.query(self.db), [entry])


class VerifyTests(JournalFixture):
    """L{Journal.verify} detects every tampering it claims to (§4)."""

    def test_verify_clean(self) -> None:
        """An untouched chain verifies, counting every entry."""
        self.fill(5)
        result = self.journal.verify(self.db)
        self.assertEqual((result.ok, result.entries, result.problem), (True, 5, None))

    def test_verify_empty(self) -> None:
        """An empty journal verifies with zero entries."""
        self.assertEqual(self.journal.verify(self.db).entries, 0)
        self.assertTrue(self.journal.verify(self.db).ok)

    def test_verify_editedColumn(self) -> None:
        """Editing any column of one entry breaks the chain at that entry."""
        values: dict[str, object] = {
            "at": 1.5,
            "event": "run.retired",
            "actor": "owner:mallory",
            "device": None,
            "run": "run-9",
            "fields": '{"n":1,"state":"ok"}',
            "digest": "00" * 32,
        }
        for column in ENTRY_COLUMNS:
            self.path, self.db = self.openFresh()
            self.fill(4)
            sql = f"UPDATE journal SET {column} = ? WHERE seq = 2"  # noqa: S608
            self.tamper(sql, values[column])
            self.assertBroken("entry 2", 2)

    def test_verify_reformattedFields(self) -> None:
        """Even a whitespace-only edit of the stored fields is caught."""
        self.fill(2)
        self.tamper("UPDATE journal SET fields = ? WHERE seq = 1", '{"final": true}')
        self.assertBroken("entry 1", 1)

    def test_verify_deletedMiddle(self) -> None:
        """A deleted middle entry is reported missing."""
        self.fill(5)
        self.tamper("DELETE FROM journal WHERE seq = 3")
        self.assertBroken("entry 3 is missing", 3)

    def test_verify_deletedFirst(self) -> None:
        """A deleted first entry is reported missing."""
        self.fill(5)
        self.tamper("DELETE FROM journal WHERE seq = 1")
        self.assertBroken("entry 1 is missing", 1)

    def test_verify_deletedLast(self) -> None:
        """A truncated tail is caught by the head."""
        self.fill(5)
        self.tamper("DELETE FROM journal WHERE seq >= 4")
        self.assertBroken("entries after 3 are missing", 4)

    def test_verify_headRewound(self) -> None:
        """Truncating and pointing the head at the new tail needs the key."""
        entries = self.fill(5)
        self.tamper("DELETE FROM journal WHERE seq = 5")
        self.tamper("UPDATE journal_head SET seq = 4, digest = ?", entries[3].digest)
        self.assertBroken("head is not authentic", 4)  # the entry the head should name

    def test_verify_reordered(self) -> None:
        """Swapping two entries (seqs kept in order) is caught."""
        self.fill(4)
        self.tamper("UPDATE journal SET seq = 100 WHERE seq = 2")
        self.tamper("UPDATE journal SET seq = 2 WHERE seq = 3")
        self.tamper("UPDATE journal SET seq = 3 WHERE seq = 100")
        self.assertBroken("entry 2", 2)

    def test_verify_insertedMiddle(self) -> None:
        """An entry slipped in between others (renumbering the rest) is caught."""
        self.fill(4)
        for seq in (4, 3):
            self.tamper("UPDATE journal SET seq = seq + 1 WHERE seq = ?", seq)
        self.tamper(
            "INSERT INTO journal VALUES (3, 1.0, 'run.retired', 'fleetd', NULL, NULL,"
            " '{}', ?)",
            "ab" * 32,
        )
        self.assertBroken("entry 3", 3)

    def test_verify_appendedForged(self) -> None:
        """An entry added after the head is caught."""
        self.fill(3)
        self.tamper(
            "INSERT INTO journal VALUES (4, 1.0, 'run.retired', 'fleetd', NULL, NULL,"
            " '{}', ?)",
            "ab" * 32,
        )
        result = self.journal.verify(self.db)
        self.assertFalse(result.ok)
        self.assertEqual(result.seq, 4)

    def test_verify_forgedHead(self) -> None:
        """Any edit of the head row is caught."""
        for column, value in [("seq", 9), ("digest", "00" * 32), ("mac", "00" * 32)]:
            self.path, self.db = self.openFresh()
            self.fill(3)
            self.tamper(f"UPDATE journal_head SET {column} = ?", value)  # noqa: S608
            self.assertBroken("head is not authentic", 3)

    def test_verify_headDeleted(self) -> None:
        """A journal with entries but no head is caught."""
        self.fill(2)
        self.tamper("DELETE FROM journal_head")
        self.assertBroken("head is missing", 2)

    def test_verify_wrongKey(self) -> None:
        """A journal checked with another key fails at its first entry."""
        self.fill(2)
        self.journal = Journal(deriveKey(b"n" * 32, JOURNAL_PURPOSE))
        self.assertBroken("entry 1", 1)

    def test_verify_logsProblem(self) -> None:
        """A failed verify logs a stable event name with the problem."""
        self.fill(2)
        self.tamper("DELETE FROM journal WHERE seq = 1")
        with capturedLogs() as events:
            self.journal.verify(self.db)
        failures = [e for e in events if e.get("log_format", "").startswith("journal.")]
        self.assertEqual(len(failures), 1)
        self.assertEqual(failures[0]["log_format"], "journal.verify_failed {problem}")
        self.assertEqual(failures[0]["seq"], 1)

    def test_append_refusesBrokenHead(self) -> None:
        """Appending onto a forged head or a truncated tail is refused."""
        self.fill(3)
        self.tamper("DELETE FROM journal WHERE seq = 3")
        error = self.assertRaises(
            StoreError, self.journal.append, self.db, "a", at=1, actor="fleetd"
        )
        self.assertIn("does not match", str(error))
        self.tamper("UPDATE journal_head SET mac = ?", "00" * 32)
        error = self.assertRaises(
            StoreError, self.journal.append, self.db, "a", at=1, actor="fleetd"
        )
        self.assertIn("not authentic", str(error))
        self.tamper("DELETE FROM journal_head")
        error = self.assertRaises(
            StoreError, self.journal.append, self.db, "a", at=1, actor="fleetd"
        )
        self.assertIn("missing", str(error))
        self.assertEqual(len(self.journal.query(self.db)), 2)


_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
_SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _TEXT
_ENTRIES = st.lists(
    st.fixed_dictionaries(
        {
            "event": st.sampled_from(["run.provisioned", "code.issued", "a"]),
            "actor": st.sampled_from(["fleetd", "owner:alice", "node:n1"]),
            "device": st.none() | st.sampled_from(["n1", "n2"]),
            "run": st.none() | st.sampled_from(["r1", "r2"]),
            "fields": st.dictionaries(st.sampled_from(["n", "why", "ok"]), _SCALARS),
            "at": st.floats(0, 2e9),
        }
    ),
    min_size=1,
    max_size=6,
)
_NEW_VALUES: dict[str, st.SearchStrategy[object]] = {
    "seq": st.integers(-3, 20),
    "at": st.floats(allow_nan=False, allow_infinity=False),
    "event": _TEXT,
    "actor": _TEXT,
    "device": st.none() | _TEXT,
    "run": st.none() | _TEXT,
    "fields": _TEXT | st.just("{}"),
    "digest": _TEXT | st.just("00" * 32),
    "mac": _TEXT | st.just("00" * 32),
}


class VerifyPropertyTests(JournalFixture):
    """Property: no single-row change goes unnoticed (§4)."""

    @settings(max_examples=60, deadline=None)
    @given(entries=_ENTRIES, data=st.data())
    def test_verify_anySingleRowChange(
        self, entries: list[dict[str, Any]], data: st.DataObject
    ) -> None:
        """For any journal and any one edited or deleted row (entry or head),
        verify fails."""
        path, db = self.openFresh()
        for entry in entries:
            arguments = dict(entry)
            self.journal.append(db, arguments.pop("event"), **arguments)
        self.assertTrue(self.journal.verify(db).ok)
        table = data.draw(st.sampled_from(["journal", "journal_head"]))
        if table == "journal":
            seq = data.draw(st.integers(1, len(entries)))
            columns: tuple[str, ...] = ("seq", *ENTRY_COLUMNS)
        else:
            seq = 1
            columns = ("seq", "digest", "mac")
        where = "seq = ?" if table == "journal" else "id = ?"
        column = data.draw(st.sampled_from([*columns, None]))
        if column is None:
            self.tamper(f"DELETE FROM {table} WHERE {where}", seq, path=path)  # noqa: S608
        else:
            key = "seq" if table == "journal" else "id"
            old = db.execute(
                f"SELECT {column} FROM {table} WHERE {key} = ?",  # noqa: S608
                (seq,),
            ).fetchone()[0]
            new = data.draw(_NEW_VALUES[column])
            assume(new != old)
            if column == "seq" and table == "journal":
                assume(new not in range(1, len(entries) + 1))  # no PK clash
            self.tamper(
                f"UPDATE {table} SET {column} = ? WHERE {where}",  # noqa: S608
                new,
                seq,
                path=path,
            )
        self.assertFalse(self.journal.verify(db).ok)


class AsyncJournalTests(SynchronousTestCase):
    """L{AsyncJournal} stamps entries with the clock and uses the runner."""

    def setUp(self) -> None:
        self.db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.db.close)
        self.clock = Clock()
        self.journal = AsyncJournal(InlineRunner(self.db), Journal(KEY), self.clock)

    def test_append_usesClock(self) -> None:
        """The entry's time is C{clock.seconds()} when append was called."""
        self.clock.advance(42.5)
        entry = self.successResultOf(
            self.journal.append("run.provisioned", actor="fleetd", device="n1")
        )
        self.assertEqual((entry.seq, entry.at, entry.device), (1, 42.5, "n1"))

    def test_queryVerify(self) -> None:
        """Query and verify results arrive through Deferreds."""
        self.journal.append("a", actor="fleetd", run="r1")
        self.journal.append("b", actor="fleetd", run="r2")
        entries = self.successResultOf(self.journal.query(run="r2"))
        self.assertEqual([e.event for e in entries], ["b"])
        result = self.successResultOf(self.journal.verify())
        self.assertEqual((result.ok, result.entries), (True, 2))

    def test_change_entriesWithOwnTimes_chainVerifies(self) -> None:
        """
        [J1] [J2] Entries recorded in one change with their own times keep
        them (the others take the change's time) and the chain verifies.
        """
        self.clock.advance(100.0)

        def work(db: Database, record: Any) -> None:
            record("a", actor="fleetd", run="r1", at=90.25)
            record("b", actor="fleetd", run="r2")
            record("c", actor="fleetd", run="r3", at=95.5)

        self.successResultOf(self.journal.change(work))
        entries = self.successResultOf(self.journal.query())
        self.assertEqual(
            [(e.event, e.at) for e in entries],
            [("a", 90.25), ("b", 100.0), ("c", 95.5)],
        )
        result = self.successResultOf(self.journal.verify())
        self.assertEqual((result.ok, result.entries), (True, 3))
        refused = self.journal.change(
            lambda db, record: record("d", actor="fleetd", at=float("inf"))
        )
        self.failureResultOf(refused, ValueError)

    def test_append_refusedFails(self) -> None:
        """A refused entry fails the Deferred with L{ValueError}."""
        d = self.journal.append("a", actor="fleetd", fields={"token": "x"})
        self.failureResultOf(d, ValueError)


class DigestPartsTests(SynchronousTestCase):
    """The append path builds the chain digest from parts; it must match."""

    @given(
        event=st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True),
        actor=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,20}", fullmatch=True),
        device=st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
        at=st.floats(min_value=0, max_value=4e9, allow_nan=False),
        seq=st.integers(min_value=1, max_value=2**40),
        text=st.text(max_size=20),
        number=st.integers(min_value=-(2**31), max_value=2**31),
    )
    def test_digestOf_matchesDigest(
        self,
        event: str,
        actor: str,
        device: str | None,
        at: float,
        seq: int,
        text: str,
        number: int,
    ) -> None:
        """[J2] The fast digest equals the one verification recomputes."""
        from types import MappingProxyType

        from fleetd.store.entries import JournalEntry

        journal = Journal(b"k" * 32)
        fields: dict[str, FieldValue] = {
            "note": text,
            "n": number,
            "flag": True,
            "none": None,
        }
        try:
            pending = journal.prepare(event, actor=actor, device=device, fields=fields)
        except ValueError:
            return  # a field the secret guard refuses: nothing to compare
        previous = bytes(range(32))
        entry = JournalEntry(
            seq, at, event, actor, device, None, MappingProxyType(pending.fields), ""
        )
        self.assertEqual(
            journal._digestOf(previous, seq, at, pending),
            journal._digest(previous, entry),
        )

    @given(
        fields=st.dictionaries(
            st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True),
            st.text(max_size=30)
            | st.booleans()
            | st.none()
            | st.integers(min_value=-(2**63), max_value=2**63 - 1)
            | st.floats(allow_nan=False, allow_infinity=False),
            max_size=6,
        ),
        plain=st.booleans(),
    )
    def test_fieldsJSON_isCanonical(
        self, fields: dict[str, FieldValue], plain: bool
    ) -> None:
        """[J2] The fields' JSON written out directly is the canonical JSON."""
        from fleetd.store.append import fieldsJSON
        from fleetd.store.entries import canonicalJSON

        if plain:  # strings, bools and None only: the direct path
            fields = {
                k: v
                for k, v in fields.items()
                if v is None or isinstance(v, str | bool)
            }
        self.assertEqual(fieldsJSON(fields), canonicalJSON(fields))

    def test_refusedFieldName_refusedEachTime(self) -> None:
        """A field name refused once is refused again (only good names are kept)."""
        from fleetd.store.fields import checkFields

        checkFields({"peer": "10.0.0.1"})
        for _ in range(2):
            with self.assertRaises(ValueError):
                checkFields({"peer_token": "x"})
            with self.assertRaises(ValueError):
                checkFields({"bad name": "x"})
        self.assertEqual(checkFields({"peer": "10.0.0.2"}), {"peer": "10.0.0.2"})

    @given(
        key=st.binary(min_size=32, max_size=200),
        message=st.binary(max_size=600),
    )
    def test_hmac_matchesStandardLibrary(self, key: bytes, message: bytes) -> None:
        """[J2] The journal's precomputed HMAC-SHA256 is the standard one."""
        import hmac

        from fleetd.keyed import KeyedHMAC

        self.assertEqual(
            KeyedHMAC(key).digest(message), hmac.digest(key, message, "sha256")
        )

    @given(
        event=st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True),
        run=st.none() | st.text(min_size=1, max_size=30).filter(str.isprintable),
        at=st.floats(min_value=0, max_value=4e9, allow_nan=False),
        seq=st.integers(min_value=1, max_value=2**40),
        text=st.text(max_size=20),
    )
    def test_digestOf_matchesReference(
        self, event: str, run: str | None, at: float, seq: int, text: str
    ) -> None:
        """
        [J2] The digest of an entry is HMAC-SHA256 over the previous digest
        and the entry's canonical JSON (json.dumps, keys sorted, compact,
        ASCII), as chains written before stay verifiable.
        """
        import hashlib
        import hmac

        key = b"q" * 40
        journal = Journal(key)
        try:
            pending = journal.prepare(
                event, actor="node:a1", run=run, fields={"peer": text, "x": 1.5}
            )
        except ValueError:
            return
        previous = bytes(range(32))
        body = {
            "actor": "node:a1",
            "at": at,
            "device": None,
            "event": event,
            "fields": {"peer": text, "x": 1.5},
            "run": run,
            "seq": seq,
        }
        text_ = json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=True
        )
        expected = hmac.new(
            key, previous + text_.encode("ascii"), hashlib.sha256
        ).digest()
        self.assertEqual(journal._digestOf(previous, seq, at, pending), expected)
