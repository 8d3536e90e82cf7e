"""
C{fleetctl retire} on a daemon without C{[kubernetes]} (issue 29 item 1):
the retirement is wired from L{fleetd.fleet.retire}, with no cluster
client and no token book, and still does everything but the cluster's
calls [R1] [J1]; when the journal or the database cannot record it,
nothing changes.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from twisted.trial.unittest import TestCase

from fleetd.store.db import StoreError
from tests.daemonsupport import UUID1, DeliveryMixin, Fleetctl, configPath
from tests.faultsupport import FaultyRunner


class RetireWithoutClusterTests(DeliveryMixin, TestCase):
    """[R1] A daemon with no [kubernetes] table retires a provisioned device."""

    async def started(self) -> tuple[Fleetctl, str]:
        """The daemon, w1 added with fleetctl and provisioned; its code."""
        self.service, fleetctl = await self.daemonWithDevice()
        self.assertIsNone(self.service.kube)  # no [kubernetes]: no client, no book
        code = (await self.provision("w1"))["w1"]
        return fleetctl, code

    async def fetchConfig(self, code: str) -> tuple[int, bytes]:
        status, _, body = await self.fetch(configPath(code, UUID1, "SN-1"))
        return status, body

    async def deviceStatus(self) -> str:
        status, doc = await self.admin("GET", "/v1/admin/devices/w1", None)
        self.assertEqual(status, 200, doc)
        value: str = doc["status"]
        return value

    async def test_retire_noKubernetes_runEnds_configGone_provisionRefused(
        self,
    ) -> None:
        """
        [R1] [C1] [J1] fleetctl retire: the device is decommissioning, its
        run ends (run.superseded by retired, with device.retired and what
        cannot be revoked, in one transaction), no Node deletion is asked
        for, its code gets no configuration any more, and a later
        provision is refused (409, journaled).
        """
        fleetctl, code = await self.started()
        run = self.service.runs.readyRun("w1")
        self.assertIsNotNone(run)
        exit, out, err = await fleetctl("retire", "w1", "--yes", "--json")
        self.assertEqual(exit, 0, err)
        answer = json.loads(out)
        self.assertEqual(
            (answer["status"], answer["node_deleted"], answer["tokens_deleted"]),
            ("decommissioning", None, []),
        )
        self.assertEqual(await self.deviceStatus(), "decommissioning")
        self.assertIsNone(self.service.runs.readyRun("w1"))
        entries = [e for e in await self.journal() if e["device"] == "w1"]
        events = [e["event"] for e in entries]
        self.assertNotIn("kube.node-delete-requested", events)
        retiredAt = {
            e["event"]: e["at"]
            for e in entries
            if e["event"] in ("run.superseded", "device.retired")
        }
        self.assertEqual(len(set(retiredAt.values())), 1, entries)  # one change
        (superseded,) = [e for e in entries if e["event"] == "run.superseded"]
        self.assertEqual(
            (superseded["run"], superseded["fields"]["by"]), (run, "retired")
        )
        unrevocable = [
            e["fields"]["credential"]
            for e in entries
            if e["event"] == "kube.unrevocable"
        ]
        self.assertEqual(unrevocable, ["kubelet client certificate", "machine.token"])
        status, body = await self.fetchConfig(code)
        self.assertEqual(status, 410, body)
        self.assertIn(b"superseded", body)
        status, doc = await self.admin(
            "POST", "/v1/admin/provision", {"devices": ["w1"]}
        )
        self.assertEqual(status, 409, doc)
        self.assertIn("decommissioning", doc)
        self.assertIn("provision.refused", await self.events("provision.refused"))

    async def refusedWith(self, fault: Any) -> None:
        """
        C{fault} armed, fleetctl retire fails in one line saying nothing
        changed; disarmed, the device, its run, its configuration and the
        journal are as they were, and a retirement then goes through.
        """
        fleetctl, code = await self.started()
        run = self.service.runs.readyRun("w1")
        before = await self.journal()
        arm, disarm = fault
        arm()
        try:
            exit, _, err = await fleetctl("retire", "w1", "--yes")
        finally:
            disarm()
        self.assertEqual(exit, 1, err)
        self.assertIn("503", err)
        self.assertIn("nothing changed", err)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertEqual(await self.deviceStatus(), "planned")
        self.assertEqual(self.service.runs.readyRun("w1"), run)
        self.assertEqual(await self.journal(), before)
        status, body = await self.fetchConfig(code)
        self.assertEqual(status, 200, body)
        exit, _, err = await fleetctl("retire", "w1", "--yes")
        self.assertEqual(exit, 0, err)

    async def test_retire_journalDown_nothingChanged(self) -> None:
        """[J1] The journal refuses the retirement: nothing changed."""

        def appendMany(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("journal head is not authentic")

        def arm() -> None:
            self.service.journal._journal.appendMany = appendMany  # type: ignore[method-assign]

        def disarm() -> None:
            del self.service.journal._journal.appendMany

        await self.refusedWith((arm, disarm))

    async def test_retire_databaseDown_nothingChanged(self) -> None:
        """[J1] The database fails the retirement's transaction: nothing changed."""
        faulty: list[FaultyRunner] = []

        def arm() -> None:
            runner = FaultyRunner(self.service.journal._runner)
            runner.failing = sqlite3.OperationalError("disk I/O error")
            faulty.append(runner)
            self.service.journal._runner = runner

        def disarm() -> None:
            self.service.journal._runner = faulty.pop().inner

        await self.refusedWith((arm, disarm))
