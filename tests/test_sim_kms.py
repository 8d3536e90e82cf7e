"""
C{fleetd-sim --disk-encryption} (issue 30, item 8; docs/design.md, the
rack simulator): each node seals STATE and EPHEMERAL at install through
fleetd's kms listener and unseals them at a reboot, and the fault
C{retire} shows the node's next Unseal refused. One rack of 8 on the
sim's own fleetd (the acceptance's 7 unlocked, 1 refused), one small rack
against a fleetd the test started with C{[kms]} (C{--config}: the kms
endpoint read from its config, the retirement without a cluster), and
the parts on their own: the LUKS2 volumes as Talos keeps them, the
retries, the report. A plain run stays as it was: tests/test_sim.py's
racks check its object has no C{disk} (L{tests.test_sim.SimTests.assertRack}).
"""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import grpc
from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim import luks
from fleetd.sim.args import parseArgs
from fleetd.sim.daemon import BIN, Fleetd, Started, freePort, startFleetd, writeConfig
from fleetd.sim.faults import FAULTS
from fleetd.sim.node import PHASES, TIMED
from fleetd.sim.report import Outcome, summary, table
from fleetd.sim.tpm import RM_AVAILABLE
from tests.support import missingPeer
from tests.test_sim import runSim

REFUSED_RETIRED = {
    "state": "refused",
    "reason": "retired",
    "status": "PERMISSION_DENIED",
}
UNLOCKED = {"state": "unlocked", "reason": None, "status": None}


def needPeers() -> None:
    if not RM_AVAILABLE:
        raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")
    if not luks.AVAILABLE:
        raise missingPeer("cryptsetup (Debian cryptsetup-bin) is not installed")


@functools.cache
def acceptanceRack() -> tuple[int, dict[str, Any], str]:
    """C{fleetd-sim --nodes 8 --disk-encryption --faults retire:1}, once
    for the tests that read it."""
    return runSim(
        "--nodes", "8", "--parallel", "4", "--disk-encryption", "--faults", "retire:1"
    )  # fmt: skip


class DiskRackTests(SynchronousTestCase):
    """The acceptance's rack on the sim's own fleetd (with C{[kms]})."""

    def setUp(self) -> None:
        needPeers()
        self.code, self.document, self.stderr = acceptanceRack()

    def test_sevenUnlocked_retiredRefused(self) -> None:
        """
        [E1] [E3] The retired node ends C{decommissioning}, its next
        Unseal refused PERMISSION_DENIED with the reason C{retired}; the 7
        others C{active}, their volumes opened by what fleetd unsealed.
        Exit 0 also says fleetd's journal holds one key per node, the
        retired node's destroyed as C{retired} and its refusal journaled
        from its address, and no refusal of the others.
        """
        self.assertEqual(self.code, 0, f"{self.document}\n{self.stderr[-3000:]}")
        ended = [(n["fault"], n["state"], n["disk"]) for n in self.document["nodes"]]
        self.assertEqual(
            ended,
            [("retire", "decommissioning", REFUSED_RETIRED)]
            + [(None, "active", UNLOCKED)] * 7,
        )
        for node in self.document["nodes"]:
            self.assertEqual(list(node["phases"]), list(TIMED), node)

    def test_summary_saysSo(self) -> None:
        """The summary counts the disks' ends and the refusals' reasons,
        and times the seal and the unlock like every phase."""
        total = self.document["summary"]
        self.assertEqual(
            total["disk"],
            {"states": {"unlocked": 7, "refused": 1}, "refused": {"retired": 1}},
        )
        self.assertEqual((total["as_expected"], total["unexpected"]), (8, []))
        self.assertEqual(list(total["phases"]), list(TIMED))


class ConfigDiskRackTests(SynchronousTestCase):
    """Against a fleetd the sim did not start (C{--config})."""

    def setUp(self) -> None:
        needPeers()

    def test_configsKMS_retiredWithoutCluster_refused(self) -> None:
        """
        The kms endpoint comes from the config; C{retire} runs without a
        cluster (the retirement journaled, no Node to delete): the retired
        node's next Unseal is refused C{retired}, the clean node is
        C{staged} and unlocked.
        """
        work = Path(tempfile.mkdtemp(dir=Path(self.mktemp()).parent))
        started = Started()
        self.addCleanup(started.stopAll)
        fleetd = startFleetd(work, freePort(), started, kms=True)
        self.assertIsNotNone(fleetd.kms)
        code, document, stderr = runSim(
            "--config", str(fleetd.config), "--nodes", "2", "--disk-encryption",
            "--faults", "retire",
        )  # fmt: skip
        self.assertEqual(code, 0, f"{document}\n{stderr[-3000:]}")
        ended = [(n["fault"], n["state"], n["disk"]) for n in document["nodes"]]
        self.assertEqual(
            ended,
            [
                ("retire", "decommissioning", REFUSED_RETIRED),
                (None, "staged", UNLOCKED),
            ],
        )
        phases = [p for p in TIMED if p != "kubelet"]
        self.assertEqual(list(document["nodes"][1]["phases"]), phases)

    def test_configWithoutKMS_exit2OneLine(self) -> None:
        """A config without C{[kms]}: exit 2 before anything starts, one
        line naming the table, nothing on stdout."""
        config = writeConfig(Path(self.mktemp()), freePort())
        done = subprocess.run(
            [str(BIN / "fleetd-sim"), "--json",
             "--config", str(config), "--nodes", "1", "--disk-encryption"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertEqual(done.stdout, "")
        self.assertIn("--disk-encryption: ", done.stderr)
        self.assertIn("has no [kms] table", done.stderr)


class ConfigTests(SynchronousTestCase):
    def test_kmsListener_fromConfig(self) -> None:
        """The sim's own fleetd gets C{[kms]} and a kms listener with the
        flag only; a config with C{[kms]} and no C{listen.kms} is served
        on C{tcp:4050}."""
        plain = Fleetd.fromConfig(writeConfig(Path(self.mktemp()), 1))
        self.assertIsNone(plain.kms)
        path = writeConfig(Path(self.mktemp()), 1, kms=True)
        text = path.read_text()
        self.assertIn("[kms]", text)
        port = Fleetd.fromConfig(path).kms
        self.assertIn(f'kms = "tcp:{port}:interface=127.0.0.1"', text)
        path.write_text("\n".join(x for x in text.splitlines() if "kms = " not in x))
        self.assertEqual(Fleetd.fromConfig(path).kms, 4050)

    def test_flag_defaultOff(self) -> None:
        self.assertFalse(parseArgs(["--nodes", "1"]).disk_encryption)
        argv = ["--nodes", "1", "--disk-encryption"]
        self.assertTrue(parseArgs(argv).disk_encryption)

    def test_expectedDisk_perFault(self) -> None:
        """Refused before the install: nothing sealed; a node that never
        boots its disk: nothing sealed; retired: refused C{retired}; the
        rest unlocked."""
        ends = {name: fault.expectedDisk() for name, fault in FAULTS.items()}
        self.assertEqual(ends["retire"], ("refused", "retired"))
        for name in ("cloned-tpm", "tpm12", "pxe-first", "power-loss-after-read",
                     "spore-reboot", "workflow-deleted"):  # fmt: skip
            self.assertEqual(ends[name], ("none", None), name)
        for name in ("pxe-first-netboot", "wrong-node-csr"):
            self.assertEqual(ends[name], ("unlocked", None), name)


def _outcome(name: str, disk: luks.DiskState | None, **kw: Any) -> Outcome:
    phases = {p: 0.5 for p in (PHASES if disk is None else TIMED)}
    return Outcome(name, None, "active", None, phases, [], "active", None, disk,
                   None if disk is None else ("unlocked", None), **kw)  # fmt: skip


class ReportTests(SynchronousTestCase):
    def test_plain_noDiskAnywhere(self) -> None:
        """Without the flag: no C{disk} in the node's object or the
        summary, no disk column or line, the phases as before."""
        outcomes = [_outcome("a", None)]
        self.assertNotIn("disk", outcomes[0].asJSON())
        total = summary(outcomes, 1.0, None)
        self.assertNotIn("disk", total)
        self.assertEqual(list(total["phases"]), list(PHASES))
        out = io.StringIO()
        table(outcomes, total, out)
        head = out.getvalue().splitlines()[0].split()
        self.assertEqual(head, ["node", "state", *PHASES, "alerts", "reason"])
        self.assertNotIn("disks:", out.getvalue())

    def test_disk_columnAndLine_unexpectedMarked(self) -> None:
        """With it: a disk column, a line counting the ends, and a node
        refused where it should have unlocked is not as expected."""
        refused = luks.DiskState("refused", "retired", "PERMISSION_DENIED")
        outcomes = [_outcome("a", luks.DiskState("unlocked")), _outcome("b", refused)]
        self.assertFalse(outcomes[1].ok)
        total = summary(outcomes, 1.0, None)
        self.assertEqual(total["unexpected"], ["b"])
        out = io.StringIO()
        table(outcomes, total, out)
        text = out.getvalue()
        self.assertEqual(
            text.splitlines()[0].split()[-3:], ["disk", "alerts", "reason"]
        )
        self.assertIn("refused retired (expected unlocked)", text)
        self.assertIn("disks: 1 unlocked, 1 refused (refused: retired 1)", text)
        self.assertEqual(json.loads(json.dumps(outcomes[1].asJSON()))["disk"],
                         REFUSED_RETIRED)  # fmt: skip


class _Status(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class CallTests(SynchronousTestCase):
    def test_unavailable_retried_asTalos(self) -> None:
        """UNAVAILABLE (fleetd starting, busy, away) is tried again after
        the gap, up to TRIES; then the answer."""
        answers: list[Any] = [_Status(grpc.StatusCode.UNAVAILABLE, "starting: x")] * 2
        answers.append(b"bytes")
        waits: list[float] = []

        def method(uuid: str, data: bytes) -> bytes:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return bytes(answer)

        self.assertEqual(luks.called(method, "u", b"d", 0.5, waits.append), b"bytes")
        self.assertEqual(waits, [0.5, 0.5])

    def test_refusal_notRetried_reasonFromMessage(self) -> None:
        waits: list[float] = []

        def method(uuid: str, data: bytes) -> bytes:
            raise _Status(grpc.StatusCode.PERMISSION_DENIED, "retired: this node")

        with self.assertRaises(luks.KMSRefused) as caught:
            luks.called(method, "u", b"d", 0.5, waits.append)
        self.assertEqual((caught.exception.status, caught.exception.reason),
                         ("PERMISSION_DENIED", "retired"))  # fmt: skip
        self.assertEqual(waits, [])

    def test_unavailableToTheEnd_refusedWithoutReason(self) -> None:
        """Not fleetd's refusal (no reason code): the status only."""
        waits: list[float] = []

        def method(uuid: str, data: bytes) -> bytes:
            raise _Status(grpc.StatusCode.UNAVAILABLE, "failed to connect")

        with self.assertRaises(luks.KMSRefused) as caught:
            luks.called(method, "u", b"d", 1.0, waits.append)
        self.assertIsNone(caught.exception.reason)
        self.assertEqual(len(waits), luks.TRIES - 1)


class VolumeTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not luks.AVAILABLE:
            raise missingPeer("cryptsetup (Debian cryptsetup-bin) is not installed")

    def test_volume_keepsTheBlobAsTalos_opensWithItsBytesOnly(self) -> None:
        """
        A LUKS2 volume on a file, formatted with base64 of the 32 bytes;
        its header's token 0 is Talos's C{sideroKMS} token with the blob
        in base64 as C{sealedData}; the blob reads back; the bytes open
        it, other bytes do not.
        """
        volume = Path(self.mktemp())
        raw, sealed = os.urandom(32), os.urandom(70)
        luks.formatVolume(volume, raw, sealed)
        exported = subprocess.run(
            [luks.CRYPTSETUP, "token", "export", "--token-id", "0", str(volume)],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        token = json.loads(exported.stdout)
        self.assertEqual(token["type"], "sideroKMS")
        self.assertEqual(set(token["UserData"]), {"sealedData"})
        self.assertEqual(luks.sealedBlob(volume), sealed)
        self.assertTrue(luks.opens(volume, raw))
        self.assertFalse(luks.opens(volume, os.urandom(32)))
        self.assertLessEqual(volume.stat().st_size, luks.VOLUME_BYTES)
