"""Tests for L{fleetd.config}."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, loadSettings, parseSettings, parseTopology
from fleetd.config.table import Table, checkUnknownKeys
from tests.support import TOPOLOGY, writeConfig

REPO = Path(__file__).resolve().parent.parent


class SettingsTests(SynchronousTestCase):
    def configError(self, overrides: dict[str, dict[str, Any]]) -> ConfigError:
        path = writeConfig(Path(self.mktemp()), overrides)
        error: ConfigError = self.assertRaises(ConfigError, loadSettings, path)
        return error

    def test_loadSettings_devConfig(self) -> None:
        """The shipped dev config loads: loopback listeners, dns on 10053."""
        s = loadSettings(REPO / "conf" / "fleetd.dev.toml")
        self.assertEqual(s.listen.boot, "tcp:8443:interface=127.0.0.1")
        self.assertEqual(
            (s.listen.dns_port, s.listen.dns_interface), (10053, "127.0.0.1")
        )
        self.assertTrue(s.dev_pki)
        self.assertEqual(s.topology.enrollment_name, "enroll.lolwtf.ca")
        self.assertEqual(s.state.resolve(), REPO / ".dev" / "state")

    def test_relativePaths_resolvedAgainstConfigDirectory(self) -> None:
        """Relative paths are relative to the config file's directory."""
        directory = Path(self.mktemp()).resolve()
        s = loadSettings(writeConfig(directory))
        self.assertEqual(s.state, directory / "state")
        self.assertEqual(s.tls.cert, directory / "pki" / "public.pem")

    def test_missingTable_namesIt(self) -> None:
        """
        A missing required table is named in the error, with the present
        table that looks like a typo of it (§3).
        """
        path = writeConfig(Path(self.mktemp()))
        text = path.read_text().replace("[tink]", "[tinkk]")
        path.write_text(text)
        e = self.assertRaises(ConfigError, loadSettings, path)
        self.assertEqual(str(e), "tink: missing table (found tinkk: a typo?)")

    def test_badEndpoint_namesKey(self) -> None:
        """A bad endpoint description names listen.<name>."""
        e = self.configError({"listen": {"boot": "tcp:notaport"}})
        self.assertEqual(e.key, "listen.boot")

    def test_sslEndpoint_refused(self) -> None:
        """TLS comes from [tls]; an ssl: endpoint is refused by key."""
        e = self.configError({"listen": {"admin": "ssl:8446"}})
        self.assertEqual(e.key, "listen.admin")
        self.assertIn("[tls]", e.problem)

    def test_badDNSListen_namesKey(self) -> None:
        """listen.dns must be PORT or PORT:interface=ADDR."""
        for bad in ["x53", "53:iface=1.2.3.4", "70000", "53:interface=nope"]:
            e = self.configError({"listen": {"dns": bad}})
            self.assertEqual(e.key, "listen.dns", bad)

    def test_wrongType_namesKey(self) -> None:
        """Wrong types and out-of-range numbers name their keys."""
        self.assertEqual(
            self.configError({"limits": {"max_connections": "9"}}).key,
            "limits.max_connections",
        )
        self.assertEqual(
            self.configError({"limits": {"idle_timeout": 0}}).key, "limits.idle_timeout"
        )
        self.assertEqual(
            self.configError({"paths": {"vault_allow_any_fs": 1}}).key,
            "paths.vault_allow_any_fs",
        )
        self.assertEqual(self.configError({"dns": {"ttl": -1}}).key, "dns.ttl")

    def test_missingKey_namesKey(self) -> None:
        """A missing required key is named."""
        self.assertEqual(self.configError({"tls": {"cert": None}}).key, "tls.cert")
        self.assertEqual(
            self.configError({"paths": {"state": None}}).key, "paths.state"
        )

    def test_invalidTOML(self) -> None:
        """Invalid TOML is one error under the key 'config'."""
        path = Path(self.mktemp())
        path.write_text("[site\nname=")
        e = self.assertRaises(ConfigError, loadSettings, path)
        self.assertEqual(e.key, "config")
        self.assertNotIn("\n", str(e))

    def test_missingFile(self) -> None:
        """A config file that does not exist is one clear error."""
        e = self.assertRaises(ConfigError, loadSettings, Path("/nonexistent/x.toml"))
        self.assertIn("cannot read", str(e))

    def test_optionalTables(self) -> None:
        """[kubernetes] and [netbox] are optional; present, they are parsed."""
        s = loadSettings(writeConfig(Path(self.mktemp())))
        self.assertIsNone(s.kubernetes)
        self.assertIsNone(s.netbox)
        s = loadSettings(
            writeConfig(
                Path(self.mktemp()),
                {
                    "kubernetes": {"api": "https://10.20.0.10:6443", "token_file": "t"},
                    "netbox": {"url": "https://netbox.example", "token_file": "n"},
                },
            )
        )
        assert s.kubernetes is not None and s.netbox is not None
        self.assertEqual(s.kubernetes.api, "https://10.20.0.10:6443")
        self.assertEqual(s.netbox.url, "https://netbox.example")
        self.assertIsNone(s.netbox.ca)

    def test_netbox_caAndURL(self) -> None:
        """[netbox] ca is a path; url is http(s), maybe with a base path."""
        directory = Path(self.mktemp())
        s = loadSettings(
            writeConfig(
                directory,
                {
                    "netbox": {
                        "url": "http://127.0.0.1:8000/netbox/",
                        "token_file": "n",
                        "ca": "netbox-ca.pem",
                    }
                },
            )
        )
        assert s.netbox is not None
        self.assertEqual(s.netbox.url, "http://127.0.0.1:8000/netbox/")
        self.assertEqual(s.netbox.ca, directory.absolute() / "netbox-ca.pem")
        for bad in ("ftp://netbox.example", "netbox.example", "https://x/?a=1"):
            error = self.configError({"netbox": {"url": bad, "token_file": "n"}})
            self.assertEqual(error.key, "netbox.url")


class PlaceholderTests(SynchronousTestCase):
    def test_placeholder_refusedNamingKey(self) -> None:
        """
        A REPLACE-WITH-... value left in the configuration (the shipped
        conf/fleetd.toml's, docs/install.md) stops start-up with one line
        naming its key, in a table, a nested table or an array.
        """
        for overrides, key in (
            ({"site": {"name": "REPLACE-WITH-SITE-NAME"}}, "site.name"),
            ({"provision": {"classes": ["worker", "REPLACE-WITH-CLASS"]}},
             "provision.classes"),
            ({"tink": {"upstream": "tcp:REPLACE-WITH-TINK-SERVER:42113"}},
             "tink.upstream"),
        ):  # fmt: skip
            path = writeConfig(Path(self.mktemp()), overrides)
            e = self.assertRaises(ConfigError, loadSettings, path)
            self.assertEqual(e.key, key)
            self.assertIn("is a placeholder: put the site's value here", str(e))
        nested = {"dns": {"rate_limit": {"rate": 5, "x": "REPLACE-WITH-X"}}}
        e = self.assertRaises(
            ConfigError, parseSettings, nested, Path("/etc/fleetd/fleetd.toml")
        )
        self.assertEqual(e.key, "dns.rate_limit.x")


class UnknownKeyTests(SynchronousTestCase):
    """An unknown key or table is bad configuration, named by dotted key (§3)."""

    def loadError(self, path: Path) -> str:
        return str(self.assertRaises(ConfigError, loadSettings, path))

    def configError(self, overrides: dict[str, dict[str, Any]]) -> str:
        return self.loadError(writeConfig(Path(self.mktemp()), overrides))

    def test_keyInTable_namedWithHint(self) -> None:
        """§3: a misspelt key in a table is refused, naming the nearest known key."""
        self.assertEqual(
            self.configError({"limits": {"max_conections": 10}}),
            "limits.max_conections: unknown key (did you mean limits.max_connections?)",
        )

    def test_keyInTable_noHintWhenNothingClose(self) -> None:
        """§3: an unknown key unlike any known one is named without a hint."""
        self.assertEqual(
            self.configError({"site": {"colour": "blue"}}), "site.colour: unknown key"
        )

    def test_keyInOptionalTable(self) -> None:
        """§3: keys of optional tables ([kubernetes]) are checked too."""
        overrides = {"kubernetes": {"api": "https://k", "tokenfile": "t"}}
        self.assertEqual(
            self.configError(overrides),
            "kubernetes.tokenfile: unknown key (did you mean kubernetes.token_file?)",
        )

    def test_keyInDefaultedTable(self) -> None:
        """§3: a table whose keys all have defaults ([boot]) is checked."""
        self.assertEqual(
            self.configError({"boot": {"failure_rates": 2.0}}),
            "boot.failure_rates: unknown key (did you mean boot.failure_rate?)",
        )

    def test_topLevelTable_namedWithHint(self) -> None:
        """§3: an unknown table is refused by name: [bot] is not [boot]."""
        self.assertEqual(
            self.configError({"bot": {"failure_rate": 1.0}}),
            "bot: unknown table (did you mean boot?)",
        )

    def test_topLevelArrayOfTables(self) -> None:
        """§3: an unknown array of tables ([[anchors]]) is an unknown table."""
        path = writeConfig(Path(self.mktemp()))
        path.write_text(path.read_text() + '\n[[anchors]]\nname = "a"\n')
        self.assertEqual(self.loadError(path), "anchors: unknown table")

    def test_topLevelKey(self) -> None:
        """§3: a key outside any table is refused by its bare name."""
        path = writeConfig(Path(self.mktemp()))
        path.write_text("debug = true\n" + path.read_text())
        self.assertEqual(self.loadError(path), "debug: unknown key")

    def test_nestedTable(self) -> None:
        """§3: a sub-table of a known table is refused by its dotted name."""
        path = writeConfig(Path(self.mktemp()))
        path.write_text(path.read_text() + "\n[limits.boot]\nmax_connections = 5\n")
        self.assertEqual(self.loadError(path), "limits.boot: unknown table")

    def test_nestedTable_keysChecked(self) -> None:
        """
        §3: in a sub-table that is read, its unread keys are named by
        their full dotted path; what was read, present or defaulted, is known.
        """
        root = Table(
            {"a": {"b": {"count": 1, "coutn": 2}, "x": 1}, "y": {"z": 1}},
            "",
            Path("/"),
        )
        a = root.table("a")
        assert a is not None
        b = a.table("b")
        assert b is not None
        self.assertEqual(b.integer("count", 0, 0, 9), 1)
        b.integer("d", 0, 0, 9)
        a.integer("x", 0, 0, 9)
        root.table("y")
        errors = [str(e) for e in root.unknown()]
        self.assertEqual(
            errors,
            ["a.b.coutn: unknown key (did you mean a.b.count?)", "y.z: unknown key"],
        )
        self.assertRaises(ConfigError, checkUnknownKeys, root)

    def test_tableReadTwice_oneRecord(self) -> None:
        """§3: keys read through two lookups of one table are all known."""
        root = Table({"t": {"a": 1, "b": 2}}, "", Path("/"))
        first, second = root.table("t"), root.table("t")
        assert first is not None and second is not None
        first.integer("a", 0, 0, 9)
        second.integer("b", 0, 0, 9)
        checkUnknownKeys(root)

    def test_missingKey_hintsTypo(self) -> None:
        """
        §3: a required key reported missing names a present, unread
        key that looks like it, so the typo is found at once.
        """
        self.assertEqual(
            self.configError({"paths": {"vault": None, "vualt": "v"}}),
            "paths.vault: missing (found paths.vualt: a typo?)",
        )


class TopologyTests(SynchronousTestCase):
    def parse(self, **changes: Any) -> Any:
        doc = dict(TOPOLOGY)
        for k, v in changes.items():
            if v is None:
                doc.pop(k, None)
            else:
                doc[k] = v
        return parseTopology(json.dumps(doc).encode())

    def test_parse_valid(self) -> None:
        """[A1] SPORE_IP and SPORE_BOOTSTRAP_IP are read from the topology."""
        t = self.parse()
        self.assertEqual((t.spore_ip, t.spore_bootstrap_ip), ("10.20.0.5", "10.20.0.6"))
        self.assertEqual([a.name for a in t.anchors], ["anchor-a", "anchor-b"])

    def test_parse_missingOrInvalidAddresses(self) -> None:
        """[A1] Missing or invalid SPORE_IP/SPORE_BOOTSTRAP_IP stop start-up by key."""
        cases: dict[str, list[object]] = {
            "SPORE_IP": [None, "", "10.20.0", "::1", 5, "0.0.0.0", "224.0.0.1"],
            "SPORE_BOOTSTRAP_IP": [None, "host.example", "256.1.1.1"],
        }
        for key, values in cases.items():
            for value in values:
                e = self.assertRaises(ConfigError, self.parse, **{key: value})
                self.assertEqual(e.key, f"topology.{key}", value)

    def test_parse_enrollmentName(self) -> None:
        """The enrollment name must be a DNS name; it is lower-cased."""
        self.assertEqual(
            self.parse(enrollment_name="Enroll.LolWTF.ca.").enrollment_name,
            "enroll.lolwtf.ca",
        )
        for bad in ["", "localhost", "a..b", "-a.b", "a_b.c", "x" * 64 + ".ca"]:
            e = self.assertRaises(ConfigError, self.parse, enrollment_name=bad)
            self.assertEqual(e.key, "topology.enrollment_name", bad)

    def test_parse_notJSON(self) -> None:
        """[A1] A topology file that is not JSON is one clear error."""
        e = self.assertRaises(ConfigError, parseTopology, b"{nope")
        self.assertEqual(e.key, "topology")

    def test_parse_badAnchor(self) -> None:
        """A bad anchor entry names its index."""
        e = self.assertRaises(
            ConfigError, self.parse, anchors=[{"name": "a", "dns": "x"}]
        )
        self.assertEqual(e.key, "topology.anchors[0].dns")

    def test_loadSettings_badTopologyFile(self) -> None:
        """[A1] A bad topology file stops loading with site.topology.* keys."""
        directory = Path(self.mktemp())
        path = writeConfig(directory, topology={**TOPOLOGY, "SPORE_BOOTSTRAP_IP": "x"})
        e = self.assertRaises(ConfigError, loadSettings, path)
        self.assertEqual(e.key, "site.topology.SPORE_BOOTSTRAP_IP")
