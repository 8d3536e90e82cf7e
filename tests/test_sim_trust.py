"""
The trust faults of C{fleetd-sim} (docs/design.md, the rack simulator's
faults; [T1] [T2] [T3] [D1]) in one rack against a fleetd the test
started: each fault node ends C{refused} with its reason code, the clean
node is staged, the rack exits 0 (the sim's own checks held), and fleetd's
journal and metrics, read here too, hold each refusal.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim.daemon import BIN, Fleetd, Started, freePort, startFleetd
from fleetd.sim.faults.trust import scrape
from fleetd.sim.tpm import RM_AVAILABLE
from tests.support import missingPeer
from tests.test_sim import NODE_KEYS, STOPPED, runSim

# Each fault, the code fleetd refuses its node with, and the journal
# event that records the refusal.
REFUSALS = {
    "cloned-tpm": ("ek-binding-not-approved", "attest.refused"),
    "no-evidence": ("ek-binding-not-approved", "attest.refused"),
    "tpm12": ("tpm12-unsupported", "attest.refused"),
    "worker-g2": ("class-refused", "attest.refused"),
    "dup-disk-serial": ("duplicate-disk-serial", "disks.refused"),
    "no-disk-serial": ("disk-serial-missing", "disks.refused"),
}


def fleetctl(fleetd: Fleetd, *args: str) -> Any:
    shown = subprocess.run(
        [str(BIN / "fleetctl"), "--config", str(fleetd.config), "--json", *args],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return json.loads(shown)


def attestResults(fleetd: Fleetd) -> dict[str, float]:
    """C{fleetd_attest_results_total} by result, from fleetd's /metrics."""
    counts = {}
    for line in scrape(fleetd).splitlines():
        if line.startswith('fleetd_attest_results_total{result="'):
            labels, _, value = line.partition("} ")
            counts[labels.split('"')[1]] = float(value)
    return counts


class TrustFaultsTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")

    def test_rack_eachRefusedWithItsReason(self) -> None:
        """
        [T1] [T2] [T3] [D1] Six fault nodes and a clean one: each fault
        node is refused with its table's code, the clean node staged; the
        journal holds each refusal (under the device, or, when fleetd
        cannot tie it to one, by the serial the node reported), the
        clone's conflict suspended the original machine's binding, and
        the attestation counter counts each refusal and each acceptance.
        """
        work = Path(tempfile.mkdtemp(dir=Path(self.mktemp()).parent))
        started = Started()
        self.addCleanup(started.stopAll)
        fleetd = startFleetd(work, freePort(), started)
        faults = list(REFUSALS)
        code, document, stderr = runSim(
            "--config", str(fleetd.config), "--nodes", "7", "--parallel", "4",
            "--faults", ",".join(faults),
        )  # fmt: skip
        self.assertEqual(code, 0, stderr[-3000:])
        nodes = document["nodes"]
        self.assertEqual([n["fault"] for n in nodes], [*faults, None])
        for node in nodes:
            self.assertEqual(set(node), NODE_KEYS, node)
            self.assertEqual(node["alerts"], [], node)
            if node["fault"] is None:
                self.assertEqual((node["state"], node["reason"]), ("staged", None))
            else:
                reason = REFUSALS[node["fault"]][0]
                self.assertEqual((node["state"], node["reason"]), ("refused", reason))
        self.assertEqual(document["summary"]["unexpected"], [])
        (line,) = STOPPED.findall(stderr)
        stopped = dict(part.split(" ", 1) for part in line.split("; "))
        self.assertEqual(
            {what: len(pids.split()) for what, pids in stopped.items()},
            {"dbus-daemon": 1, "swtpm": 7, "tpm2-abrmd": 6},  # tpm12: no abrmd
        )
        for pid in " ".join(stopped.values()).split():
            self.assertFalse(Path(f"/proc/{pid}").exists(), line)

        entries = fleetctl(fleetd, "journal")
        for node in nodes[:-1]:
            reason, event = REFUSALS[node["fault"]]
            serial = fleetctl(fleetd, "status", node["name"])["device"]["serial"]
            ours = [
                e for e in entries
                if e["event"] == event and e["fields"]["reason"] == reason
                and (e["device"] == node["name"]
                     or e["fields"].get("reported_serial") == serial)
            ]  # fmt: skip
            self.assertEqual(len(ours), 1, (node, entries))
        # The clone's receiving scan named the original machine's EK.
        states = [b["state"] for b in fleetctl(fleetd, "binding", "list")]
        self.assertEqual(sorted(states), ["approved"] * 4 + ["suspended"], states)
        results = attestResults(fleetd)
        self.assertEqual(results["ek-binding-not-approved"], 2)
        self.assertEqual(results["tpm12-unsupported"], 1)
        self.assertEqual(results["class-refused"], 1)
        self.assertEqual(results["accepted"], 3)  # the disk faults' and the clean
