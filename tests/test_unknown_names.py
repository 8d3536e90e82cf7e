"""
Every fleetctl command that takes a device name refuses a name fleetd does
not know (issue 19 item 4): exit 1 and one line naming it, instead of an
empty answer and exit 0. C{journal --device} knows a device by its history
too, so a retired machine the inventory no longer holds can be audited.
"""

from __future__ import annotations

import json

from twisted.trial.unittest import TestCase

from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import fleetctlAgainst

# Each command naming the unknown device w9, as an operator would type it.
# (approve --device is refused by the device flow itself, 404 unknown-device:
# tests.test_deviceflow_http, over the API.)
COMMANDS = [
    ("journal", "--device", "w9"),
    ("status", "w9"),
    ("device", "show", "w9"),
    ("provision", "w9"),
    ("retire", "w9"),
    ("disks", "forget", "w9", "--reason", "moved"),
]


class UnknownNameTests(DaemonTestMixin, TestCase):
    """fleetctl against the daemon, with names it does and does not know."""

    async def test_everyDeviceCommand_unknownName_oneLineExit1(self) -> None:
        """
        journal --device, status, device show, provision, retire and disks
        forget: an unknown name is one line naming it and exit 1; nothing
        is printed on stdout. So is journal --run with an unknown run.
        """
        config = await self._daemon()
        for words in COMMANDS:
            code, out, err = await fleetctlAgainst(config, *words)
            self.assertEqual((code, out, err.count("\n")), (1, "", 1), (words, err))
            self.assertIn("404", err, words)
            self.assertIn("w9", err, words)
        code, out, err = await fleetctlAgainst(config, "journal", "--run", "r-0000")
        self.assertEqual((code, out, err.count("\n")), (1, "", 1), err)
        self.assertIn("no run named r-0000 in the journal", err)

    async def test_journalDevice_knownByInventoryOrHistory(self) -> None:
        """
        journal --device shows a device the inventory holds (in any case),
        and one known only by its journal history (a retired machine that
        left the inventory), with exit 0.
        """
        config = await self._daemon()
        await self.service.journal.append(
            "device.added", actor="owner:alice", device="old7"
        )
        for name, events in [("W1", ["device.added"]), ("old7", ["device.added"])]:
            code, out, err = await fleetctlAgainst(
                config, "--json", "journal", "--device", name
            )
            self.assertEqual((code, err), (0, ""), name)
            self.assertEqual([e["event"] for e in json.loads(out)], events, name)

    async def _daemon(self) -> str:
        self.service, fleetctl = await self.daemonWithDevice()
        return str(fleetctl.config)
