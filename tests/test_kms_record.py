"""
The destruction record's file and its appends (issue 30, [E3]): made
when missing, refused when malformed, an interrupted last append put
right, and a failed append kept, counted and retried.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.kms import record
from fleetd.kms.reasons import KMSMetrics
from fleetd.kms.record import (
    HEADER,
    RETRY,
    Destroyed,
    DestructionRecord,
    RecordError,
    appendRecord,
    loadRecord,
)

A = Destroyed("a" * 32, "w1", "4c4c4544-0042-3510-8050-b4c04f4d3231", "retired", 1.5)
B = Destroyed("b" * 32, "w2", "4c4c4544-0042-3510-8050-b4c04f4d3232", "superseded", 2)


def inline(f: Callable[..., Any], *args: Any) -> Deferred[Any]:
    """Run a blocking call at once (the tests' stand-in for a thread)."""
    return maybeDeferred(f, *args)


class LoadTests(SynchronousTestCase):
    """L{loadRecord}: made, read, refused, repaired."""

    def setUp(self) -> None:
        self.directory = Path(self.mktemp())
        self.directory.mkdir()
        self.path = self.directory / "kms-destroyed-keys"

    def test_missing_madeWithHeader_mode0600(self) -> None:
        loaded = loadRecord(self.path)
        self.assertTrue(loaded.created)
        self.assertEqual(loaded.ids, frozenset())
        self.assertEqual(self.path.read_text(), HEADER + "\n")
        self.assertEqual(stat.S_IMODE(self.path.stat().st_mode), 0o600)
        self.assertEqual(list(self.directory.iterdir()), [self.path])
        again = loadRecord(self.path)
        self.assertFalse(again.created)

    def test_appended_readBack(self) -> None:
        loadRecord(self.path)
        appendRecord(self.path, [A])
        appendRecord(self.path, [B, A])  # a line twice is harmless
        loaded = loadRecord(self.path)
        self.assertEqual(loaded.ids, {A.kek_id, B.kek_id})
        self.assertIsNone(loaded.repaired)
        lines = self.path.read_text().splitlines()
        self.assertEqual(len(lines), 4)
        self.assertIn('"why":"retired"', lines[1])

    def refused(self, content: bytes) -> str:
        self.path.write_bytes(content)
        with self.assertRaises(RecordError) as caught:
            loadRecord(self.path)
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertIn(str(self.path), message)
        return message

    def test_malformed_refusedWithTheLine(self) -> None:
        """Anything but a record stops start-up: never a guess."""
        good = A.line()
        self.assertIn("does not start with", self.refused(b""))
        self.assertIn("does not start with", self.refused(b"kek ids\n"))
        self.assertIn("does not start with", self.refused(good))
        self.assertIn("not UTF-8", self.refused(HEADER.encode() + b"\n\xff\n"))
        header = HEADER.encode() + b"\n"
        for bad, why in [
            (b"not json", "Expecting value"),
            (b"[1, 2]", "not a JSON object"),
            (b'{"kek_id": "xyz"}', "kek_id"),
            (good.replace(b'"w1"', b"7"), "device is not a string"),
            (good.replace(b"1.5", b"true"), "at is not a time"),
            (b"", "Expecting value"),  # an empty line
        ]:
            message = self.refused(header + good + bad + b"\n" + good)
            self.assertIn("line 3 ", message)
            self.assertIn(why, message)

    def test_directory_refused(self) -> None:
        self.path.mkdir()
        with self.assertRaises(RecordError) as caught:
            loadRecord(self.path)
        self.assertIn("cannot read or make", str(caught.exception))

    def test_interruptedAppend_partCutOff(self) -> None:
        """An unterminated last line that is not a whole record (an append
        cut short by a crash) is cut off; the lines before it stay."""
        whole = HEADER.encode() + b"\n" + A.line()
        self.path.write_bytes(whole + B.line()[:20])
        loaded = loadRecord(self.path)
        self.assertEqual(loaded.ids, {A.kek_id})
        self.assertIn("cut off", loaded.repaired or "")
        self.assertEqual(self.path.read_bytes(), whole)

    def test_unterminatedWholeRecord_kept(self) -> None:
        whole = HEADER.encode() + b"\n" + A.line()
        self.path.write_bytes(whole + B.line()[:-1])
        loaded = loadRecord(self.path)
        self.assertEqual(loaded.ids, {A.kek_id, B.kek_id})
        self.assertEqual(self.path.read_bytes(), whole + B.line())

    def test_appendFails_fileCutBack(self) -> None:
        """An append whose fsync fails leaves no part of its lines."""
        loadRecord(self.path)
        before = self.path.read_bytes()

        def failing(fd: int) -> None:
            raise OSError(5, "Input/output error")

        self.patch(os, "fsync", failing)
        self.assertRaises(OSError, appendRecord, self.path, [A, B])
        self.assertEqual(self.path.read_bytes(), before)

    def test_appendToMissingFile_fails(self) -> None:
        """The file is made at start only: an append never makes it anew."""
        self.assertRaises(FileNotFoundError, appendRecord, self.path, [A])
        self.assertFalse(self.path.exists())


class RecordTests(TestCase):
    """L{DestructionRecord}: one append at a time, failures retried."""

    def setUp(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        self.path = directory / "kms-destroyed-keys"
        self.clock = Clock()
        self.registry = CollectorRegistry()
        self.metrics = KMSMetrics(self.registry)
        self.failing: list[OSError] = []
        self.calls: list[list[str]] = []

    def append(self, path: Path, entries: Sequence[Destroyed]) -> None:
        self.calls.append([e.kek_id for e in entries])
        if self.failing:
            raise self.failing.pop(0)
        appendRecord(path, entries)

    def make(self, inThread: Any = inline) -> DestructionRecord:
        return DestructionRecord(
            loadRecord(self.path), clock=self.clock, metrics=self.metrics,
            inThread=inThread, append=self.append,
        )  # fmt: skip

    def metric(self, name: str) -> float:
        value = self.registry.get_sample_value(name)
        assert value is not None
        return value

    async def test_added_writtenOnce(self) -> None:
        kept = self.make()
        self.assertTrue(await kept.add([A, B]))
        self.assertTrue(await kept.add([A]))  # known: nothing written
        self.assertTrue(await kept.add([]))
        self.assertEqual(self.calls, [[A.kek_id, B.kek_id]])
        self.assertEqual(kept.ids(), {A.kek_id, B.kek_id})
        self.assertEqual(loadRecord(self.path).ids, {A.kek_id, B.kek_id})

    async def test_failed_keptCountedRetried(self) -> None:
        """
        A failed append fires C{False}, stays queued (the gauge says how
        many), is counted, and is tried again after L{RETRY} seconds.
        """
        self.failing.append(OSError(28, "No space left on device"))
        kept = self.make()
        self.assertFalse(await kept.add([A]))
        self.assertEqual(kept.unrecorded, 1)
        self.assertEqual(self.metric("fleetd_kms_destructions_unrecorded"), 1)
        self.assertEqual(self.metric("fleetd_kms_destruction_record_failures_total"), 1)
        self.assertEqual(loadRecord(self.path).ids, frozenset())
        self.flushLoggedErrors(OSError)
        self.clock.advance(RETRY)
        self.assertEqual(self.calls, [[A.kek_id], [A.kek_id]])
        self.assertEqual(kept.unrecorded, 0)
        self.assertEqual(self.metric("fleetd_kms_destructions_unrecorded"), 0)
        self.assertEqual(loadRecord(self.path).ids, {A.kek_id})
        self.assertEqual(self.clock.getDelayedCalls(), [])

    async def test_nextAdd_retriesAtOnce(self) -> None:
        self.failing.append(OSError(5, "Input/output error"))
        kept = self.make()
        self.assertFalse(await kept.add([A]))
        self.flushLoggedErrors(OSError)
        self.assertTrue(await kept.add([B]))
        self.assertEqual(self.calls, [[A.kek_id], [A.kek_id, B.kek_id]])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    async def test_oneWriteAtATime(self) -> None:
        """Adds while a write runs wait for the next write, which takes
        them all at once."""
        started: list[Deferred[None]] = []

        def held(f: Callable[..., Any], *args: Any) -> Deferred[Any]:
            d: Deferred[None] = Deferred()
            started.append(d)
            return d.addCallback(lambda _: f(*args))

        kept = self.make(held)
        first = kept.add([A])
        second = kept.add([B])
        third = kept.add([A])  # queued already: waits all the same
        self.assertEqual(len(started), 1)
        started[0].callback(None)
        self.assertTrue(await first)
        self.assertEqual(len(started), 2)
        self.assertFalse(second.called)
        started[1].callback(None)
        self.assertTrue(await second)
        self.assertTrue(await third)
        self.assertEqual(self.calls, [[A.kek_id], [B.kek_id]])

    async def test_stop_waitersToldFalse_noRetry(self) -> None:
        self.failing.append(OSError(5, "Input/output error"))
        kept = self.make()
        self.assertFalse(await kept.add([A]))
        self.flushLoggedErrors(OSError)
        kept.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(await kept.add([B]))
        self.assertEqual(len(self.calls), 1)


class LineTests(SynchronousTestCase):
    def test_oneLine_sortedKeys_noSecret(self) -> None:
        line = A.line()
        self.assertTrue(line.endswith(b"\n"))
        self.assertEqual(line.count(b"\n"), 1)
        self.assertEqual(record._parse(line.decode()), A)
