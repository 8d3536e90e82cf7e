"""
C{fleetd-sim --config conf/fleetd.dev.toml --faults pxe-first} against
C{make run} (issue 27, item 10): a fleetd with the dev config's Tink
settings (on free ports and a temporary state, so that nothing here
meets a C{make run} of this machine), and the sim against it as the
README says to run it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import loadSettings
from fleetd.sim.daemon import (
    Fleetd,
    Started,
    devPKI,
    freePort,
    launchFleetd,
    writeConfig,
)
from fleetd.sim.tpm import RM_AVAILABLE
from tests.support import REPO, missingPeer
from tests.test_sim import runSim

DEV = REPO / "conf" / "fleetd.dev.toml"


class AgainstMakeRunTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")

    def test_devConfig_minRebootReadBySim(self) -> None:
        """The sim reads the dev config's C{tink.min_reboot} as fleetd
        does, and the dev config keeps it short (a simulated reboot)."""
        settings = loadSettings(DEV)
        self.assertEqual(Fleetd.fromConfig(DEV).minReboot, settings.tink.min_reboot)
        self.assertLessEqual(settings.tink.min_reboot, 10)

    def test_pxeFirst_againstDevTinkSettings(self) -> None:
        """[B2] A pxe-first node against a fleetd of C{--config} with the
        dev config's C{tink.min_reboot} comes back to HookOS late enough to
        count as a boot: C{planned}, journaled once, its alert firing (the
        fault's own check); the wait is said in one line."""
        minReboot = loadSettings(DEV).tink.min_reboot
        work = Path(tempfile.mkdtemp(dir=Path(self.mktemp()).parent))
        started = Started()
        self.addCleanup(started.stopAll)
        devPKI(work)
        config = writeConfig(work / "fleetd", freePort())
        text = config.read_text()
        own = re.sub(r"(?m)^min_reboot = .*$", f"min_reboot = {minReboot}", text)
        self.assertNotEqual(own, text)
        config.write_text(own)
        launchFleetd(work, config, started)
        code, document, stderr = runSim(
            "--config", str(config), "--nodes", "1", "--faults", "pxe-first"
        )
        self.assertEqual(code, 0, stderr[-3000:])
        (node,) = document["nodes"]
        self.assertEqual((node["fault"], node["state"]), ("pxe-first", "planned"))
        self.assertEqual(node["alerts"], ["FleetNodeBootedHookOSAfterInstall"])
        self.assertIn(f"back in HookOS {minReboot:g} s after the workflow", stderr)
