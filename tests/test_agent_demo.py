"""
C{make agent-demo} (scripts/agent_demo.py, issue 19, item 7) run whole
with C{--start}: its own fleetd, swtpm, tpm2-abrmd and D-Bus, the node's
path to a verified META write; and everything it started stopped after,
when it succeeds and when a step fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests.support import REPO, missingPeer, writeConfig
from tests.swtpm import RM_AVAILABLE

SCRIPT = REPO / "scripts" / "agent_demo.py"
STARTED = re.compile(r"^  started (\S+) \(pid (\d+)\)$", re.M)
STOPPED = re.compile(r"^  stopped (\S+) \(pid (\d+)\)$", re.M)


def runDemo(*argv: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


class AgentDemoTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")

    def assertAllStopped(self, output: str) -> None:
        """Each process the demo started was stopped, is gone, and its
        workspace removed."""
        started = STARTED.findall(output)
        self.assertEqual(
            sorted(name for name, _ in started),
            ["dbus-daemon", "fleetd", "swtpm", "tpm2-abrmd"],
            output,
        )
        self.assertEqual(sorted(STOPPED.findall(output)), sorted(started), output)
        for name, pid in started:
            self.assertFalse(Path(f"/proc/{pid}").exists(), f"{name} {pid} left")
        (work,) = re.findall(r"^\$ W=(\S+)", output, re.M)
        self.assertFalse(Path(work).exists(), output)

    def test_start_verifiedMetaWrite(self) -> None:
        """The whole path ends with the plan's code read back from META
        0x0b, shown by its first characters only."""
        code, output = runDemo("--start")
        self.assertEqual(code, 0, output)
        self.assertRegex(output, r"\nMETA 0x0b verified: \S{6}…\n")
        for step in ("evidence add", "binding approve", " attest ", " disks ",
                     " plan --write-meta ", " meta read "):  # fmt: skip
            self.assertIn(step, output)
        self.assertNotRegex(output, r'"code": "[^"…]{7,}"')
        self.assertNotRegex(output, r'"0x0b": "[^"…]{7,}"')
        self.assertAllStopped(output)

    def test_stepRefused_stopsEverything(self) -> None:
        """A refused step (a worker-g2 cannot attest [T2]) ends the demo
        with exit 1 and one line, after stopping what it started."""
        code, output = runDemo("--start", "--class", "worker-g2")
        self.assertEqual(code, 1, output)
        self.assertIn("refused: class-refused", output)
        self.assertIn("agent-demo: failed: exit status 1 from the step above", output)
        self.assertNotIn("verified", output)
        self.assertAllStopped(output)

    def test_noFleetd_saysHowToStartIt(self) -> None:
        """Without --start and no fleetd answering: exit 2, how to start it."""
        config = writeConfig(
            Path(self.mktemp()), {"owner": {"server": "https://localhost:1"}}
        )
        code, output = runDemo("--config", str(config))
        self.assertEqual(code, 2, output)
        self.assertIn(
            "agent-demo: fleetd does not answer on https://localhost:1/healthz:"
            " start it with `make run` in another terminal (or run with --start)",
            output,
        )
        self.assertEqual(STARTED.findall(output), [])
