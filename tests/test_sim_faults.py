"""
C{fleetd-sim --faults} (docs/design.md, the rack simulator's faults): the
spec's parsing, and a fault's change to one node's path
(L{fleetd.sim.faults}).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim import faults
from fleetd.sim.command import parseArgs
from fleetd.sim.faults import FaultSpecError, parseFaults
from fleetd.sim.faults.model import Fault


def _same(node: object, steps: list[object]) -> list[object]:
    return steps


class ParseTests(SynchronousTestCase):
    def setUp(self) -> None:
        known = {
            "a": Fault("a", "refused", _same, reason="x"),  # type: ignore[arg-type]
            "own": Fault("own", "planned", _same, ownFleetd=True),  # type: ignore[arg-type]
        }
        self.patch(faults, "FAULTS", known)
        from fleetd.sim import args

        self.patch(args, "FAULTS", known)

    def test_namesAndCounts_onePerNode(self) -> None:
        self.assertEqual(parseFaults("a, own:2"), ["a", "own", "own"])
        self.assertEqual(parseFaults(None), [])
        self.assertEqual(parseFaults(""), [])

    def test_unknownOrBadCount_refused(self) -> None:
        for spec in ("b", "a:0", "a:x", "a:-1"):
            self.assertRaises(FaultSpecError, parseFaults, spec)

    def test_moreFaultsThanNodes_refused(self) -> None:
        self.assertRaises(SystemExit, parseArgs, ["--nodes", "1", "--faults", "a:2"])
        args = parseArgs(["--nodes", "3", "--faults", "a:2"])
        self.assertEqual(args.faultNames, ["a", "a"])

    def test_ownFleetdFault_refusedWithConfig(self) -> None:
        argv = ["--nodes", "2", "--faults", "own", "--config", "x.toml"]
        self.assertRaises(SystemExit, parseArgs, argv)
        self.assertEqual(parseArgs(argv[:4]).faultNames, ["own"])

    def test_expected_withAndWithoutCluster(self) -> None:
        fault = Fault("p", "active", _same, stateWithout="staged")  # type: ignore[arg-type]
        self.assertEqual((fault.expected(True), fault.expected(False)),
                         ("active", "staged"))  # fmt: skip
