"""
L{fleetd.sim.alerts}: a scrape of fleetd's C{/metrics} (here a fake one)
held as a C{promtool test rules} input against C{conf/alerts.yml}, and
the alerts promtool says fire.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import TestCase

from fleetd.sim.alerts import RULES, AlertsError, Firing, firing, ruleSet

SCRAPE = """\
# HELP fleetd_install_config_refetched 1 while a node asks again
# TYPE fleetd_install_config_refetched gauge
fleetd_install_config_refetched{device="w1"} 1.0
fleetd_install_config_refetched{device="w4"} 0.0
# HELP fleetd_install_config_missing 1 while a node asks for a lost configuration
# TYPE fleetd_install_config_missing gauge
fleetd_install_config_missing{device="w2"} 0.0
# HELP fleetd_node_booted_hookos_after_install 1 while a node is back in HookOS
# TYPE fleetd_node_booted_hookos_after_install gauge
fleetd_node_booted_hookos_after_install{device="w\\"3"} 1.0
# HELP fleetd_listener_open_connections open connections
# TYPE fleetd_listener_open_connections gauge
fleetd_listener_open_connections{listener="boot"} 95.0
fleetd_listener_open_connections{listener="device"} 3.0
# HELP fleetd_listener_max_connections the limit
# TYPE fleetd_listener_max_connections gauge
fleetd_listener_max_connections{listener="boot"} 100.0
fleetd_listener_max_connections{listener="device"} 100.0
# HELP fleetd_journal_verified_timestamp_seconds last verification
# TYPE fleetd_journal_verified_timestamp_seconds gauge
fleetd_journal_verified_timestamp_seconds 1.7333270005e+09
# HELP fleetd_attest_results_total attestations
# TYPE fleetd_attest_results_total counter
fleetd_attest_results_total{result="ok"} 12.0
# HELP fleetd_odd_seconds not a number
# TYPE fleetd_odd_seconds gauge
fleetd_odd_seconds NaN
"""


def names(found: list[Firing]) -> set[tuple[str, str | None]]:
    return {(f.name, f.device) for f in found}


class FiringTests(TestCase):
    def test_scrapedSample_alertsOfTheRules(self) -> None:
        """The gauges at 1 fire their alerts for their device (a quoted
        name read back as it is), the listener above 90% fires only once
        held its C{for: 5m}; a series at 0 and a counter fire nothing."""
        found = firing(SCRAPE, instance="localhost:8446")
        self.assertEqual(
            names(found),
            {
                ("FleetInstallConfigRefetched", "w1"),
                ("FleetNodeBootedHookOSAfterInstall", 'w"3'),
                ("FleetdListenerSaturated", None),
            },
        )
        for f in found:
            self.assertEqual(dict(f.labels)["instance"], "localhost:8446")
        (saturated,) = [f for f in found if f.name == "FleetdListenerSaturated"]
        self.assertEqual(dict(saturated.labels)["listener"], "boot")

    def test_quietScrape_nothing(self) -> None:
        quiet = SCRAPE.replace("} 1.0", "} 0.0").replace("} 95.0", "} 5.0")
        self.assertEqual(firing(quiet), [])

    def test_longestFor_held(self) -> None:
        """A rule with a long C{for:} fires: the series is held that long
        (and one evaluation more)."""
        rules = Path(self.mktemp())
        rules.write_text(
            "groups:\n  - name: g\n    rules:\n"
            "      - alert: Slow\n        expr: slow_thing == 1\n        for: 1h30m\n"
            "      - alert: Quick\n        expr: slow_thing == 1\n"
        )
        self.assertEqual(ruleSet(rules), (["Slow", "Quick"], 91))
        found = firing("# TYPE slow_thing gauge\nslow_thing 1\n", rules=rules)
        self.assertEqual(names(found), {("Slow", None), ("Quick", None)})

    def test_brokenRules_error(self) -> None:
        """promtool failing for another reason than alerts is an error, not
        'nothing fires'."""
        rules = Path(self.mktemp())
        rules.write_text(
            "groups:\n  - name: g\n    rules:\n"
            "      - alert: Broken\n        expr: sum(\n"
        )
        with self.assertRaises(AlertsError):
            firing(SCRAPE, rules=rules)

    def test_shippedRules_found(self) -> None:
        self.assertTrue(RULES.is_file())
        alertNames, minutes = ruleSet(RULES)
        self.assertIn("FleetInstallConfigMissing", alertNames)
        self.assertEqual(minutes, 11)  # the longest for: is 10m
