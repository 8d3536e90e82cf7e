"""
The dev configuration (C{conf/fleetd.dev.toml}, what C{make run} starts)
as a new user meets it (issue 27, item 10): two checkouts on one machine
keep apart everything but the loopback ports, and C{fleetctl console}'s
link opens in a browser on the dev machine.
"""

from __future__ import annotations

import dataclasses
import http.client
import re
import shutil
import socket
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.deviceflow import adminBase
from fleetd.config import ConfigError, Settings, loadSettings
from fleetd.config.table import configDirId
from fleetd.vault.mounts import VOLATILE_FILESYSTEMS, filesystemType
from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import ownerConfig, runFleetctl
from tests.support import REPO

DEV_CONFIG = Path("conf") / "fleetd.dev.toml"


def checkout(root: Path) -> Path:
    """A checkout's C{conf/} at C{root}: its dev config's path."""
    shutil.copytree(REPO / "conf", root / "conf")
    return root / DEV_CONFIG


def paths(value: Any) -> list[Path]:
    """Every path a settings object holds, in its sub-tables too."""
    if isinstance(value, Path):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        found: list[Path] = []
        for f in dataclasses.fields(value):
            found += paths(getattr(value, f.name))
        return found
    return []


class CheckoutsApartTests(SynchronousTestCase):
    """Two checkouts' dev configs share no file, directory or vault."""

    def setUp(self) -> None:
        base = Path(self.mktemp()).resolve()
        self.roots = [base / "one", base / "two"]
        self.settings: list[Settings] = [
            loadSettings(checkout(root)) for root in self.roots
        ]

    def test_vault_perCheckoutOnTmpfs(self) -> None:
        """Each checkout's dev vault is its own directory under /dev/shm
        (tmpfs, [V1]), named by its config directory's digest."""
        vaults = [s.vault for s in self.settings]
        self.assertNotEqual(vaults[0], vaults[1])
        for root, vault in zip(self.roots, vaults, strict=True):
            self.assertEqual(
                vault,
                Path(f"/dev/shm/fleetd-dev-{configDirId(root / 'conf')}/configs"),
            )
            self.assertIn(filesystemType(Path("/dev/shm")), VOLATILE_FILESYSTEMS)
        self.assertFalse(any(s.vault_allow_any_fs for s in self.settings))

    def test_everyPath_ownedByItsCheckout(self) -> None:
        """Every path of the dev config (state, PKI, templates, topology)
        lies in its checkout, but the vault, which is per checkout on
        tmpfs: nothing is shared between two checkouts."""
        one, two = ({p for p in paths(s) if p != s.vault} for s in self.settings)
        self.assertTrue(one)
        for root, found in zip(self.roots, (one, two), strict=True):
            outside = [p for p in found if not p.is_relative_to(root)]
            self.assertEqual(outside, [], f"shared by every checkout: {outside}")

    def test_placeholder_misspelt_refused(self) -> None:
        """A brace in C{paths.vault} that is not C{{config_dir_id}} stops
        the start naming the key (it must not become a directory name)."""
        config = self.roots[0] / DEV_CONFIG
        text = config.read_text()
        line = next(x for x in text.splitlines() if x.startswith("vault = "))
        config.write_text(text.replace(line, line.replace("_dir_id", "_id")))
        error = self.assertRaises(ConfigError, loadSettings, config)
        self.assertEqual(error.key, "paths.vault")


def opened(url: str, ca: Path) -> tuple[int, str]:
    """GET C{url} as a browser on this machine would: the name resolved
    by the system, the certificate verified for it against C{ca}."""
    parts = urlsplit(url)
    assert parts.scheme == "https" and parts.hostname is not None, url
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(
        parts.hostname, parts.port, context=context, timeout=10
    )
    try:
        conn.request("GET", f"{parts.path}?{parts.query}")
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


class ConsoleLinkTests(DaemonTestMixin, TestCase):
    """C{fleetctl console} on the dev config prints a link a browser on
    the dev machine opens (the admin listener is on loopback there)."""

    def setUp(self) -> None:
        self.dev = loadSettings(checkout(Path(self.mktemp()).resolve()))

    def test_devConfig_consoleHostReachesTheAdminListener(self) -> None:
        """The dev config names its console links' host, and that name
        resolves, on this machine, to the address the admin listener is
        bound to (not the enrollment name, which resolves elsewhere)."""
        host = self.dev.owner.console_host
        self.assertIsNotNone(host)
        assert host is not None
        self.assertNotEqual(host, self.dev.topology.enrollment_name)
        bound = re.search(r"interface=([^:]+)", self.dev.listen.admin)
        assert bound is not None, self.dev.listen.admin
        resolved = {info[4][0] for info in socket.getaddrinfo(host, 8446)}
        self.assertIn(bound.group(1), resolved)

    def test_consoleHost_hostOnly(self) -> None:
        """C{owner.console_host} is a host name or an IP address (an IPv6
        one bracketed in the link); a URL there stops the start naming it."""
        self.assertEqual(adminBase("::1", 8446), "https://[::1]:8446")
        self.assertEqual(adminBase("localhost", 443), "https://localhost")
        for bad in ("https://localhost:8446", "localhost:8446", "a..b", "-x"):
            self.makeSettings()
            config = ownerConfig(self.directory, 1, {"owner": {"console_host": bad}})
            error = self.assertRaises(ConfigError, loadSettings, config)
            self.assertEqual(error.key, "owner.console_host", bad)

    async def test_link_opensWithTheDevCA(self) -> None:
        """A daemon with the dev config's C{owner.console_host} prints a
        link to its own admin port under that name, and the link opens:
        the name resolves here and the dev certificate covers it."""
        host = self.dev.owner.console_host
        self.makeSettings({"owner": {"console_host": host}})
        service = self.startDaemon()
        port = self.port(service, "admin")
        owner = {"server": f"https://localhost:{port}", "console_host": host}
        config = ownerConfig(self.directory, port, {"owner": owner})
        code, out, err = await deferToThread(
            runFleetctl, ["--config", str(config), "console"]
        )
        self.assertEqual((code, err), (0, ""))
        url = out.splitlines()[0]
        parts = urlsplit(url)
        self.assertEqual((parts.hostname, parts.port), (host, port), url)
        status, page = await deferToThread(opened, url, self.pki.public_ca)
        self.assertEqual(status, 200)
        self.assertIn("Sign in", page)
