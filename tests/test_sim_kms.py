"""
C{fleetd-sim --disk-encryption} (issue 30, item 8; docs/design.md, the
rack simulator): each node seals STATE and EPHEMERAL at install through
fleetd's kms listener and unseals them at a reboot, and the fault
C{retire} shows the node's next Unseal refused. Each node reaches the KMS
its delivered configuration names (C{machine.systemDiskEncryption}), as
Talos does: the sim's own fleetd opts the rack's class in. One rack of 8
on the sim's own fleetd (the acceptance's 7 unlocked, 1 refused), one
small rack against a fleetd the test started with C{[kms]} and the class
opted in (C{--config}: the retirement without a cluster), one node
against a fleetd whose class does not opt in (its disk not encrypted,
not as expected), and the parts on their own: the endpoint read from a
configuration and the port a node then calls, the LUKS2 volumes as Talos
keeps them, the retries, the report. A plain run stays as it was: tests/test_sim.py's
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
from types import SimpleNamespace
from typing import Any

import grpc
import yaml
from twisted.internet import reactor
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.config import loadSettings
from fleetd.pki.dev import ensureDevPKI
from fleetd.runs.diskencryption import DiskEncryption
from fleetd.sim import luks
from fleetd.sim.args import parseArgs
from fleetd.sim.daemon import (
    BIN,
    ENROLLMENT,
    TEMPLATE,
    Fleetd,
    Started,
    freePort,
    startFleetd,
    writeConfig,
)
from fleetd.sim.diskconfig import UNENCRYPTED, ConfigProblem, Endpoint, kmsEndpoints
from fleetd.sim.faults import FAULTS
from fleetd.sim.node import PHASES, TIMED
from fleetd.sim.rack import StepFailed
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
        The class opts in: the kms endpoint comes from each node's
        configuration; C{retire} runs without a cluster (the retirement
        journaled, no Node to delete): the retired node's next Unseal is
        refused C{retired}, the clean node is C{staged} and unlocked.
        """
        work = Path(tempfile.mkdtemp(dir=Path(self.mktemp()).parent))
        started = Started()
        self.addCleanup(started.stopAll)
        fleetd = startFleetd(work, freePort(), started, kms=True)
        self.assertTrue(fleetd.kms)
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

    def test_classNotOptedIn_diskNotEncrypted_saysWhy(self) -> None:
        """
        fleetd has C{[kms]} but the nodes' class does not opt in: the
        delivered configuration has no C{systemDiskEncryption}, so Talos
        encrypts nothing; the node goes on (C{staged}), its disk ends
        C{none} where C{unlocked} was expected, and the report says why.
        Exit 1.
        """
        work = Path(tempfile.mkdtemp(dir=Path(self.mktemp()).parent))
        started = Started()
        self.addCleanup(started.stopAll)
        fleetd = startFleetd(work, freePort(), started, kms=True, encrypted=())
        self.assertEqual(loadSettings(fleetd.config).provision.per_class, {})
        done = subprocess.run(
            [str(BIN / "fleetd-sim"), "--config", str(fleetd.config),
             "--nodes", "1", "--disk-encryption"],
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr[-3000:])
        row = done.stdout.splitlines()[1]
        self.assertIn(" staged ", row)
        self.assertIn("none (expected unlocked)", row)
        self.assertTrue(row.endswith(UNENCRYPTED), row)
        self.assertIn("disks: 1 none\n", done.stdout)

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
    def test_kms_classOptedIn_withTheFlagOnly(self) -> None:
        """
        The sim's own fleetd gets C{[kms]}, a kms listener and the rack's
        class (C{worker}) opted in with the flag only, as fleetd reads its
        config; its template has the place for the section (a plain class
        loses the line). The sim reads the enrollment name from the
        topology: what a node's endpoint must name.
        """
        plain = writeConfig(Path(self.mktemp()), 1)
        self.assertFalse(Fleetd.fromConfig(plain).kms)
        self.assertEqual(loadSettings(plain).provision.diskEncryptionClasses(), ())
        path = writeConfig(Path(self.mktemp()), 1, kms=True)
        settings = loadSettings(path)
        self.assertEqual(settings.provision.diskEncryptionClasses(), ("worker",))
        self.assertIsNotNone(settings.kms)
        self.assertTrue(Fleetd.fromConfig(path).kms)
        self.assertEqual(Fleetd.fromConfig(path).enrollment, ENROLLMENT)
        self.assertIn("  systemDiskEncryption: FLEETD-KMS\n", TEMPLATE)
        none = writeConfig(Path(self.mktemp()), 1, kms=True, encrypted=())
        self.assertEqual(loadSettings(none).provision.diskEncryptionClasses(), ())

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


def _configuration(section: Any) -> bytes:
    """The sim's template as delivered, with C{section} as its
    C{machine.systemDiskEncryption} (L{None}: the line gone)."""
    docs = yaml.safe_load(TEMPLATE)
    docs["machine"].pop("systemDiskEncryption")
    if section is not None:
        docs["machine"]["systemDiskEncryption"] = section
    return yaml.safe_dump(docs).encode()


class EndpointTests(SynchronousTestCase):
    """What a node reads of its configuration (L{fleetd.sim.diskconfig})."""

    def test_renderedSection_endpointPerVolume(self) -> None:
        """The section fleetd renders for a class that opts in names, for
        STATE and EPHEMERAL, C{https://<enrollment name>:<kms port>}."""
        section = DiskEncryption(["worker"], ENROLLMENT, 4321).section()
        url = f"https://{ENROLLMENT}:4321"
        self.assertEqual(
            kmsEndpoints(_configuration(section), ENROLLMENT),
            {v: Endpoint(url, ENROLLMENT, 4321) for v in ("STATE", "EPHEMERAL")},
        )

    def test_eachVolume_itsOwnKey(self) -> None:
        """Each volume's key is read from its own partition."""
        section = DiskEncryption(["worker"], ENROLLMENT, 4321).section()
        section["ephemeral"]["keys"][0]["kms"]["endpoint"] = f"https://{ENROLLMENT}:99"
        found = kmsEndpoints(_configuration(section), ENROLLMENT)
        assert found is not None
        self.assertEqual((found["STATE"].port, found["EPHEMERAL"].port), (4321, 99))

    def test_noSection_none(self) -> None:
        self.assertIsNone(kmsEndpoints(_configuration(None), ENROLLMENT))

    def test_notTheEnrollmentEndpoint_problem(self) -> None:
        """Not C{https}, another name, no port, a path, or no kms key for
        a volume: one line naming the volume."""
        for url in ("http://enroll.lolwtf.ca:4050", "https://127.0.0.1:4050",
                    "https://enroll.lolwtf.ca", "https://enroll.lolwtf.ca:4050/x",
                    "https://enroll.lolwtf.ca:port"):  # fmt: skip
            section = DiskEncryption(["worker"], ENROLLMENT, 4050).section()
            section["state"]["keys"][0]["kms"]["endpoint"] = url
            with self.assertRaises(ConfigProblem, msg=url) as caught:
                kmsEndpoints(_configuration(section), ENROLLMENT)
            self.assertIn(f"STATE: machine.systemDiskEncryption.state: {url!r}",
                          str(caught.exception))  # fmt: skip
        section = DiskEncryption(["worker"], ENROLLMENT, 4050).section()
        section["ephemeral"]["keys"] = [{"slot": 0, "static": {"passphrase": "x"}}]
        with self.assertRaises(ConfigProblem) as caught:
            kmsEndpoints(_configuration(section), ENROLLMENT)
        self.assertEqual(
            str(caught.exception),
            "EPHEMERAL: machine.systemDiskEncryption.ephemeral has no kms key",
        )


class _HangUp(Protocol):
    def __init__(self, peers: list[str]) -> None:
        self.peers = peers

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.peers.append(str(getattr(self.transport.getPeer(), "host", "")))
        self.transport.loseConnection()


class _Listener(ServerFactory):
    """Records where each connection came from, and hangs up."""

    def __init__(self) -> None:
        self.peers: list[str] = []

    def buildProtocol(self, addr: Any) -> Protocol:
        return _HangUp(self.peers)


class EndpointUsedTests(TestCase):
    """The port a node calls is the one its configuration names."""

    def setUp(self) -> None:
        base = Path(self.mktemp())
        base.mkdir()
        self.directory = base / "node"
        self.directory.mkdir()
        pki = ensureDevPKI(base / "pki", ENROLLMENT)
        # Only what a disk reads of its rack: no kms port of fleetd's.
        fleetd = SimpleNamespace(pki=pki, enrollment=ENROLLMENT)
        self.rack = SimpleNamespace(clock=reactor, fleetd=fleetd, timeScale=1e4)

    def disk(self) -> luks.EncryptedDisk:
        return luks.EncryptedDisk(
            self.rack,  # type: ignore[arg-type]
            self.directory, "127.0.0.77", "uuid-1",
        )  # fmt: skip

    async def test_seal_callsTheConfiguredPort_fromItsAddress(self) -> None:
        """
        A listener on the configured port (not fleetd: it hangs up) gets
        the node's connections, from the node's own address; the seal
        then ends UNAVAILABLE, and the node's path with it.
        """
        factory = _Listener()
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        number: int = port.getHost().port  # type: ignore[attr-defined]
        section = DiskEncryption(["worker"], ENROLLMENT, number).section()
        disk = self.disk()
        disk.configured(_configuration(section))
        with self.assertRaises(StepFailed):
            await disk.seal()
        self.assertEqual((disk.state.state, disk.state.status),
                         ("refused", "UNAVAILABLE"))  # fmt: skip
        self.assertTrue(factory.peers)
        self.assertEqual(set(factory.peers), {"127.0.0.77"})

    async def test_noSection_plainVolumes_pathGoesOn(self) -> None:
        """No section: nothing sealed or asked, no step fails; the disk
        ends C{none} with the reason the report gives."""
        disk = self.disk()
        disk.configured(_configuration(None))
        await disk.seal()
        await disk.unlock()
        self.assertEqual(disk.state, luks.DiskState("none", error=UNENCRYPTED))
        self.assertEqual(list(self.directory.iterdir()), [])

    async def test_badEndpoint_sealFails(self) -> None:
        """A section whose endpoint is not the enrollment name's: the
        seal fails (Talos cannot make STATE) with the line."""
        section = DiskEncryption(["worker"], "elsewhere.example", 4050).section()
        disk = self.disk()
        disk.configured(_configuration(section))
        with self.assertRaises(StepFailed):
            await disk.seal()
        self.assertEqual(disk.state.state, "failed")
        self.assertIn("is not https://enroll.lolwtf.ca:PORT", str(disk.state.error))
