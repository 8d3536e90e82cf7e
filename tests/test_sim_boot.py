"""
C{fleetd-sim}'s boot faults (L{fleetd.sim.faults.boot}; docs/design.md,
the rack simulator's faults) in one rack on the sim's own fleetd, beside a
clean node: each node ends as its row says, with the alerts fleetd's
status shows; exit 0 also says each fault's check found in fleetd's
journal and in the alerts its rules raise on a scrape (promtool) what the
operations page names, and nothing delivered twice.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim.tpm import RM_AVAILABLE
from tests.support import missingPeer
from tests.test_sim import runSim

ROWS = {
    # fault: (final state, alerts fleetctl status shows)
    "pxe-first": ("planned", ["FleetNodeBootedHookOSAfterInstall"]),
    "pxe-first-netboot": ("active", []),
    "power-loss-after-read": ("staged", ["FleetInstallConfigRefetched"]),
    "spore-reboot": ("planned", ["FleetInstallConfigMissing"]),
    None: ("active", []),
}


class BootFaultsTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")

    def test_bootFaults_endAsTheTableSays(self) -> None:
        """[B2] [B3] [C2] [C3] [V3] [V4] One rack: pxe-first,
        pxe-first-netboot, power-loss-after-read, spore-reboot and a clean
        node, each ending as the fault table says; one fleetd left to
        stop (the one started again by the spore reboot)."""
        faults = ",".join(f for f in ROWS if f is not None)
        code, document, stderr = runSim(
            "--nodes", str(len(ROWS)), "--parallel", str(len(ROWS)),
            "--faults", faults,
        )  # fmt: skip
        self.assertEqual(code, 0, stderr[-3000:])
        seen = {}
        for node in document["nodes"]:
            self.assertIsNone(node["reason"], node)
            seen[node["fault"]] = (node["state"], sorted(node["alerts"]))
        self.assertEqual(seen, ROWS)
        self.assertEqual(document["summary"]["unexpected"], [])
        self.assertRegex(stderr, r"stopped: .*fleetd \d+;")
        self.assertNotRegex(stderr, r"stopped: .*fleetd \d+ \d+")
