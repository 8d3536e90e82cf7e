"""
The life of a node's disk keys on a real daemon (issue 30): a restart
after retirement, a restored older backup, a new install's own key, and
the database or journal failing during a Seal [E2] [E3] [J1].
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from typing import Any

import grpc
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.config import ConfigError
from fleetd.kms import store
from fleetd.prepare import prepare
from fleetd.service import FleetdService
from fleetd.store.backup import copyDatabase
from fleetd.store.db import Database, StoreError
from tests.daemonsupport import UUID1
from tests.faultsupport import FaultyRunner
from tests.kmssupport import KMSDaemonMixin


class KeyLifeTests(KMSDaemonMixin, TestCase):
    """Keys survive what they must, and never come back once destroyed."""

    async def restart(self, service: FleetdService) -> FleetdService:
        """Stop C{service}, start a new daemon on its state, loaded."""
        await service.stopService()
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        return self.service

    async def keys(self, service: FleetdService) -> list[store.KeyRow]:
        rows: list[store.KeyRow] = await service.runner.run(
            lambda db: store.keysOf(db, "w1")
        )
        return rows

    async def test_restartAfterRetirement_keyStillGone(self) -> None:
        """
        [E3] Retire, restart before anything else happens: the key is still
        destroyed, and the node's Unseal is refused; the sealed blob of a
        key that survives a restart (before the retirement) still opens.
        """
        service = await self.startNode()
        client, _ = self.kms()
        passphrase = os.urandom(32)
        sealed = await self.seal(client, UUID1, passphrase)
        service = await self.restart(service)
        client, _ = self.kms(service)
        self.assertEqual(await self.unseal(client, UUID1, sealed), passphrase)
        status, doc = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, doc)
        service = await self.restart(service)
        client, _ = self.kms(service)
        code, message = await self.refused(client.unseal, UUID1, sealed)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED, message)
        self.assertEqual([r.live for r in await self.keys(service)], [False])
        state = await service.runner.run(lambda db: store.keyState(db, "w1"))
        self.assertEqual(state, "destroyed")

    async def test_restoredOlderBackup_recordLost_sweptByStatus(self) -> None:
        """
        [E3] A backup taken while w1's key was live is restored after w1
        was retired, without the destruction record (a new host where it
        was not kept); the inventory of record still holds w1 as
        decommissioning (NetBox's, here its row in the restored file). At
        start fleetd destroys the key again, journals it, and the blob
        stays refused; the restored key's bytes are gone from the row.
        (With the record, tests/test_kms_restore.py.)
        """
        service = await self.startNode()
        client, _ = self.kms()
        sealed = await self.seal(client, UUID1, os.urandom(32))
        state = self.settings.state
        backup = await deferToThread(
            copyDatabase, state / "fleetd.sqlite3", state / "older.sqlite3"
        )
        status, doc = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, doc)
        await service.stopService()
        for suffix in ("", "-wal", "-shm"):
            (state / f"fleetd.sqlite3{suffix}").unlink(missing_ok=True)
        (state / "kms-destroyed-keys").unlink()
        shutil.copyfile(backup.path, state / "fleetd.sqlite3")
        restored = Database.open(state / "fleetd.sqlite3")
        try:
            [(live,)] = restored.execute(
                "SELECT count(*) FROM kms_keys WHERE wrapped IS NOT NULL"
            ).fetchall()
            self.assertEqual(live, 1)  # the backup brought the key back
            restored.execute(
                "UPDATE devices SET status = 'decommissioning' WHERE name = 'w1'"
            )
        finally:
            restored.close()
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        self.assertEqual([r.live for r in await self.keys(self.service)], [False])
        entries = await self.journal()
        swept = [e for e in entries if e["event"] == "kms.key-destroyed"]
        self.assertEqual(
            [e["fields"]["why"] for e in swept], ["decommissioned-at-start"]
        )
        client, _ = self.kms(self.service)
        code, _ = await self.refused(client.unseal, UUID1, sealed)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)

    async def test_newInstall_sealsItsOwn_oldKeyDestroyed(self) -> None:
        """
        [E3] w1 is provisioned again: until the new install seals, the old
        install's blob still opens (a reboot of the old install); the new
        install's first Seal makes a new key and destroys the old one in
        the same transaction, after which the old blob is refused
        key-destroyed and the new one opens.
        """
        service = await self.startNode()
        client, _ = self.kms()
        old, new = os.urandom(32), os.urandom(32)
        oldBlob = await self.seal(client, UUID1, old)
        await self.deliver("w1", UUID1, "SN-1", "127.0.0.1")
        self.assertEqual(await self.unseal(client, UUID1, oldBlob), old)
        newBlob = await self.seal(client, UUID1, new)
        self.assertNotEqual(newBlob[1:17], oldBlob[1:17])  # another key id
        code, message = await self.refused(client.unseal, UUID1, oldBlob)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertTrue(message.startswith("key-destroyed: "), message)
        self.assertEqual(await self.unseal(client, UUID1, newBlob), new)
        rows = await self.keys(service)
        self.assertEqual([r.live for r in rows], [False, True])
        state = await service.runner.run(lambda db: store.keyState(db, "w1"))
        self.assertEqual(state, "sealed")
        self.assertNotEqual(rows[0].generation, rows[1].generation)
        events = [e["event"] for e in await self.journal()]
        self.assertEqual(events.count("kms.key-created"), 2)
        self.assertEqual(events.count("kms.key-destroyed"), 1)

    async def test_retiredWhileSealing_noKeyMade(self) -> None:
        """
        [E3] [R1] A retirement that commits after a Seal read the device's
        status (still provisioned) but before the Seal's transaction, even
        followed by a late C{run.delivered}: the transaction sees it, the
        Seal is refused C{retired}, and no key is ever made for the retired
        node.
        """
        service = await self.startNode()
        client, _ = self.kms()
        keys: Any = service.diskKeys.keys if service.diskKeys else None
        found = keys._device
        delivered = await service.runner.run(lambda db: store.lastDelivery(db, "w1"))
        run = delivered[0] if delivered else None

        async def thenRetired(uuid: str) -> Any:
            device = await found(uuid)  # the status as the Seal saw it
            status, doc = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
            self.assertEqual(status, 200, doc)
            # A delivery served before the retirement, recorded after it by
            # the releaser, begins no new life.
            await service.journal.append(
                "run.delivered", actor="fleetd", device="w1", run=run,
                fields={"peer": "127.0.0.1"},
            )  # fmt: skip
            return device

        keys._device = thenRetired
        code, message = await self.refused(client.seal, UUID1, os.urandom(32))
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED, message)
        self.assertTrue(message.startswith("retired: "), message)
        self.assertEqual(await self.keys(service), [])

    async def test_masterKeyMissing_withLiveKeys_startRefused(self) -> None:
        """
        [E2] The master key file gone while the database holds keys it
        wrapped (a new host without it): start stops with one line naming
        kms.master_key, and no new master key is made over the old one's
        place.
        """
        service = await self.startNode()
        client, _ = self.kms()
        await self.seal(client, UUID1, os.urandom(32))
        await service.stopService()
        assert self.settings.kms is not None
        path = self.settings.kms.masterKeyPath(self.settings.state)
        path.unlink()
        error = self.assertRaises(ConfigError, prepare, self.settings)
        self.assertEqual(error.key, "kms.master_key")
        self.assertIn("live disk keys", str(error))
        self.assertFalse(path.exists())

    async def test_sealWhileJournalOrDatabaseFails_refusedNothingStored(self) -> None:
        """
        [J1] [E2] A Seal whose key cannot be journaled (the journal refuses)
        or stored (the database fails) is refused UNAVAILABLE (busy), which
        Talos retries, and stores nothing; once they work again the same
        Seal makes one key.
        """
        service = await self.startNode()
        client, _ = self.kms()
        passphrase = os.urandom(32)
        journal: Any = service.journal._journal
        inner = journal.appendMany

        def refusing(*args: Any, **kw: Any) -> Any:
            raise StoreError("journal head is not authentic")

        journal.appendMany = refusing
        try:
            code, message = await self.refused(client.seal, UUID1, passphrase)
        finally:
            journal.appendMany = inner
        self.assertEqual(code, grpc.StatusCode.UNAVAILABLE)
        self.assertTrue(message.startswith("busy: "), message)
        self.assertEqual(await self.keys(service), [])
        state = await service.runner.run(lambda db: store.keyState(db, "w1"))
        self.assertEqual(state, "none")
        runner = FaultyRunner(service.journal._runner)
        runner.failing = sqlite3.OperationalError("disk I/O error")
        original = service.journal._runner
        service.journal._runner = runner
        try:
            code, _ = await self.refused(client.seal, UUID1, passphrase)
        finally:
            service.journal._runner = original
        self.assertEqual(code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(await self.keys(service), [])
        self.flushLoggedErrors(StoreError, sqlite3.OperationalError)
        sealed = await self.seal(client, UUID1, passphrase)
        self.assertEqual(await self.unseal(client, UUID1, sealed), passphrase)
        self.assertEqual(len(await self.keys(service)), 1)
