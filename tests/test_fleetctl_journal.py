"""
fleetctl's journal verify and re-anchor against a real daemon: a journal
break has a way back (issue 19 item 5) [J2].
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.cli import fleetctl
from fleetd.service import FleetdService
from tests.daemonsupport import DaemonTestMixin, httpsRequest
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig, runFleetctl
from tests.support import writeConfig

REASON = "seq 2 edited during the disk swap; checked against the NetBox mirror"


class ReanchorCommandTests(DaemonTestMixin, TestCase):
    """[J2] fleetctl journal verify and reanchor, and the chain gauge."""

    def setUp(self) -> None:
        self.makeSettings()

    def gauge(self, service: FleetdService, name: str) -> float | None:
        return service.registry.get_sample_value(name)

    async def started(self) -> FleetdService:
        """A daemon whose first chain verification is done (gauge at 1)."""
        service = self.startDaemon()
        for n in range(3):
            await service.journal.append("test.event", actor="fleetd", device=f"w{n}")
        for _ in range(500):
            if self.gauge(service, "fleetd_journal_chain_ok") is not None:
                break
            await deferLater(reactor, 0.01, lambda: None)
        await service.chain.verify()  # after the appends: intact
        self.assertEqual(self.gauge(service, "fleetd_journal_chain_ok"), 1.0)
        self.config = ownerConfig(self.directory, self.port(service, "admin"))
        return service

    def tamper(self, sql: str) -> None:
        db = sqlite3.connect(self.settings.state / "fleetd.sqlite3")
        try:
            db.execute(sql)
            db.commit()
        finally:
            db.close()

    async def fleetctl(self, *argv: str) -> tuple[int, str, str]:
        result: tuple[int, str, str] = await fleetctlAgainst(self.config, *argv)
        return result

    async def test_verify_updatesGaugeAtOnce(self) -> None:
        """
        [J2] C{fleetctl journal verify} finding a break sets
        C{fleetd_journal_chain_ok} to 0 at once, not at the next period.
        """
        service = await self.started()
        self.tamper("UPDATE journal SET device = 'w9' WHERE seq = 2")
        # The monitor's next period is an hour away: only verify moves the gauge.
        self.assertEqual(self.gauge(service, "fleetd_journal_chain_ok"), 1.0)
        code, out, _ = await self.fleetctl("journal", "verify")
        self.assertEqual(code, 1)
        self.assertIn("journal BROKEN at seq 2", out)
        self.assertEqual(self.gauge(service, "fleetd_journal_chain_ok"), 0.0)
        _, _, body = await self.get(service, "admin", "/metrics")
        self.assertIn(b"fleetd_journal_chain_ok 0.0", body)

    async def test_reanchor_acknowledgesBreak_alertClears(self) -> None:
        """
        [J2] An owner's C{fleetctl journal reanchor --reason} is refused on
        an intact chain and without a reason; after a break it appends an
        entry naming the break's seq and the digest found, the gauge goes
        back to 1, verify says "intact since re-anchor at seq N; break at
        seq M acknowledged", the edited entry is left as found, and a later
        break drops the gauge again.
        """
        service = await self.started()
        code, _, err = await self.fleetctl("journal", "reanchor", "--reason", REASON)
        self.assertEqual(code, 1)
        self.assertIn("intact", err)
        self.assertEqual(err.count("\n"), 1)

        self.tamper("UPDATE journal SET device = 'w9' WHERE seq = 2")
        code, _, err = await self.fleetctl("journal", "reanchor")
        self.assertEqual((code, err.count("\n")), (2, 1))
        self.assertIn("--reason", err)
        code, out, _ = await self.fleetctl("journal", "verify")
        self.assertEqual(code, 1)
        self.assertEqual(self.gauge(service, "fleetd_journal_chain_ok"), 0.0)

        code, out, err = await self.fleetctl("journal", "reanchor", "--reason", REASON)
        self.assertEqual((code, err), (0, ""))
        self.assertIn("journal re-anchored at seq 5: break at seq 2 acknowledged", out)
        # The alert clears at once.
        self.assertEqual(self.gauge(service, "fleetd_journal_chain_ok"), 1.0)
        self.assertEqual(self.gauge(service, "fleetd_journal_acknowledged_breaks"), 1.0)

        code, out, _ = await self.fleetctl("journal", "verify")
        self.assertEqual(code, 0)
        self.assertIn(
            "journal OK: 5 entries, intact since re-anchor at seq 5;"
            " break at seq 2 acknowledged",
            out,
        )
        code, out, _ = await self.fleetctl("--json", "journal")
        entries = json.loads(out)
        self.assertEqual(entries[1]["device"], "w9")  # the break is kept
        anchor = entries[-1]
        self.assertEqual(
            (anchor["seq"], anchor["event"], anchor["actor"]),
            (5, "journal.reanchored", "owner:owner"),
        )
        self.assertEqual(anchor["fields"]["reason"], REASON)
        self.assertEqual(anchor["fields"]["break_seq"], 2)
        self.assertEqual(anchor["fields"]["found"], entries[1]["digest"])

        # A second break after the re-anchor is a new break: the alert fires again.
        await service.journal.append("test.after", actor="fleetd")
        self.tamper("UPDATE journal SET actor = 'mallory' WHERE seq = 6")
        code, out, _ = await self.fleetctl("--json", "journal", "verify")
        self.assertEqual(code, 1)
        result = json.loads(out)
        self.assertEqual((result["ok"], result["seq"]), (False, 6))
        self.assertEqual(result["acknowledged"], [{"seq": 5, "break_seq": 2}])
        self.assertEqual(self.gauge(service, "fleetd_journal_chain_ok"), 0.0)

    async def test_reanchor_onlyOwnersWithReason(self) -> None:
        """[J2] Without an owner certificate, or with an empty reason: refused."""
        service = await self.started()
        self.tamper("UPDATE journal SET device = 'w9' WHERE seq = 2")
        status, _ = await deferToThread(
            httpsRequest,
            self.port(service, "admin"),
            "POST",
            "/v1/admin/journal/reanchor",
            self.pki.public_ca,
            None,
            b'{"reason": "not an owner"}',
            "application/json",
        )
        self.assertEqual(status, 403)
        status, body = await deferToThread(
            httpsRequest,
            self.port(service, "admin"),
            "POST",
            "/v1/admin/journal/reanchor",
            self.pki.public_ca,
            (self.pki.owner_cert, self.pki.owner_key),
            b'{"reason": ""}',
            "application/json",
        )
        self.assertEqual(status, 400, body)
        events = [e.event for e in await service.journal.query()]
        self.assertNotIn("journal.reanchored", events)


class ReanchorUsageTests(SynchronousTestCase):
    """fleetctl journal reanchor's usage mistakes, before anything is sent."""

    def test_reasonOnlyWithReanchor(self) -> None:
        """
        --reason without reanchor, reanchor without --reason, and an unknown
        action are one-line usage errors (exit 2).
        """
        config = str(writeConfig(Path(self.mktemp()).resolve()))
        for argv in (
            ["journal", "verify", "--reason", "x"],
            ["journal", "--reason", "x"],
            ["journal", "reanchor"],
            ["journal", "erase"],
        ):
            code, out, err = runFleetctl(["--config", config, *argv])
            self.assertEqual((code, out, err.count("\n")), (2, "", 1), argv)


class JournalSubcommandTests(SynchronousTestCase):
    """
    C{journal list}, C{journal verify}, C{journal reanchor}: sub-commands as
    the other verbs take them; C{journal [--device NAME]} still lists
    (issue 27, item 11).
    """

    def parse(self, *argv: str) -> argparse.Namespace:
        return fleetctl.buildParser().parse_args(argv)

    def test_subcommands_pickTheirHandler(self) -> None:
        """Each sub-command is its own handler; no sub-command is C{list}."""
        cases = [
            (("journal",), "cmdJournal"),
            (("journal", "--device", "w1"), "cmdJournal"),
            (("journal", "list"), "cmdJournal"),
            (("journal", "verify"), "cmdVerify"),
            (("journal", "reanchor", "--reason", "r"), "cmdReanchor"),
        ]
        for argv, handler in cases:
            self.assertEqual(self.parse(*argv).handler.__name__, handler, argv)

    def test_list_filtersBeforeOrAfter(self) -> None:
        """
        C{journal list --device w1} and C{journal --device w1 list} filter
        alike, as C{journal --device w1} does; the last one given counts.
        """
        for argv in [
            ("journal", "--device", "w1"),
            ("journal", "list", "--device", "w1"),
            ("journal", "--device", "w1", "list"),
            ("journal", "--device", "w9", "list", "--device", "w1"),
        ]:
            args = self.parse(*argv, "--run", "r-1", "--since", "3")
            self.assertEqual((args.device, args.run, args.since), ("w1", "r-1", 3))
        args = self.parse("journal", "list")
        self.assertEqual((args.device, args.run, args.since), (None, None, 0))

    def test_filtersWithVerifyOrReanchor_usageError(self) -> None:
        """A filter with verify or reanchor is one usage line, exit 2."""
        config = str(writeConfig(Path(self.mktemp()).resolve()))
        for argv in (
            ["journal", "--device", "w1", "verify"],
            ["journal", "--since", "4", "reanchor", "--reason", "r"],
            ["journal", "verify", "--device", "w1"],
        ):
            code, out, err = runFleetctl(["--config", config, *argv])
            self.assertEqual((code, out, err.count("\n")), (2, "", 1), argv)
            self.assertIn("--", err, argv)


class JournalListCommandTests(DaemonTestMixin, TestCase):
    """C{journal list} against a running daemon."""

    async def test_list_asJournalWithout(self) -> None:
        """
        C{journal list [--device NAME]} prints what C{journal [--device
        NAME]} prints, lines and C{--json}.
        """
        self.makeSettings()
        service = self.startDaemon()
        await service.journal.append(
            "device.added", actor="owner:alice", device="w1", fields={"serial": "S1"}
        )
        await service.journal.append("device.added", actor="owner:alice", device="w2")
        config = ownerConfig(self.directory, self.port(service, "admin"))
        for filters in ([], ["--device", "w1"], ["--json"]):
            old = await fleetctlAgainst(config, "journal", *filters)
            new = await fleetctlAgainst(config, "journal", "list", *filters)
            self.assertEqual(old[0], 0, old)
            self.assertEqual(new, old, filters)
        code, out, err = await fleetctlAgainst(
            config, "journal", "list", "--device", "w1"
        )
        self.assertEqual(code, 0, err)
        self.assertEqual(
            [line.split()[2] for line in out.splitlines()], ["device.added"]
        )
