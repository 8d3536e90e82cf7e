"""The [tink] settings: upstream forms and limits (README reference)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, Settings, loadSettings
from fleetd.h2.upstream import UpstreamAddress
from tests.support import writeConfig


class TinkSettingsTests(SynchronousTestCase):
    def load(self, tink: dict[str, Any]) -> Settings:
        return loadSettings(writeConfig(Path(self.mktemp()), {"tink": tink}))

    def error(self, tink: dict[str, Any]) -> ConfigError:
        path = writeConfig(Path(self.mktemp()), {"tink": tink})
        e: ConfigError = self.assertRaises(ConfigError, loadSettings, path)
        return e

    def test_h2cUpstream_defaults(self) -> None:
        """tcp:HOST:PORT is h2c with prior knowledge; limits have defaults."""
        s = self.load({"upstream": "tcp:tink-server:42113"}).tink
        self.assertEqual(
            (s.upstream_tls, s.upstream_host, s.upstream_port),
            (False, "tink-server", 42113),
        )
        self.assertEqual((s.max_concurrent_streams, s.stream_timeout), (100, 300.0))

    def test_tlsUpstream_withCA(self) -> None:
        """tls:HOST:PORT with upstream_ca; IPv6 literals in brackets."""
        s = self.load({"upstream": "tls:[::1]:42113", "upstream_ca": "ca.pem"}).tink
        self.assertEqual((s.upstream_tls, s.upstream_host), (True, "::1"))
        self.assertEqual(s.upstream_ca is not None and s.upstream_ca.name, "ca.pem")

    def test_badUpstream_namesKey(self) -> None:
        """Anything else stops start-up naming tink.upstream."""
        for bad in ("tink-server:42113", "udp:h:1", "tcp:h", "tcp:h:99999", "tcp::1"):
            e = self.error({"upstream": bad})
            self.assertEqual(e.key, "tink.upstream", bad)

    def test_caWithoutTLS_refused(self) -> None:
        """upstream_ca makes sense only for a tls: upstream."""
        e = self.error({"upstream": "tcp:h:1", "upstream_ca": "ca.pem"})
        self.assertEqual(e.key, "tink.upstream_ca")

    def test_limits_checked(self) -> None:
        """Limits out of range name their key; unknown keys are refused."""
        e = self.error({"upstream": "tcp:h:1", "max_concurrent_streams": 0})
        self.assertEqual(e.key, "tink.max_concurrent_streams")
        e = self.error({"upstream": "tcp:h:1", "stream_timout": 5})
        self.assertEqual(e.key, "tink.stream_timout")
        self.assertIn("did you mean tink.stream_timeout", str(e))

    def test_abuseLimits_defaultsAndChecked(self) -> None:
        """The HTTP/2 abuse limits (issue 17): defaults, set, out of range
        naming their key."""
        s = self.load({"upstream": "tcp:h:1"}).tink
        self.assertEqual(
            (s.stream_budget, s.source_stream_rate, s.source_stream_burst),
            (32, 20.0, 100.0),
        )
        s = self.load(
            {
                "upstream": "tcp:h:1",
                "stream_budget": 8,
                "source_stream_rate": 500,
                "source_stream_burst": 1000,
            }
        ).tink
        self.assertEqual(
            (s.stream_budget, s.source_stream_rate, s.source_stream_burst),
            (8, 500.0, 1000.0),
        )
        for key in ("stream_budget", "source_stream_rate", "source_stream_burst"):
            e = self.error({"upstream": "tcp:h:1", key: 0})
            self.assertEqual(e.key, f"tink.{key}")

    def test_address_parse(self) -> None:
        """UpstreamAddress.parse: the forms the README documents."""
        self.assertEqual(
            UpstreamAddress.parse("tcp:127.0.0.1:42114"),
            UpstreamAddress(False, "127.0.0.1", 42114),
        )


class UpstreamCATests(SynchronousTestCase):
    def test_unreadableCA_namesKey(self) -> None:
        """A tink.upstream_ca that is missing or not PEM stops start-up
        naming the key, before anything listens."""
        from fleetd.prepare import checkUpstreamCA

        directory = Path(self.mktemp())
        s = loadSettings(
            writeConfig(
                directory, {"tink": {"upstream": "tls:h:1", "upstream_ca": "ca.pem"}}
            )
        )
        e = self.assertRaises(ConfigError, checkUpstreamCA, s)
        self.assertEqual(e.key, "tink.upstream_ca")
        (directory / "ca.pem").write_text("not a certificate")
        e = self.assertRaises(ConfigError, checkUpstreamCA, s)
        self.assertEqual(e.key, "tink.upstream_ca")
