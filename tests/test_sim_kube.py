"""
C{fleetd-sim}'s kube faults (L{fleetd.sim.faults.kube}; docs/design.md,
the rack simulator's faults; [K2] [R1]) and the device-flow fetch
(C{--fetch device-flow}, [F1] [F2]): one rack on the sim's own fleetd,
every node fetching through RFC 8628, with C{wrong-node-csr}, C{retire}
and a clean node; a second small rack against the NetBox fake
(C{--inventory netbox}); and the Talos-side polling schedule on its own.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim.command import parseArgs
from fleetd.sim.deviceflow import (
    BootEndpoint,
    DeviceFlowFailed,
    Grant,
    awaitToken,
)
from fleetd.sim.node import PHASES
from fleetd.sim.tpm import RM_AVAILABLE
from tests.support import missingPeer
from tests.test_sim import STOPPED, runSim


class KubeRackTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")

    def test_rack_kubeFaults_deviceFlow(self) -> None:
        """
        [K2] [R1] [F2] A rack of 3 fetching by device flow: the node that
        also files a CSR for another node's name still ends C{active}; the
        retired node ends C{decommissioning}; the clean node C{active}.
        Exit 0 says the sim found in fleetd and the Kubernetes fake what
        each fault must leave: for every node, one delivery after one
        device-flow approval and one token issued, its first certificate
        approved and its token deleted; the wrong CSR left pending as
        C{wrong-node} (journal, C{/metrics}), not approved in the fake;
        the retirement journaled with its Node deleted, the Node and the
        tokens gone from the fake (at a time scale of 10 the token's [K4]
        deletion comes 6 seconds after the approval, so the retirement
        normally finds it live and deletes it itself), and the renewal
        after it left pending as C{renewal-device-retired} (journal,
        C{/metrics}), not approved.
        """
        code, document, stderr = runSim(
            "--nodes", "3", "--parallel", "3", "--fetch", "device-flow",
            "--faults", "wrong-node-csr,retire", "--time-scale", "10",
        )  # fmt: skip
        self.assertEqual(code, 0, f"{document.get('summary')}\n{stderr[-2000:]}")
        ended = [
            (n["fault"], n["state"], n["reason"], n["alerts"])
            for n in document["nodes"]
        ]
        self.assertEqual(
            ended,
            [
                ("wrong-node-csr", "active", None, []),
                ("retire", "decommissioning", None, []),
                (None, "active", None, []),
            ],
        )
        for node in document["nodes"]:
            self.assertEqual(list(node["phases"]), list(PHASES), node)
        self.assertEqual(document["summary"]["unexpected"], [])
        (line,) = STOPPED.findall(stderr)
        self.assertIn("fleetd ", line)

    def test_rack_netbox(self) -> None:
        """
        C{--inventory netbox}: the sim's fleetd has the NetBox fake as its
        inventory; the sim enters each node in NetBox as an operator would
        (C{fleetctl device add} refuses there), and the rack ends as on the
        embedded inventory (code path): the clean node C{active}, the
        retired one C{decommissioning}. Exit 0 also says NetBox ended with
        the status fleetd reports for each node and the release of each
        delivered configuration (fleetd's outbox pushed them).
        """
        code, document, stderr = runSim(
            "--nodes", "2", "--parallel", "2", "--inventory", "netbox",
            "--faults", "retire", "--time-scale", "10",
        )  # fmt: skip
        self.assertEqual(code, 0, f"{document.get('summary')}\n{stderr[-2000:]}")
        ended = [(n["fault"], n["state"], n["reason"]) for n in document["nodes"]]
        self.assertEqual(
            ended, [("retire", "decommissioning", None), (None, "active", None)]
        )
        self.assertIn("NetBox fake on http://127.0.0.1:", stderr)


class _Boot:
    """A boot listener answering C{/token} from a script."""

    def __init__(self, answers: list[tuple[int, dict[str, Any]]]) -> None:
        self.answers = answers
        self.forms: list[dict[str, str]] = []

    def post(self, path: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        assert path == "/token"
        self.forms.append(form)
        return self.answers.pop(0)


class _Stop(threading.Event):
    """Records each wait instead of waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return self.is_set()


PENDING = (400, {"error": "authorization_pending"})
SLOW_DOWN = (400, {"error": "slow_down"})


class AwaitTokenTests(SynchronousTestCase):
    grant = Grant(deviceCode="dc", userCode="BCDF-GHJK", interval=5, expiresIn=600)

    def poll(self, answers: list[tuple[int, dict[str, Any]]], stop: _Stop) -> str:
        boot = _Boot(answers)
        token = awaitToken(cast(BootEndpoint, boot), self.grant, 10.0, stop)
        self.assertEqual(
            {f["grant_type"] for f in boot.forms},
            {"urn:ietf:params:oauth:grant-type:device_code"},
        )
        return token

    def test_slowDown_addsFiveSeconds_scaled(self) -> None:
        """x/oauth2's schedule: every interval, slow_down adding 5 seconds,
        authorization_pending keeping it; divided by the time scale."""
        stop = _Stop()
        answers = [PENDING, SLOW_DOWN, PENDING, SLOW_DOWN,
                   (200, {"token_type": "Bearer", "access_token": "t"})]  # fmt: skip
        self.assertEqual(self.poll(answers, stop), "t")
        self.assertEqual(stop.waits, [0.5, 0.5, 1.0, 1.0, 1.5])

    def test_otherError_orStop_ends(self) -> None:
        """An error RFC 8628 does not say to wait on ends the flow, and so
        does the owner's failed approval (stop)."""
        denied = (400, {"error": "access_denied"})
        with self.assertRaises(DeviceFlowFailed):
            self.poll([PENDING, denied], _Stop())
        stop = _Stop()
        stop.set()
        with self.assertRaises(DeviceFlowFailed):
            self.poll([], stop)


class FetchArgTests(SynchronousTestCase):
    def test_fetch_defaultCode_deviceFlow(self) -> None:
        self.assertEqual(parseArgs(["--nodes", "1"]).fetch, "code")
        argv = ["--nodes", "1", "--fetch", "device-flow"]
        self.assertEqual(parseArgs(argv).fetch, "device-flow")
        self.assertRaises(SystemExit, parseArgs, ["--nodes", "1", "--fetch", "x"])

    def test_kubeFaults_needOwnFleetd_butRetire(self) -> None:
        """C{wrong-node-csr} needs the sim's Kubernetes fake; C{retire}
        runs on any fleetd (without a cluster, only the retirement)."""
        argv = ["--nodes", "1", "--faults", "wrong-node-csr", "--config", "x.toml"]
        self.assertRaises(SystemExit, parseArgs, argv)
        argv = ["--nodes", "1", "--faults", "retire", "--config", "x.toml"]
        self.assertEqual(parseArgs(argv).faultNames, ["retire"])

    def test_inventory_netboxOnlyOnOwnFleetd(self) -> None:
        self.assertEqual(parseArgs(["--nodes", "1"]).inventory, "sqlite")
        argv = ["--nodes", "1", "--inventory", "netbox"]
        self.assertEqual(parseArgs(argv).inventory, "netbox")
        self.assertRaises(SystemExit, parseArgs, [*argv, "--config", "x.toml"])
