"""
C{fleetd-agent plan --target-link PATH}: the plan's target disk, found in
sysfs by its serial [D1], linked for the Template's next actions
(docs/enrollment.md).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.agent import attest
from fleetd.agent.main import main
from fleetd.agent.target import TargetError, disksWithSerial, linkTarget

PLAN = {"target_disk_serial": "S1", "meta_0x0b": "CODE", "image": "installer"}


def stubSysfs(root: Path, disks: dict[str, str | None]) -> Path:
    """C{root}/block/NAME for each disk: a C{device} link and its serial."""
    for name, serial in disks.items():
        device = root / "block" / name / "device"
        device.mkdir(parents=True)
        if serial is not None:
            (device / "serial").write_text(serial + "\n")
    return root


class LinkTargetTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.root = Path(self.mktemp())
        self.link = self.root / "state" / "target-disk"

    def test_oneDisk_linked(self) -> None:
        """The disk reporting the serial (any case) is linked by its /dev node."""
        stubSysfs(self.root / "sys", {"sda": "s1", "nvme0n1": "N2"})
        device = linkTarget(PLAN, self.link, self.root / "sys")
        self.assertEqual((device, os.readlink(self.link)), ("/dev/sda", "/dev/sda"))

    def test_earlierLink_replaced(self) -> None:
        """A link from an earlier run is replaced, not refused."""
        stubSysfs(self.root / "sys", {"sdb": "S1"})
        self.link.parent.mkdir(parents=True)
        os.symlink("/dev/sda", self.link)
        linkTarget(PLAN, self.link, self.root / "sys")
        self.assertEqual(os.readlink(self.link), "/dev/sdb")

    def test_noDiskOrTwo_refused(self) -> None:
        """No disk with the serial, or two: nothing linked, one line."""
        cases: list[tuple[dict[str, str | None], str]] = [
            ({"sda": "OTHER", "sdb": None}, "0 disks report"),
            ({"sda": "S1", "sdb": "S1"}, "2 disks report the plan's target disk"
             " serial S1 (sda, sdb)"),
        ]  # fmt: skip
        for disks, line in cases:
            root = stubSysfs(Path(self.mktemp()), disks)
            with self.assertRaises(TargetError) as caught:
                linkTarget(PLAN, self.link, root)
            self.assertIn(f"target-disk-absent: {line}", str(caught.exception))
            self.assertFalse(self.link.is_symlink())

    def test_notAWholeDisk_ignored(self) -> None:
        """A block device without a device link (loop, dm) never counts."""
        root = stubSysfs(self.root / "sys", {"sda": "S1"})
        (root / "block" / "loop0").mkdir()
        (root / "block" / "loop0" / "serial").write_text("S1\n")
        self.assertEqual(disksWithSerial(root, "S1"), ["sda"])

    def test_noCodeOrNoTarget_refused(self) -> None:
        """No ready run (no code) or no target disk: nothing is linked."""
        root = stubSysfs(self.root / "sys", {"sda": "S1"})
        for plan, line in [
            ({**PLAN, "meta_0x0b": None}, "meta-code-missing"),
            ({**PLAN, "target_disk_serial": None}, "target-disk-absent"),
        ]:
            with self.assertRaises(TargetError) as caught:
                linkTarget(plan, self.link, root)
            self.assertTrue(str(caught.exception).startswith(line))
        self.assertFalse(self.link.is_symlink())


class PlanCommandTests(SynchronousTestCase):
    """The flag through fleetd-agent's own command line."""

    def planWith(self, plan: dict[str, Any], *extra: str) -> tuple[int, str, str]:
        self.patch(attest, "ldevidTransport", lambda args: None)
        self.patch(
            attest, "call", lambda server, path, via, body=None, source=None: dict(plan)
        )
        root = stubSysfs(Path(self.mktemp()), {"sda": "S1"})
        self.link = root / "state" / "target-disk"
        out, err = io.StringIO(), io.StringIO()
        status = main(
            ["--server", "https://enroll.example:8444", *extra, "plan",
             f"--target-link={self.link}", f"--sysfs-root={root}"],
            err=err, out=out,
        )  # fmt: skip
        return status, out.getvalue(), err.getvalue()

    def test_plan_printsTheDevice(self) -> None:
        """The plan's lines, then the device the link names."""
        status, out, err = self.planWith(PLAN)
        self.assertEqual((status, err), (0, ""))
        self.assertIn("target disk device: /dev/sda\n", out)
        self.assertEqual(os.readlink(self.link), "/dev/sda")

    def test_planJSON_carriesTheDevice(self) -> None:
        status, out, _err = self.planWith(PLAN, "--json")
        self.assertEqual((status, json.loads(out)["target_device"]), (0, "/dev/sda"))

    def test_noReadyRun_exit1OneLine(self) -> None:
        """The workflow stops at plan: image2disk would have no disk."""
        status, out, err = self.planWith({**PLAN, "meta_0x0b": None})
        self.assertEqual((status, out), (1, ""))
        self.assertRegex(err, r"^fleetd-agent: plan: meta-code-missing: [^\n]*\n$")
