"""
A node's disk key where the owner looks (issue 30, item 6): C{fleetctl
status NAME}, the console's device page (for readers too) and
C{/metrics} show the key's state (none, sealed, destroyed, with when),
its last unlock and the node's refused calls; without C{[kms]} the
report is as it was.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from twisted.trial.unittest import TestCase

from fleetd.statuswords import statusLines
from tests.consolesupport import ConsoleMixin
from tests.daemonsupport import UUID1
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.kmssupport import KMS, KMSDaemonMixin
from tests.readersupport import reader
from tests.test_console_device import statusRowsOf

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class StatusTests(ConsoleMixin, KMSDaemonMixin, TestCase):
    """The disk key in w1's status, as fleetctl, the console and /metrics say."""

    async def fleetctl(self, *argv: str, **owner: str) -> tuple[int, str, str]:
        port = self.port(self.service, "admin")
        tables: dict[str, Any] = dict(KMS)
        if owner:
            tables["owner"] = {"server": f"https://localhost:{port}", **owner}
        config = ownerConfig(self.directory, port, tables)
        return await fleetctlAgainst(config, *argv)

    async def keyLine(self) -> list[str]:
        """fleetctl status w1's disk key line and the lines beneath it."""
        code, out, err = await self.fleetctl("status", "w1")
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        [at] = [i for i, line in enumerate(lines) if line.startswith("disk key:")]
        rest = [line for line in lines[at + 1 :] if line.startswith("  refused")]
        return [lines[at], *rest]

    async def doc(self) -> dict[str, Any]:
        code, out, err = await self.fleetctl("--json", "status", "w1")
        self.assertEqual((code, err), (0, ""))
        found: dict[str, Any] = json.loads(out)
        return found

    async def metrics(self) -> dict[str, float]:
        _, _, body = await self.get(self.service, "admin", "/metrics")
        return {
            f"{m[1]}{m[2] or ''}": float(m[3])
            for m in re.finditer(
                r"^(fleetd_kms_keys)(\{[^}]*\})? (\S+)$", body.decode(), re.M
            )
        }

    async def test_fleetctlStatus_stateUnlockRefusals(self) -> None:
        """
        Before its first Seal w1's key is none; sealed with when, then its
        last unlock; a refused Unseal (a changed blob) is counted on it
        with its reason and time; after the retirement the key is
        destroyed (retired) with when, and the node's refused Unseal says
        retired. The JSON carries the same.
        """
        await self.startNode()
        self.assertEqual(
            await self.keyLine(), ["disk key: none: its node has not sealed one"]
        )
        client, _ = self.kms()
        sealed = await self.seal(client, UUID1, os.urandom(32))
        [line] = await self.keyLine()
        self.assertRegex(
            line, rf"^disk key: sealed {TIME}  not unlocked since fleetd started$"
        )
        await self.unseal(client, UUID1, sealed)
        [line] = await self.keyLine()
        self.assertRegex(line, rf"^disk key: sealed {TIME}  last unlock {TIME}$")
        changed = sealed[:-1] + bytes([sealed[-1] ^ 1])
        await self.refused(client.unseal, UUID1, changed)
        line, refused = await self.keyLine()
        self.assertRegex(
            refused,
            rf"^  refused 1 since fleetd started; last {TIME}: blob-rejected$",
        )
        doc = (await self.doc())["disk_key"]
        self.assertEqual(doc["state"], "sealed")
        self.assertEqual(doc["refused"]["count"], 1)
        self.assertEqual(doc["refused"]["reason"], "blob-rejected")
        self.assertIsNotNone(doc["last_unlock"])
        self.assertEqual(doc["run"], (await self.doc())["run"]["run"])

        status, answer = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, answer)
        await self.refused(client.unseal, UUID1, sealed)
        line, refused = await self.keyLine()
        self.assertRegex(
            line, rf"^disk key: destroyed {TIME} \(retired\)  last unlock {TIME}$"
        )
        self.assertRegex(
            refused, rf"^  refused 2 since fleetd started; last {TIME}: retired$"
        )
        doc = (await self.doc())["disk_key"]
        self.assertEqual((doc["state"], doc["why"]), ("destroyed", "retired"))
        self.assertGreaterEqual(doc["at"], doc["last_unlock"])

    async def test_withoutKms_reportAsBefore(self) -> None:
        """Without C{[kms]} the report has no disk_key and fleetctl status
        prints no disk key line."""
        await self.startLoaded()
        await self.addDevice("w1", "SN-1", UUID1)
        port = self.port(self.service, "admin")
        config = ownerConfig(self.directory, port)
        code, out, _ = await fleetctlAgainst(config, "--json", "status", "w1")
        self.assertEqual(code, 0)
        doc = json.loads(out)
        self.assertNotIn("disk_key", doc)
        code, text, _ = await fleetctlAgainst(config, "status", "w1")
        self.assertEqual(code, 0)
        self.assertNotIn("disk key", text)
        self.assertEqual(text.splitlines(), statusLines(doc))

    async def test_reader_seesTheKey(self) -> None:
        """[O4] A reader's fleetctl status shows the disk key too."""
        await self.startNode()
        client, _ = self.kms()
        await self.seal(client, UUID1, os.urandom(32))
        cert, key = reader(self.pki, "auditor")
        code, out, err = await self.fleetctl(
            "status", "w1", client_cert=str(cert), client_key=str(key)
        )
        self.assertEqual((code, err), (0, ""))
        self.assertRegex(out, rf"\ndisk key: sealed {TIME}  ")

    async def test_consoleDevicePage_showsTheKey_toReaders(self) -> None:
        """The device page's status list has fleetctl's disk key row, for
        an owner and for a reader."""
        await self.startNode()
        self.consoleRoot()
        client, _ = self.kms()
        sealed = await self.seal(client, UUID1, os.urandom(32))
        await self.unseal(client, UUID1, sealed)
        expected = await self.keyLine()
        for role in ("owner", "reader"):
            code, _, body = await self.page("GET", "/devices/w1", role=role)
            self.assertEqual(code, 200, body)
            [row] = [r for r in statusRowsOf(body) if r.label == "disk key"]
            self.assertEqual(row.lines(), expected)

    async def test_metrics_keysByState(self) -> None:
        """
        C{fleetd_kms_keys{state}}: devices whose key is sealed or
        destroyed, as the Seal, the retirement and the start-up read them.
        """
        await self.startNode()
        sealed = 'fleetd_kms_keys{state="sealed"}'
        destroyed = 'fleetd_kms_keys{state="destroyed"}'
        self.assertEqual(await self.metrics(), {sealed: 0.0, destroyed: 0.0})
        client, _ = self.kms()
        await self.seal(client, UUID1, os.urandom(32))
        await self.seal(client, UUID1, os.urandom(32))  # the same key
        self.assertEqual(await self.metrics(), {sealed: 1.0, destroyed: 0.0})
        status, answer = await self.admin("POST", "/v1/admin/retire", {"device": "w1"})
        self.assertEqual(status, 200, answer)
        self.assertEqual(await self.metrics(), {sealed: 0.0, destroyed: 1.0})
        await self.service.stopService()
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        self.assertEqual(await self.metrics(), {sealed: 0.0, destroyed: 1.0})


class WordsTests(TestCase):
    """The disk key row's words, from the report's JSON."""

    def test_rows(self) -> None:
        from fleetd.statuswords import diskKeyRows

        self.assertEqual(diskKeyRows(None), [])
        none = {"state": "none", "at": None, "why": None, "last_unlock": None}
        self.assertEqual(
            [r.lines() for r in diskKeyRows({**none, "refused": None})],
            [["disk key: none: its node has not sealed one"]],
        )
        destroyed = {
            "state": "destroyed", "at": 86400.0, "why": "superseded",
            "last_unlock": None,
            "refused": {"count": 3, "reason": "key-destroyed", "at": 86401.0},
        }  # fmt: skip
        self.assertEqual(
            diskKeyRows(destroyed)[0].lines(),
            [
                "disk key: destroyed 1970-01-02T00:00:00Z (superseded)",
                "  refused 3 since fleetd started; last 1970-01-02T00:00:01Z:"
                " key-destroyed",
            ],
        )
