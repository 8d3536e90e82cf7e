"""
C{fleetctl retire} asks first (issue 19 item 4): retiring cannot be
undone, so at a terminal the owner types the device's name; without a
terminal only C{--yes} retires. A refusal changes nothing.
"""

from __future__ import annotations

import io
import json

from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.cli.cluster import confirmRetire
from fleetd.cli.output import Console
from fleetd.clitools import CLIError
from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import Terminal, fleetctlAgainst

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"
RECORD = {"name": "w1", "serial": "SN-1", "status": "active"}


class ConfirmTests(SynchronousTestCase):
    """L{confirmRetire}: who may say yes, and how."""

    def test_terminal_nameTyped_confirms(self) -> None:
        """At a terminal, typing the name (any case) confirms; the question
        goes to stderr and says it cannot be undone."""
        for typed in ("w1\n", "W1\n", "  w1  \n"):
            err = io.StringIO()
            confirmRetire(RECORD, Console(Terminal(typed), err))
            self.assertIn("cannot be undone", err.getvalue())
            self.assertTrue(err.getvalue().endswith("Type w1 to retire it: "))

    def test_terminal_otherAnswer_refused(self) -> None:
        """Anything else, or end of input, is not a yes: one line, exit 1."""
        for typed, shown in (("y\n", "y typed"), ("", "nothing typed")):
            error = self.assertRaises(
                CLIError, confirmRetire, RECORD, Console(Terminal(typed), io.StringIO())
            )
            self.assertEqual(error.status, 1)
            self.assertIn(shown, str(error))
            self.assertIn("nothing changed", str(error))

    def test_noTerminal_refusedWithoutAsking(self) -> None:
        """Without a terminal nothing is read: pass --yes, exit 2."""
        stdin, err = io.StringIO("w1\n"), io.StringIO()
        error = self.assertRaises(CLIError, confirmRetire, RECORD, Console(stdin, err))
        self.assertEqual(error.status, 2)
        self.assertIn("pass --yes", str(error))
        self.assertEqual((stdin.tell(), err.getvalue()), (0, ""))


class CommandTests(DaemonTestMixin, TestCase):
    """fleetctl retire against the daemon."""

    async def test_retire_confirmation(self) -> None:
        """
        Without --yes and no terminal: exit 2, one line, still not retired;
        at a terminal, a wrong name: exit 1, not retired; the right name
        retires; --yes retires without asking (--json after the command).
        """
        _, fleetctl = await self.daemonWithDevice()
        await self.deviceAdd(fleetctl, "w2", "SN-2", UUID[:-1] + "3")
        config = fleetctl.config

        async def status(name: str) -> str:
            code, out, err = await fleetctlAgainst(config, "device", "show", name)
            self.assertEqual(code, 0, err)
            return out.split("status: ")[1].split("\n")[0]

        code, out, err = await fleetctlAgainst(config, "retire", "w1")
        self.assertEqual((code, out, err.count("\n")), (2, "", 1), err)
        self.assertIn("pass --yes", err)
        self.assertEqual(await status("w1"), "inventory")
        code, out, err = await fleetctlAgainst(
            config, "retire", "w1", stdin=Terminal("w2\n")
        )
        self.assertEqual((code, out), (1, ""), err)
        self.assertIn("not confirmed (w2 typed, not w1); nothing changed", err)
        self.assertEqual(await status("w1"), "inventory")
        code, out, err = await fleetctlAgainst(
            config, "retire", "w1", stdin=Terminal("w1\n")
        )
        self.assertEqual(code, 0, err)
        self.assertIn("w1  decommissioning", out)
        code, out, err = await fleetctlAgainst(
            config, "retire", "w2", "--yes", "--json"
        )
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out)["status"], "decommissioning")
