"""
C{fleetd-sim} on an install without its C{sim} extra (grpcio, setup.cfg)
says in one line which extra to install (issue 27, item 10), rather than
a traceback from deep in an import.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.support import REPO

# What the console script runs, on an interpreter where grpc cannot be
# imported (None in sys.modules: "import grpc" raises ModuleNotFoundError,
# as on an install without the extra).
WITHOUT_GRPC = (
    "import sys; sys.modules['grpc'] = None; "
    "from fleetd.sim.main import main; sys.exit(main())"
)


def simWithoutGrpc(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_GRPC, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )


class MissingExtraTests(SynchronousTestCase):
    def test_withoutGrpc_oneLineNamingTheExtra(self) -> None:
        """Exit 2, nothing on stdout (C{--json}'s contract), and one line
        on stderr naming the C{sim} extra and how to install it."""
        done = simWithoutGrpc("--json", "--nodes", "1")
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertEqual(done.stdout, "")
        lines = done.stderr.splitlines()
        self.assertEqual(len(lines), 1, done.stderr)
        self.assertTrue(lines[0].startswith("fleetd-sim: "), lines[0])
        self.assertIn("pip install 'fleetd[sim]'", lines[0])
        self.assertIn("grpcio", lines[0])

    def test_extraInSetupCfg_isTheOneNamed(self) -> None:
        """The extra the line names is the one setup.cfg declares with
        grpcio, so the advice installs what is missing."""
        from fleetd.sim.main import EXTRA

        setup = configparser.ConfigParser()
        setup.read(REPO / "setup.cfg")
        requirements = setup["options.extras_require"][EXTRA].split()
        self.assertEqual([r.split(">")[0] for r in requirements], ["grpcio"])
