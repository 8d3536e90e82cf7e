"""The daemon with C{[netbox]}: NetBox becomes the inventory (a real loopback fake)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from fleetd.config import ConfigError, loadSettings
from fleetd.netbox.inventory import NetBoxInventory
from fleetd.prepare import prepare
from fleetd.testing.netbox import FakeNetBox
from tests.daemonsupport import DaemonTestMixin
from tests.netbox_support import TOKEN
from tests.support import exposedMetrics, ruleMetrics, writeConfig


class NetBoxDaemonTests(DaemonTestMixin, TestCase):
    timeout = 60

    async def test_netboxSection_selectsNetBoxInventory(self) -> None:
        """
        [netbox] present: the daemon's inventory is NetBox's, over plain
        http with a base path; it checks the custom fields at start.
        """
        fake = FakeNetBox(basePath="/nb/")
        port: Any = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
            Site(fake)
        )
        self.addCleanup(port.stopListening)
        token = Path(self.mktemp()).resolve()
        token.write_text(TOKEN)
        url = f"http://127.0.0.1:{port.getHost().port}/nb/"
        self.makeSettings({"netbox": {"url": url, "token_file": str(token)}})
        service = self.startDaemon()
        self.assertIsInstance(service.inventory, NetBoxInventory)
        for _ in range(100):
            if ("GET", "/nb/api/extras/custom-fields/") in fake.requests:
                break
            await deferLater(reactor, 0.05)
        self.assertIn(("GET", "/nb/api/extras/custom-fields/"), fake.requests)
        # Every NetBox metric an alert rule uses is exposed (item 11).
        _, _, body = await self.get(service, "admin", "/metrics")
        exposed = exposedMetrics(body.decode())
        used = ruleMetrics("fleetd_netbox_")
        self.assertIn("fleetd_netbox_lookups_failed_total", used)
        self.assertEqual(used - exposed, set())
        stopping: Deferred[Any] | None = self.stopDaemon(service)
        if stopping is not None:
            await stopping

    def test_badTokenFile_configError(self) -> None:
        """A [netbox] token_file that cannot be read stops start-up naming the key."""
        directory = Path(self.mktemp()).resolve()
        settings = loadSettings(
            writeConfig(
                directory,
                {"netbox": {"url": "https://nb.example", "token_file": "missing"}},
            )
        )
        error = self.assertRaises(ConfigError, prepare, settings)
        self.assertEqual(error.key, "netbox.token_file")
