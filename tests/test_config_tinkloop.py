"""
fleetd refuses to start when C{tink.upstream} is its own tink listener
(issue 27, item 6): tink-server on the same host as fleetd, both on 42113.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, loadSettings, parseTopology
from fleetd.config.tinkloop import bound, loops
from tests.support import TOPOLOGY, writeConfig

SITE = parseTopology(
    b'{"SPORE_IP": "10.20.0.5", "SPORE_BOOTSTRAP_IP": "10.20.0.6",'
    b' "enrollment_name": "enroll.example.net", "anchors": []}'
)


class StartRefusedTests(SynchronousTestCase):
    def load(self, tink: str, upstream: str) -> Any:
        path = writeConfig(
            Path(self.mktemp()),
            {"listen": {"tink": tink}, "tink": {"upstream": upstream}},
        )
        return loadSettings(path)

    def test_sameAddress_oneLineNamingBothKeys(self) -> None:
        """
        listen.tink tcp:42113 (every IPv4 address) and tink.upstream
        tcp:127.0.0.1:42113: start-up stops with one line naming
        tink.upstream, the listener and what to do.
        """
        e = self.assertRaises(
            ConfigError, self.load, "tcp:42113", "tcp:127.0.0.1:42113"
        )
        self.assertEqual(e.key, "tink.upstream")
        self.assertEqual(
            str(e),
            "tink.upstream: tcp:127.0.0.1:42113 is fleetd's own tink listener"
            " (listen.tink = 'tcp:42113'): fleetd would proxy to itself; when"
            " tink-server runs on this host, move it to another port"
            ' (docs/install.md, "tink-server on the same host")',
        )
        self.assertNotIn("\n", str(e))

    def test_wildcardBind_ownAddressesAndNames(self) -> None:
        """
        A wildcard listener is reached through every address of the host:
        loopback, the unspecified address, localhost, the topology's
        SPORE_IP and SPORE_BOOTSTRAP_IP, the enrollment name; tls: too.
        """
        name = str(TOPOLOGY["enrollment_name"])
        for upstream in (
            "tcp:127.0.0.1:42113",
            "tcp:127.0.0.2:42113",
            "tcp:0.0.0.0:42113",
            "tcp:localhost:42113",
            f"tcp:{TOPOLOGY['SPORE_IP']}:42113",
            f"tls:{TOPOLOGY['SPORE_BOOTSTRAP_IP']}:42113",
            f"tcp:{name}:42113",
            f"tcp:{name.upper()}.:42113",
            "tcp:[::ffff:127.0.0.1]:42113",
        ):
            e = self.assertRaises(ConfigError, self.load, "tcp:42113", upstream)
            self.assertEqual(e.key, "tink.upstream", upstream)

    def test_otherPortOrHost_starts(self) -> None:
        """
        tink-server moved to another port, or on another host (a name
        fleetd does not resolve, another address), is a valid upstream.
        """
        for listen, upstream in (
            ("tcp:42113", "tcp:127.0.0.1:42114"),
            ("tcp:42113", "tcp:tink-server:42113"),
            ("tcp:42113", "tcp:10.20.0.7:42113"),
            ("tcp:42113", "tcp:[::1]:42113"),  # IPv4 wildcard, IPv6 loopback
            ("tcp:42113:interface=10.20.0.6", "tcp:127.0.0.1:42113"),
            ("tcp:0:interface=127.0.0.1", "tcp:127.0.0.1:1"),
        ):
            settings = self.load(listen, upstream)
            self.assertEqual(settings.listen.tink, listen)

    def test_specificInterface_sameAddressRefused(self) -> None:
        """A listener on one address is refused as upstream by that address."""
        for listen, upstream in (
            ("tcp:42113:interface=127.0.0.1", "tcp:127.0.0.1:42113"),
            ("tcp:42113:interface=127.0.0.1", "tcp:localhost:42113"),
            (
                "tcp:42113:interface=10.20.0.6",
                f"tcp:{TOPOLOGY['enrollment_name']}:42113",
            ),
            ("tcp6:42113", "tcp:127.0.0.1:42113"),  # dual stack
            ("tcp6:42113:interface=\\:\\:1", "tcp:[::1]:42113"),
        ):
            e = self.assertRaises(ConfigError, self.load, listen, upstream)
            self.assertEqual(e.key, "tink.upstream", (listen, upstream))


class LoopsTests(SynchronousTestCase):
    """The pure decision, from values."""

    def test_hostName_isThisHost(self) -> None:
        """The host's own name reaches a wildcard listener; another name not."""
        listen = bound("tcp:42113")
        assert listen is not None
        self.assertTrue(loops(listen, "Spore", 42113, SITE, "spore"))
        self.assertFalse(loops(listen, "tink", 42113, SITE, "spore"))
        self.assertFalse(loops(listen, "spore", 42113, SITE, ""))

    def test_bound_unixOrUnresolvedName_cannotTell(self) -> None:
        """A unix: listener, or one on a name, is never called a loop."""
        self.assertIsNone(bound("unix:/run/fleetd/tink.sock"))
        self.assertIsNone(bound("tcp:42113:interface=spore.example.net"))
        self.assertEqual(
            bound("tcp:42113:interface=localhost"),
            bound("tcp:42113:interface=127.0.0.1"),
        )
