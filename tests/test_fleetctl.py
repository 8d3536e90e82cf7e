"""Tests for fleetctl: the frame; journal and console against a real daemon."""

from __future__ import annotations

import argparse
import io
import json
import re
import sqlite3
import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.console.sessions import LINK_LIFETIME
from fleetd.cli import fleetctl
from fleetd.cli import journal as journalCommand
from fleetd.service import FleetdService
from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import ownerConfig
from tests.fleetctlsupport import runFleetctl as run
from tests.support import writeConfig


class FrameTests(SynchronousTestCase):
    def test_noCommand_oneLineUsageError(self) -> None:
        """Usage errors are one line on stderr and exit status 2."""
        code, out, err = run(["--config", "/nonexistent.toml"])
        self.assertEqual(code, 2)
        self.assertEqual(out, "")
        self.assertEqual(err.count("\n"), 1)

    def test_unknownCommand(self) -> None:
        """An unknown command is one line and exit 2."""
        code, _, err = run(["frobnicate"])
        self.assertEqual((code, err.count("\n")), (2, 1))

    def test_missingConfig_oneLine(self) -> None:
        """A missing config file is one line naming the problem, exit 2."""
        code, _, err = run(["--config", "/nonexistent.toml", "journal"])
        self.assertEqual(code, 2)
        self.assertIn("cannot read /nonexistent.toml", err)
        self.assertEqual(err.count("\n"), 1)

    def test_configPath_discovery(self) -> None:
        """--config, then FLEETD_CONFIG, then /etc/fleetd/fleetd.toml."""
        self.assertEqual(
            fleetctl.configPath("a.toml", {"FLEETD_CONFIG": "b"}), Path("a.toml")
        )
        self.assertEqual(fleetctl.configPath(None, {"FLEETD_CONFIG": "b"}), Path("b"))
        self.assertEqual(fleetctl.configPath(None, {}), Path("/etc/fleetd/fleetd.toml"))

    def test_closedPipe_quietExit0(self) -> None:
        """`fleetctl journal | head`: a reader that went away is no traceback."""

        class Closed(io.StringIO):
            def write(self, text: str) -> int:
                raise BrokenPipeError(32, "Broken pipe")

        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory)

        def journal(settings: Any, args: Any, out: Any) -> int:
            out.write("    1  entry\n")
            return 0

        self.patch(journalCommand, "cmdJournal", journal)
        err = io.StringIO()
        code = fleetctl.main(["--config", str(config), "journal"], Closed(), err)
        self.assertEqual((code, err.getvalue()), (0, ""))

    def test_daemonDown_oneLine(self) -> None:
        """When fleetd does not answer, one line says where fleetctl looked."""
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory, {"owner": {"server": "https://localhost:1"}})
        from fleetd.pki.dev import ensureDevPKI

        ensureDevPKI(directory / "pki", "enroll.lolwtf.ca")
        code, _, err = run(["--config", str(config), "journal"])
        self.assertEqual(code, 1)
        self.assertIn("cannot reach fleetd at https://localhost:1", err)
        self.assertEqual(err.count("\n"), 1)


# One way to call each fleetctl command, by its words: --json must be taken
# before or after each (issue 19 item 4).
EVERY_COMMAND = {
    ("journal", "list"): ["journal", "list"],
    ("journal", "verify"): ["journal", "verify"],
    ("journal", "reanchor"): ["journal", "reanchor", "--reason", "r"],
    ("device", "add"): ["device", "add", "w1", "--serial", "S", "--uuid", "U",
                        "--class", "worker"],
    ("device", "list"): ["device", "list"],
    ("device", "show"): ["device", "show", "w1"],
    ("device", "import"): ["device", "import", "f.csv"],
    ("device", "forget-identity"): ["device", "forget-identity", "w1",
                                    "--reason", "r"],
    ("provision",): ["provision", "w1", "w2"],
    ("approve",): ["approve", "BCDF-GHJK", "--device", "w1"],
    ("status",): ["status", "w1"],
    ("evidence", "add"): ["evidence", "add", "--serial", "S", "--ek-sha256", "H",
                          "--kind", "console"],
    ("evidence", "import"): ["evidence", "import", "m.csv"],
    ("evidence", "list"): ["evidence", "list"],
    ("evidence", "withdraw"): ["evidence", "withdraw", "1", "--reason", "r"],
    ("binding", "approve"): ["binding", "approve", "S"],
    ("binding", "list"): ["binding", "list"],
    ("disks", "forget"): ["disks", "forget", "w1", "--reason", "r"],
    ("cluster-token", "request"): ["cluster-token", "request", "--node", "cp1",
                                   "--reason", "r"],
    ("cluster-token", "approve"): ["cluster-token", "approve", "ctr-1"],
    ("cluster-token", "rotate"): ["cluster-token", "rotate"],
    ("cluster-token", "list"): ["cluster-token", "list"],
    ("retire",): ["retire", "w1", "--yes"],
    ("dns-check",): ["dns-check", "--timeout", "1"],
    ("backup",): ["backup", "state.sqlite3"],
    ("console",): ["console"],
}  # fmt: skip


def commandPaths(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> set[tuple[str, ...]]:
    """The words of every command C{parser} takes, down to the leaves."""
    found: set[tuple[str, ...]] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= commandPaths(sub, (*prefix, name)) or {(*prefix, name)}
    return found


class JSONAnywhereTests(SynchronousTestCase):
    """C{--json} before or after the subcommand, everywhere (issue 19 item 4)."""

    def test_everyCommand_jsonBeforeOrAfter(self) -> None:
        """
        Every command takes --json before the command, after it, or after
        the group's word (C{device --json list}); without it, no JSON.
        """
        parser = fleetctl.buildParser()
        self.assertEqual(commandPaths(parser), set(EVERY_COMMAND))
        for path, argv in EVERY_COMMAND.items():
            self.assertFalse(parser.parse_args(argv).json, path)
            self.assertTrue(parser.parse_args(["--json", *argv]).json, path)
            self.assertTrue(parser.parse_args([*argv, "--json"]).json, path)
            inner = [*path, "--json", *argv[len(path) :]]
            self.assertTrue(parser.parse_args(inner).json, path)
            both = parser.parse_args(["--json", *argv, "--json"])
            self.assertTrue(both.json, path)


class JournalCommandTests(DaemonTestMixin, TestCase):
    def setUp(self) -> None:
        self.makeSettings()

    def configFor(self, port: int) -> Path:
        return ownerConfig(self.directory, port)

    async def test_journal_listFilterVerify(self) -> None:
        """
        fleetctl journal lists, filters by device (--json) and verifies the
        chain; an edited entry makes verify fail with its seq and exit 1.
        """
        service = self.startDaemon()
        await service.journal.append(
            "device.added", actor="owner:alice", device="w1", fields={"serial": "S1"}
        )
        await service.journal.append(
            "run.provisioned", actor="owner:alice", device="w1", run="r-1"
        )
        await service.journal.append("device.added", actor="owner:alice", device="w2")
        config = str(self.configFor(self.port(service, "admin")))

        code, out, err = await deferToThread(run, ["--config", config, "journal"])
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(len(out.splitlines()), 4)
        self.assertIn("fleetd.started", out)

        code, out, _ = await deferToThread(
            run, ["--config", config, "--json", "journal", "--device", "w1"]
        )
        entries = json.loads(out)
        self.assertEqual(
            [e["event"] for e in entries], ["device.added", "run.provisioned"]
        )
        self.assertEqual(entries[0]["fields"], {"serial": "S1"})

        code, out, _ = await deferToThread(
            run, ["--config", config, "journal", "verify"]
        )
        self.assertEqual(code, 0)
        self.assertIn("journal OK: 4 entries", out)

        db = sqlite3.connect(self.settings.state / "fleetd.sqlite3")
        db.execute("UPDATE journal SET device = 'w9' WHERE seq = 2")
        db.commit()
        db.close()
        code, out, _ = await deferToThread(
            run, ["--config", config, "--json", "journal", "verify"]
        )
        self.assertEqual(code, 1)
        result = json.loads(out)
        self.assertEqual((result["ok"], result["seq"]), (False, 2))


class ServerNameTests(DaemonTestMixin, TestCase):
    """fleetctl on the reference site as shipped (owner.server on localhost)."""

    def setUp(self) -> None:
        self.makeSettings()
        # A public certificate like the reference site's: the enrollment
        # name only, no localhost, no loopback addresses.
        from datetime import UTC, datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID

        from fleetd.pki.dev import ensureDevPKI, makeCertificate

        ensureDevPKI(self.pki.directory, "enroll.lolwtf.ca")
        caCert = x509.load_pem_x509_certificate(self.pki.public_ca.read_bytes())
        caKey = serialization.load_pem_private_key(
            self.pki.public_ca_key.read_bytes(), None
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = makeCertificate(
            "enroll.lolwtf.ca", key, datetime.now(UTC), (caCert, caKey),  # type: ignore[arg-type]
            ExtendedKeyUsageOID.SERVER_AUTH, [x509.DNSName("enroll.lolwtf.ca")],
        )  # fmt: skip
        self.pki.public_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.pki.public_key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    async def test_adminOnLocalhost_certificateForEnrollmentName(self) -> None:
        """
        With owner.server = https://localhost:8446 (as conf/fleetd.toml ships)
        and a public certificate for the enrollment name alone, fleetctl
        connects to localhost and verifies the certificate for the
        enrollment name; a certificate from another CA is still refused,
        in one line naming owner.server_ca, the CA it verified with
        (issue 27, item 6), or the system roots when it is not set.
        """
        service = self.startDaemon()
        port = self.port(service, "admin")
        for host in ("localhost", "127.0.0.1"):
            config = writeConfig(
                self.directory, {"owner": {"server": f"https://{host}:{port}"}}
            )
            code, out, err = await deferToThread(
                run, ["--config", str(config), "--json", "journal"]
            )
            self.assertEqual((code, err), (0, ""), host)
            self.assertIsInstance(json.loads(out), list)
        # The name is still checked: another CA's certificate is refused.
        other = writeConfig(
            self.directory,
            {"owner": {"server": f"https://localhost:{port}",
                       "server_ca": "pki/owner-ca.pem"}},
        )  # fmt: skip
        code, _, err = await deferToThread(run, ["--config", str(other), "journal"])
        self.assertEqual(code, 1)
        # The one line names the key holding the CA it verified with.
        where = f"fleetctl: cannot reach fleetd at https://localhost:{port}"
        self.assertEqual(
            err,
            f"{where}: its certificate did not verify with owner.server_ca"
            f" ({self.directory.resolve() / 'pki' / 'owner-ca.pem'}):"
            " unable to get local issuer certificate\n",
        )
        roots = writeConfig(
            self.directory,
            {"owner": {"server": f"https://localhost:{port}", "server_ca": None}},
        )
        code, _, err = await deferToThread(run, ["--config", str(roots), "journal"])
        self.assertEqual(
            (code, err),
            (
                1,
                f"{where}: its certificate did not verify with the system roots"
                " (owner.server_ca is not set): unable to get local issuer"
                " certificate\n",
            ),
        )


class ConsoleCommandTests(DaemonTestMixin, TestCase):
    """C{fleetctl console} against a real daemon (issue 20 item 5)."""

    daemon: FleetdService

    async def linkFor(self, *argv: str) -> tuple[str, int, float]:
        """Run C{fleetctl argv... console}: its output, the admin port, when."""
        self.makeSettings()
        service = self.daemon = self.startDaemon()
        port = self.port(service, "admin")
        config = str(ownerConfig(self.directory, port))
        asked = time.time()
        code, out, err = await deferToThread(
            run, ["--config", config, *argv, "console"]
        )
        self.assertEqual((code, err), (0, ""))
        return out, port, asked

    def assertLink(self, url: str, port: int) -> str:
        """C{url} is a login link on the enrollment name and admin port."""
        parts = urlsplit(url)
        self.assertEqual(parts.scheme, "https")
        self.assertEqual(parts.hostname, self.settings.topology.enrollment_name)
        self.assertEqual(parts.port, port)
        self.assertEqual(parts.path, "/login")
        (token,) = parse_qs(parts.query, strict_parsing=True)["token"]
        self.assertGreaterEqual(len(token), 40)
        return token

    async def test_console_printsLinkAndExpiry(self) -> None:
        out, port, asked = await self.linkFor()
        url, line = out.splitlines()
        token = self.assertLink(url, port)
        found = re.fullmatch(
            r"open it once, before (\d\d):(\d\d):(\d\d) UTC;"
            r" it signs this browser in as you",
            line,
        )
        assert found is not None, line
        h, m, s = (int(g) for g in found.groups())
        shown = (h * 3600 + m * 60 + s - asked) % 86400
        self.assertLess(abs(shown - LINK_LIFETIME), 5, line)
        entries = [e.toJSON() for e in await self.daemon.journal.query()]
        issued = [e for e in entries if e["event"] == "console.link-issued"]
        self.assertEqual([e["actor"] for e in issued], ["owner:owner"])
        self.assertNotIn(token, json.dumps(entries))

    async def test_console_json(self) -> None:
        out, port, asked = await self.linkFor("--json")
        doc = json.loads(out)
        self.assertEqual(set(doc), {"url", "expires_at"})
        self.assertLink(doc["url"], port)
        self.assertLess(abs(doc["expires_at"] - asked - LINK_LIFETIME), 5)


class VerifyFailureTests(SynchronousTestCase):
    def test_hostnameMismatch_namesEnrollmentName(self) -> None:
        """
        A chain that verifies for another name: the line names the
        enrollment name it was verified for, and owner.server_ca.
        """
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory)
        from fleetd.cli.client import AdminClient
        from fleetd.config import loadSettings
        from fleetd.pki.dev import ensureDevPKI

        ensureDevPKI(directory / "pki", "enroll.lolwtf.ca")
        client = AdminClient(loadSettings(config))
        e = ssl.SSLCertVerificationError(1, "certificate verify failed")
        e.verify_code, e.verify_message = 62, "Hostname mismatch"
        self.assertEqual(
            client.failure(e),
            f"its certificate did not verify with owner.server_ca"
            f" ({directory / 'pki' / 'public-ca.pem'}): it is not for"
            " enroll.lolwtf.ca (the topology's enrollment_name)",
        )
