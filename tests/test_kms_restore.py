"""
A restored older backup never brings a destroyed disk key back, with the
embedded inventory too (issue 30, [E3]): the destruction record outside
the database, read at start before the KMS answers, appended after each
commit that destroys keys, put right from the database after a crash,
and a malformed one stopping start-up.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import grpc
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.config import ConfigError
from fleetd.kms import store
from fleetd.kms.record import RETRY, Destroyed, appendRecord, loadRecord
from fleetd.prepare import prepare
from fleetd.service import FleetdService
from tests.daemonsupport import UUID1
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.kmssupport import KMS, KMSDaemonMixin, luksFormat, luksOpens

RECORD = "kms-destroyed-keys"


def failing(path: Path, entries: Sequence[Destroyed]) -> None:
    raise OSError(errno.EIO, "Input/output error")


class RestoreTests(KMSDaemonMixin, TestCase):
    """The destruction record keeps destroyed keys destroyed."""

    async def restart(self) -> FleetdService:
        """A new daemon on the same state, loaded (the KMS answering)."""
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        return self.service

    async def backup(self) -> Path:
        """C{fleetctl backup FILE}, as docs/operations.md says."""
        target = Path(self.mktemp()).resolve()
        config = ownerConfig(self.directory, self.port(self.service, "admin"), KMS)
        code, out, err = await fleetctlAgainst(config, "backup", str(target))
        self.assertEqual((code, err), (0, ""), out)
        return target

    def restore(self, backup: Path) -> None:
        """The restore of docs/operations.md (fleetd stopped): the database
        replaced by the copy, its -wal and -shm removed, the destruction
        record kept."""
        state = self.settings.state
        os.replace(state / "fleetd.sqlite3", state.parent / "before-restore.sqlite3")
        for suffix in ("-wal", "-shm"):
            (state / f"fleetd.sqlite3{suffix}").unlink(missing_ok=True)
        shutil.copyfile(backup, state / "fleetd.sqlite3")
        os.chmod(state / "fleetd.sqlite3", 0o600)

    def recorded(self) -> frozenset[str]:
        return loadRecord(self.settings.state / RECORD).ids

    async def keys(self) -> list[store.KeyRow]:
        rows: list[store.KeyRow] = await self.service.runner.run(
            lambda db: store.keysOf(db, "w1")
        )
        return rows

    async def metric(self, sample: str) -> float:
        _, _, body = await self.get(self.service, "admin", "/metrics")
        found = re.search(rf"^{re.escape(sample)} (\S+)$", body.decode(), re.M)
        assert found is not None, sample
        return float(found[1])

    async def test_restoredBackup_embeddedInventory_keyDestroyedAtStart(self) -> None:
        """
        [E3] w1 seals, and its LUKS2 volume opens with the answer; a
        backup is taken (fleetctl backup); w1 is retired, its key's id
        appended to the destruction record before the answer. The backup
        is restored as the operations guide says, nothing edited: the
        embedded inventory holds w1 as before its retirement again, and
        the key live. At start the key is destroyed
        (C{restored-after-destruction}, journaled and counted) before the
        KMS answers, and the node's Unseal is refused: nothing opens the
        volume.
        """
        await self.startNode()
        client, _ = self.kms()
        passphrase = os.urandom(32)
        sealed = await self.seal(client, UUID1, passphrase)
        volume = Path(self.mktemp())
        await deferToThread(luksFormat, volume, passphrase)
        unsealed = await self.unseal(client, UUID1, sealed)
        self.assertTrue(await deferToThread(luksOpens, volume, unsealed))
        backup = await self.backup()
        status, doc = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, doc)
        self.assertEqual(doc["disk_keys"]["recorded"], True)
        [keyId] = doc["disk_keys"]["destroyed"]
        self.assertEqual(self.recorded(), {keyId})
        await self.service.stopService()

        self.restore(backup)
        raw = sqlite3.connect(self.settings.state / "fleetd.sqlite3")
        try:
            [(status_,)] = raw.execute("SELECT status FROM devices WHERE name = 'w1'")
            [(live,)] = raw.execute(
                "SELECT count(*) FROM kms_keys WHERE wrapped IS NOT NULL"
            )
        finally:
            raw.close()
        self.assertEqual((status_, live), ("staged", 1))  # both came back

        await self.restart()
        self.assertEqual([(r.id, r.live) for r in await self.keys()], [(keyId, False)])
        entries = await self.journal()
        destroyed = [e for e in entries if e["event"] == "kms.key-destroyed"]
        self.assertEqual(
            [(e["fields"]["kek_id"], e["fields"]["why"]) for e in destroyed],
            [(keyId, "restored-after-destruction")],
        )
        why = 'fleetd_kms_keys_destroyed_total{why="restored-after-destruction"}'
        self.assertEqual(await self.metric(why), 1.0)
        client, _ = self.kms(self.service)
        code, message = await self.refused(client.unseal, UUID1, sealed)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertTrue(message.startswith("key-destroyed: "), message)
        self.assertFalse(await deferToThread(luksOpens, volume, os.urandom(32)))
        self.assertEqual(self.recorded(), {keyId})

    async def test_appendFails_keyGone_countedThenRetried(self) -> None:
        """
        The append after the retirement's commit fails: the retirement
        still answers (the key is destroyed in the database, the Unseal
        refused), saying C{recorded: false}; the failure is counted and
        the key shows as unrecorded (the alert's metric) until the retry
        writes it.
        """
        service = await self.startNode()
        client, _ = self.kms()
        sealed = await self.seal(client, UUID1, os.urandom(32))
        record = service.diskKeys.keys.record  # type: ignore[union-attr]
        clock = Clock()
        record._clock = clock
        record._append = failing
        status, doc = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, doc)
        self.assertEqual(doc["disk_keys"]["recorded"], False)
        [keyId] = doc["disk_keys"]["destroyed"]
        self.assertEqual(await self.metric("fleetd_kms_destructions_unrecorded"), 1.0)
        self.assertEqual(
            await self.metric("fleetd_kms_destruction_record_failures_total"), 1.0
        )
        self.assertEqual(self.recorded(), frozenset())
        code, _ = await self.refused(client.unseal, UUID1, sealed)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual([r.live for r in await self.keys()], [False])
        self.flushLoggedErrors(OSError)

        record._append = appendRecord
        clock.advance(RETRY)
        self.assertTrue(await record.add([]))
        self.assertEqual(self.recorded(), {keyId})
        self.assertEqual(await self.metric("fleetd_kms_destructions_unrecorded"), 0.0)

    async def test_crashBeforeAppend_healedAtStart_backupStillLosesKey(
        self,
    ) -> None:
        """
        fleetd stops between the retirement's commit and its append (the
        append never happens): at the next start the key the database
        holds destroyed is appended to the record before the KMS answers;
        so an older backup restored after that still loses the key.
        """
        service = await self.startNode()
        client, _ = self.kms()
        sealed = await self.seal(client, UUID1, os.urandom(32))
        backup = await self.backup()
        record = service.diskKeys.keys.record  # type: ignore[union-attr]
        record._append = failing
        record._clock = Clock()  # no retry before the stop
        status, doc = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, doc)
        [keyId] = doc["disk_keys"]["destroyed"]
        self.flushLoggedErrors(OSError)
        await service.stopService()
        self.assertEqual(self.recorded(), frozenset())

        await self.restart()
        self.assertEqual(self.recorded(), {keyId})
        self.assertEqual(await self.metric("fleetd_kms_destructions_unrecorded"), 0.0)
        events = [e["event"] for e in await self.journal()]
        self.assertEqual(events.count("kms.key-destroyed"), 1)  # healed, not again
        await self.service.stopService()

        self.restore(backup)
        await self.restart()
        self.assertEqual([r.live for r in await self.keys()], [False])
        client, _ = self.kms(self.service)
        code, message = await self.refused(client.unseal, UUID1, sealed)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertTrue(message.startswith("key-destroyed: "), message)

    async def test_supersededKey_recorded(self) -> None:
        """[E3] The key a new install supersedes at its first Seal is
        appended to the record after that commit."""
        service = await self.startNode()
        client, _ = self.kms()
        old = await self.seal(client, UUID1, os.urandom(32))
        await self.deliver("w1", UUID1, "SN-1", "127.0.0.1")
        await self.seal(client, UUID1, os.urandom(32))
        self.assertTrue(await service.diskKeys.keys.record.add([]))  # type: ignore[union-attr]
        self.assertEqual(self.recorded(), {old[1:17].hex()})
        why = 'fleetd_kms_keys_destroyed_total{why="superseded"}'
        self.assertEqual(await self.metric(why), 1.0)

    async def test_malformedRecord_stopsStart(self) -> None:
        """
        A record with a line that is not a destroyed key's stops start-up
        with one line naming the key, the file and the line; fleetd does
        not guess (nor start answering with a record it cannot read).
        """
        await self.startLoaded(KMS)
        await self.service.stopService()
        path = self.settings.state / RECORD
        with open(path, "a") as f:
            f.write('{"kek_id": "not a key"}\n')
        error = self.assertRaises(ConfigError, prepare, self.settings)
        self.assertEqual(error.key, "kms.destroyed_keys")
        self.assertEqual(str(error).count("\n"), 0)
        self.assertIn(f"{path} line 2 is not a record of a destroyed key", str(error))

    async def test_missingRecord_madeAtFirstStart(self) -> None:
        """The first start with C{[kms]} makes the record (mode 0600),
        holding no key."""
        await self.startLoaded(KMS)
        path = self.settings.state / RECORD
        self.assertEqual(path.stat().st_mode & 0o777, 0o600)
        self.assertEqual(self.recorded(), frozenset())
