"""
C{fleetctl backup FILE} against a real daemon that keeps writing: a
consistent copy through SQLite's online backup API (issue 19 item 3).
"""

from __future__ import annotations

import json
import sqlite3
import stat
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.service import FleetdService
from fleetd.store import Database, Journal, deriveKey, loadOrCreateKey
from fleetd.store.journal import Recorder
from tests.daemonsupport import DaemonTestMixin, httpsGet
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig


class BackupCommandTests(DaemonTestMixin, TestCase):
    """fleetctl backup: consistent under WAL while fleetd writes [J1]."""

    def setUp(self) -> None:
        self.makeSettings()

    async def started(self) -> FleetdService:
        service = self.startDaemon()
        await service.loading.whenReady()
        await service.runner.run(
            lambda db: db.execute("CREATE TABLE test_writes (n INTEGER PRIMARY KEY)")
        )
        self.config = ownerConfig(self.directory, self.port(service, "admin"))
        return service

    async def write(self, service: FleetdService, n: int) -> None:
        """One change: a row and its journal entry in one transaction [J1]."""

        def work(db: Database, record: Recorder) -> None:
            db.execute("INSERT INTO test_writes (n) VALUES (?)", (n,))
            record("test.write", actor="fleetd", fields={"n": n})

        await service.journal.change(work)

    async def test_backup_consistentWhileWriting(self) -> None:
        """
        [J1] A backup taken while changes go on is a sound SQLite file
        (integrity_check ok, mode 0600) holding each change with its journal
        entry, its journal chain verifies with the site's key, and it is
        the live journal up to the backup's moment.
        """
        service = await self.started()
        for n in range(200):
            await self.write(service, n)
        written, stop = [200], [False]

        async def writer() -> None:
            while not stop[0]:
                await self.write(service, written[0])
                written[0] += 1

        loop = Deferred.fromCoroutine(writer())
        target = Path(self.mktemp()).resolve() / "fleetd-backup.sqlite3"
        target.parent.mkdir()
        before = written[0]
        code, out, err = await fleetctlAgainst(
            self.config, "--json", "backup", str(target)
        )
        during = written[0] - before
        stop[0] = True
        await loop
        self.assertEqual((code, err), (0, ""))
        self.assertGreater(during, 0, "writes went on while the copy was made")
        report = json.loads(out)
        self.assertEqual(stat.S_IMODE(target.stat().st_mode), 0o600)
        self.assertEqual(report["bytes"], target.stat().st_size)
        self.assertEqual(list(target.parent.iterdir()), [target])

        raw = sqlite3.connect(target)
        try:
            self.assertEqual(raw.execute("PRAGMA integrity_check").fetchone(), ("ok",))
            (rows,) = raw.execute("SELECT count(*) FROM test_writes").fetchone()
            (entries,) = raw.execute(
                "SELECT count(*) FROM journal WHERE event = 'test.write'"
            ).fetchone()
            copied = raw.execute(
                "SELECT seq, digest FROM journal ORDER BY seq"
            ).fetchall()
        finally:
            raw.close()
        # At the backup's moment: every row with its entry, nothing half-way.
        self.assertEqual(rows, entries)
        self.assertGreaterEqual(rows, 200)
        self.assertEqual(report["journal_seq"], copied[-1][0])
        # The copy's journal is the live journal as it was then, and verifies.
        live = await service.journal.query(limit=10_000)
        self.assertEqual(copied, [(e.seq, e.digest) for e in live[: len(copied)]])
        self.assertGreater(len(live), len(copied))
        key = loadOrCreateKey(self.settings.state / "master.key")
        copy = Database.open(target)
        self.addCleanup(copy.close)
        verdict = Journal(deriveKey(key, "journal")).verify(copy)
        self.assertTrue(verdict.ok, verdict)
        self.assertEqual(verdict.entries, copied[-1][0])
        # Who took the copy is journaled; no copy is left in the state dir.
        (taken,) = [e for e in live if e.event == "backup.taken"]
        self.assertEqual(taken.actor, "owner:owner")
        self.assertEqual(dict(taken.fields)["journal_seq"], report["journal_seq"])
        self.assertEqual(list(self.settings.state.glob(".backup-*")), [])

    async def test_backup_ownersOnly_keepsExistingFile(self) -> None:
        """
        Without an owner certificate the backup is refused (403); an
        existing FILE is kept unless --force.
        """
        service = await self.started()
        status, _, _ = await deferToThread(
            httpsGet,
            self.port(service, "admin"),
            "/v1/admin/backup",
            self.pki.public_ca,
        )
        self.assertEqual(status, 403)
        existing = Path(self.mktemp()).resolve()
        existing.write_bytes(b"yesterday's backup")
        code, _, err = await fleetctlAgainst(self.config, "backup", str(existing))
        self.assertEqual(code, 1)
        self.assertIn("exists (--force replaces it)", err)
        self.assertEqual(existing.read_bytes(), b"yesterday's backup")
        code, out, err = await fleetctlAgainst(
            self.config, "backup", "--force", str(existing)
        )
        self.assertEqual((code, err), (0, ""))
        self.assertIn("integrity ok", out)
        self.assertTrue(existing.read_bytes().startswith(b"SQLite format 3\x00"))
