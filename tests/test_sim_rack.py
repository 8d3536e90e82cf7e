"""
One rack with every fault of the table and clean nodes beside them
(issue 21 item 4; docs/design.md, the sim): each node ends as its fault
says — its final state from fleetd, its refusal code, its alerts — and
the rack exits 0 only when all do (the checks of each fault read fleetd's
journal, metrics and alert rules). The racks of tests/test_sim_boot.py,
test_sim_trust.py and test_sim_kube.py check each fault's records in
detail; this one shows the faults compose in one rack, as an operator's
bad day would bring them. The rack's disks are encrypted with fleetd as
their KMS (C{--disk-encryption}, issue 30): each node's disk ends as its
fault says too (nothing sealed before an install, refused once retired,
unlocked otherwise), through a spore reboot included.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim import luks
from fleetd.sim.faults import FAULTS
from fleetd.sim.tpm import RM_AVAILABLE
from tests.support import missingPeer
from tests.test_sim import runSim

# fault: (final state, refusal code, alert fleetd raises), per the table
TABLE: dict[str, tuple[str, str | None, str | None]] = {
    "pxe-first": ("planned", None, "FleetNodeBootedHookOSAfterInstall"),
    "pxe-first-netboot": ("active", None, None),
    "power-loss-after-read": ("staged", None, "FleetInstallConfigRefetched"),
    "spore-reboot": ("planned", None, "FleetInstallConfigMissing"),
    "cloned-tpm": ("refused", "ek-binding-not-approved", None),
    "no-evidence": ("refused", "ek-binding-not-approved", None),
    "tpm12": ("refused", "tpm12-unsupported", None),
    "worker-g2": ("refused", "class-refused", None),
    "dup-disk-serial": ("refused", "duplicate-disk-serial", None),
    "no-disk-serial": ("refused", "disk-serial-missing", None),
    "wrong-node-csr": ("active", None, None),
    "retire": ("decommissioning", None, None),
    "workflow-deleted": ("planned", None, "FleetTinkerbellWorkflowLost"),
}

# fault: its disk's end when not unlocked (--disk-encryption); a refused
# node never reaches its install.
DISKS: dict[str, tuple[str, str | None]] = {
    **{f: ("none", None) for f, (state, _, _) in TABLE.items() if state == "refused"},
    "pxe-first": ("none", None),  # never boots its disk
    "power-loss-after-read": ("none", None),  # power lost before STATE
    "spore-reboot": ("none", None),  # its configuration lost: no install
    "workflow-deleted": ("none", None),  # nothing installed
    "retire": ("refused", "retired"),  # the next Unseal after retirement
}


class EveryFaultRackTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")
        if not luks.AVAILABLE:
            raise missingPeer("cryptsetup (Debian cryptsetup-bin) is not installed")

    def test_everyFault_oneRack_endsAsTheTableSays(self) -> None:
        self.assertEqual(set(TABLE), set(FAULTS))
        code, document, stderr = runSim(
            "--nodes", str(len(TABLE) + 2), "--parallel", "4",
            "--faults", ",".join(TABLE), "--disk-encryption",
        )  # fmt: skip
        self.assertEqual(code, 0, stderr[-3000:])
        nodes = document["nodes"]
        for node, fault in zip(nodes, [*TABLE, None, None], strict=True):
            self.assertEqual(node["fault"], fault)
            disk = (node["disk"]["state"], node["disk"]["reason"])
            if fault is None:
                self.assertEqual((node["state"], node["reason"]), ("active", None))
                self.assertEqual(disk, ("unlocked", None))
                continue
            state, reason, alert = TABLE[fault]
            self.assertEqual((node["state"], node["reason"]), (state, reason), node)
            self.assertEqual(node["alerts"], [] if alert is None else [alert], node)
            self.assertEqual(disk, DISKS.get(fault, ("unlocked", None)), node)
        self.assertEqual(document["summary"]["unexpected"], [])
