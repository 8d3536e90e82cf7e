"""
C{fleetd-sim} (issue 21; docs/design.md, the rack simulator's faults) run
whole as a subprocess: a small rack against a fleetd the test started
(C{--config}), checked from fleetd's journal through the owner API, and a
rack on the sim's own fleetd; the JSON object's shape, and no process left
behind.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim.daemon import BIN, Started, freePort, startFleetd
from fleetd.sim.node import PHASES
from fleetd.sim.tpm import RM_AVAILABLE
from tests.support import missingPeer

STOPPED = re.compile(r"^stopped: (.*)$", re.M)
NODE_KEYS = {"name", "fault", "state", "reason", "phases", "alerts"}


def runSim(*argv: str) -> tuple[int, dict[str, Any], str]:
    """Run C{fleetd-sim --json ARGV}: exit code, stdout's object, stderr."""
    done = subprocess.run(
        [str(BIN / "fleetd-sim"), "--json", *argv],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    try:
        document = json.loads(done.stdout)
    except ValueError:
        document = {"stdout": done.stdout}
    return done.returncode, document, done.stderr


class SimTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")

    def assertRack(
        self, document: dict[str, Any], nodes: int, state: str, phases: list[str]
    ) -> None:
        """The object of docs/design.md ("The rack simulator's faults"),
        every node clean, in C{state}, timed in C{phases}."""
        self.assertEqual(set(document), {"nodes", "summary"}, document)
        self.assertEqual(len(document["nodes"]), nodes)
        for node in document["nodes"]:
            self.assertEqual(set(node), NODE_KEYS, node)
            self.assertIsNone(node["fault"])
            self.assertEqual(node["state"], state, node)
            self.assertIsNone(node["reason"])
            self.assertEqual(list(node["phases"]), phases, node)
            self.assertTrue(all(s >= 0 for s in node["phases"].values()))
            self.assertEqual(node["alerts"], [])
        summary = document["summary"]
        self.assertNotIn("disk", summary)  # only with --disk-encryption
        self.assertEqual(summary["nodes"], nodes)
        self.assertEqual(summary["as_expected"], nodes)
        self.assertEqual(summary["unexpected"], [])

    def assertAllStopped(self, stderr: str, expected: dict[str, int]) -> None:
        """The sim's last word names what it stopped; none of it runs."""
        (line,) = STOPPED.findall(stderr)
        stopped = {
            what: pids.split()
            for what, _, pids in (part.partition(" ") for part in line.split("; "))
        }
        self.assertEqual({w: len(p) for w, p in stopped.items()}, expected, line)
        for what, pids in stopped.items():
            for pid in pids:
                self.assertFalse(Path(f"/proc/{pid}").exists(), f"{what} {pid} left")

    def test_rack_oneDeliveryEach(self) -> None:
        """A rack of 3 against a running fleetd (C{--config}): each node is
        staged and fleetd's journal, read through the owner API, holds
        exactly one delivery per node, to the node's own loopback address."""
        work = Path(tempfile.mkdtemp(dir=Path(self.mktemp()).parent))
        started = Started()
        self.addCleanup(started.stopAll)
        fleetd = startFleetd(work, freePort(), started)
        code, document, stderr = runSim("--config", str(fleetd.config), "--nodes", "3")
        self.assertEqual(code, 0, stderr[-3000:])
        # No Kubernetes fake beside a fleetd the sim did not start: no kubelet.
        self.assertRack(document, 3, "staged", [p for p in PHASES if p != "kubelet"])
        self.assertIsNone(document["summary"]["rack_active_seconds"])
        self.assertAllStopped(stderr, {"dbus-daemon": 1, "swtpm": 3, "tpm2-abrmd": 3})
        for node in document["nodes"]:
            shown = subprocess.run(
                [str(BIN / "fleetctl"), "--config", str(fleetd.config), "--json",
                 "journal", "--device", node["name"]],
                capture_output=True, text=True, timeout=60, check=True,
            ).stdout  # fmt: skip
            entries = json.loads(shown)
            delivered = [e for e in entries if e["event"] == "run.delivered"]
            self.assertEqual(len(delivered), 1, entries)
            index = int(node["name"].split("-")[1])  # sim-NNN-tag
            self.assertEqual(delivered[0]["fields"]["peer"], f"127.0.1.{index}")
        self.assertSourcesPerNode((work / "fleetd.log").read_text(), 3)

    def assertSourcesPerNode(self, log: str, nodes: int) -> None:
        """
        fleetd saw each node at its own address, as its per-source limits
        count it: the agent's calls on the device listener (its access
        log) and the tink agent's connections to the Tink proxy (through
        the node's relay), each node's from 127.0.1.N and none from
        127.0.0.1 (there only fleetd's own TLS self-check connects).
        """
        agentCalls = ("/v1/attest/challenge", "/v1/attest/proof", "/v1/node/disks",
                      "/v1/node/plan")  # fmt: skip
        access = re.findall(r"http\.access (?:GET|POST) (\S+) \d+ (\S+)$", log, re.M)
        seen = {path: sorted(p for q, p in access if q == path) for path in agentCalls}
        addresses = [f"127.0.1.{index}" for index in range(1, nodes + 1)]
        self.assertEqual(seen, dict.fromkeys(agentCalls, addresses))
        connected = re.findall(r"tink\.connected (\S+)$", log, re.M)
        # fleetd's own TLS self-check (issue 27, item 2) connects from
        # 127.0.0.1 and sends nothing; each node from its own 127.0.1.N.
        polls = [source for source in connected if source != "127.0.0.1"]
        self.assertEqual(sorted(set(polls)), addresses, connected)

    def test_ownFleetd_active_stopsEverything(self) -> None:
        """[K2] [K4] Without C{--config} the sim starts its own fleetd, the
        tink-server stand-in and the Kubernetes fake; each node's kubelet
        CSR is approved by fleetd, which makes the device active (exit 0
        also says the sim found in fleetd's journal one delivery, one
        approval and the token's deletion per node); and it stops every
        process it started (fleetd, dbus-daemon, each swtpm and
        tpm2-abrmd)."""
        code, document, stderr = runSim("--nodes", "2", "--parallel", "2")
        self.assertEqual(code, 0, stderr[-3000:])
        self.assertRack(document, 2, "active", list(PHASES))
        self.assertGreater(document["summary"]["rack_active_seconds"], 0)
        self.assertAllStopped(
            stderr, {"fleetd": 1, "dbus-daemon": 1, "swtpm": 2, "tpm2-abrmd": 2}
        )
        (work,) = re.findall(r"\(state in (\S+)\)", stderr)
        self.assertFalse(Path(work).exists(), work)

    def test_sigterm_stopsEverything(self) -> None:
        """SIGTERM in the middle of a rack: exit 143, and every process
        the sim had started by then is stopped, its directory removed."""
        process = subprocess.Popen(
            [str(BIN / "fleetd-sim"), "--nodes", "2", "--parallel", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(process.kill)
        assert process.stderr is not None
        seen = []
        for line in process.stderr:
            seen.append(line)
            if "provision" in line:  # a TPM and fleetd run: stop it now
                process.send_signal(signal.SIGTERM)
                break
        rest = process.stderr.read()
        process.stderr.close()
        stderr = "".join(seen) + rest
        self.assertEqual(process.wait(60), 143, stderr[-3000:])
        self.assertIn("fleetd-sim: interrupted", stderr)
        (line,) = STOPPED.findall(stderr)
        self.assertIn("fleetd ", line)
        self.assertIn("swtpm ", line)
        for pid in (word for word in line.replace(";", " ").split() if word.isdigit()):
            self.assertFalse(Path(f"/proc/{pid}").exists(), f"{pid} left: {line}")
        (work,) = re.findall(r"\(state in (\S+)\)", stderr)
        self.assertFalse(Path(work).exists(), work)
