"""
Disk identity [D1]: the rules, the stored reports and the plan lookup's
contract, C{POST /v1/node/disks}, and C{fleetd-agent disks}.
"""

from __future__ import annotations

import io
import json
import sqlite3
import ssl
from pathlib import Path
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.agent import main as agent
from fleetd.device.disks import NodeDisksResource
from fleetd.device.resource import deviceRoot
from fleetd.nodes import NodeIdentity
from fleetd.store.db import StoreError
from fleetd.trust.disk_report import Disk, DiskReportError, parseDiskReport
from fleetd.trust.disks import (
    MIN_TARGET_BYTES,
    choose,
)
from fleetd.web.resources import Router
from tests.daemonsupport import DaemonTestMixin
from tests.disksupport import GB, W1, W2, DiskFleet, d
from tests.faultsupport import FAULTS, Faults


class DiskRuleTests(SynchronousTestCase):
    """[D1] What a report must hold before fleetd names a target disk."""

    def setUp(self) -> None:
        self.f = DiskFleet(self)

    def test_clean_smallestNonRemovable_byItsSerial(self) -> None:
        """[D1] The target is the smallest fixed disk big enough, named by serial."""
        verdict = self.f.report(
            W1,
            d("sda", "BIG", 4000 * GB),
            d("nvme0n1", "BOOT", 240 * GB),
            d("sdb", "TINY", 1 * GB),
            d("sdc", "USB", 64 * GB, removable=True),
        )
        self.assertIsNone(verdict.code)
        self.assertEqual(verdict.target.serial, "BOOT")
        self.assertEqual(self.f.target("w1"), "BOOT")
        event, device, fields = self.f.entries()[-1]
        self.assertEqual((event, device, fields["target"]), ("disks.reported", "w1",
                         "BOOT"))  # fmt: skip

    def test_missingSerial_refused(self) -> None:
        """[D1] A fixed disk without a sysfs serial: disk-serial-missing, journaled."""
        verdict = self.f.report(W1, d("sda", "S1"), d("sdb", None))
        self.assertEqual(verdict.code, "disk-serial-missing")
        self.assertIn("sdb", verdict.reason)
        self.assertIsNone(self.f.target("w1"))
        self.assertTrue(self.f.refusal("w1").startswith("disk-serial-missing: "))
        event, _, fields = self.f.entries()[-1]
        self.assertEqual((event, fields["reason"]), ("disks.refused",
                         "disk-serial-missing"))  # fmt: skip

    def test_removableWithoutSerial_ignored(self) -> None:
        """A removable disk without a serial (virtual media) is never the target."""
        verdict = self.f.report(W1, d("sda", "S1"), d("sdb", None, removable=True))
        self.assertEqual(verdict.target.serial, "S1")

    def test_duplicateWithinMachine_refused(self) -> None:
        """[D1] Two disks of one machine with one serial (any case) are refused."""
        verdict = self.f.report(W1, d("sda", "dup-1"), d("sdb", "DUP-1"))
        self.assertEqual(verdict.code, "duplicate-disk-serial")
        self.assertIn("sda and sdb", verdict.reason)
        self.assertIsNone(self.f.target("w1"))

    def test_duplicateAcrossFleet_laterRefused(self) -> None:
        """
        [D1] A serial another device reported first is refused; the first
        device keeps its target (more in L{tests.test_disks_claims}).
        """
        self.f.report(W1, d("sda", "CLONE"))
        self.assertEqual(self.f.target("w1"), "CLONE")
        verdict = self.f.report(W2, d("sda", "clone"))
        self.assertEqual(verdict.code, "duplicate-disk-serial")
        self.assertIn("reported first by another device", verdict.reason)
        self.assertEqual(self.f.target("w1"), "CLONE")
        # w2's next report (the clone gone) replaces its earlier one.
        self.f.report(W2, d("sda", "OWN"))
        self.assertEqual((self.f.target("w1"), self.f.target("w2")), ("CLONE", "OWN"))

    def test_ownEarlierReport_isNoDuplicate(self) -> None:
        """A device reporting the same disks again is not its own duplicate."""
        self.f.report(W1, d("sda", "S1"))
        self.assertIsNone(self.f.report(W1, d("sda", "S1")).code)

    def test_noTarget(self) -> None:
        """Only small or removable disks: no-target-disk."""
        verdict = self.f.report(
            W1, d("sda", "S", 1 * GB), d("sdb", "U", removable=True)
        )
        self.assertEqual(verdict.code, "no-target-disk")

    def test_notReported(self) -> None:
        """Before any report the plan lookup gets disks-not-reported."""
        self.assertIsNone(self.f.target("w9"))
        self.assertTrue(self.f.refusal("w9").startswith("disks-not-reported: "))

    def test_choose_tiesByName(self) -> None:
        """Equal sizes pick the first name, so the choice is stable."""
        same = MIN_TARGET_BYTES
        chosen = choose([d("sdb", "B", same), d("sda", "A", same)])
        self.assertEqual(chosen, d("sda", "A", same))


class DiskFaultTests(SynchronousTestCase):
    """[J1] A report that cannot be journaled changes nothing."""

    def test_faults_previousReportStays(self) -> None:
        """[J1] Journal or database failing: the old report and target remain."""
        f = DiskFleet(self)
        f.report(W1, d("sda", "OLD"))
        faults = Faults(f.fleet)
        for kind in FAULTS:
            faults.inject(kind)
            coroutine = f.service.report(W1, [d("sda", "NEW")])
            failure = self.failureResultOf(
                Deferred.fromCoroutine(coroutine), StoreError, sqlite3.OperationalError
            )
            self.assertEqual(len(str(failure.value).splitlines()), 1)
            faults.clear()
            self.assertEqual(f.target("w1"), "OLD")
            self.assertEqual([e for e, _, _ in f.entries()], ["disks.reported"])


class ForgetTests(SynchronousTestCase):
    """Dropping a gone machine's report, journaled [D1] [J1]."""

    def setUp(self) -> None:
        self.f = DiskFleet(self)

    def forget(self, device: str, reason: str = "retired") -> Deferred[Any]:
        coroutine = self.f.service.forget(device, actor="owner:jane", reason=reason)
        return Deferred.fromCoroutine(coroutine)

    def test_forget_clearsDuplicate(self) -> None:
        """[D1] A disk moved from a retired machine counts once its report is gone."""
        self.f.report(W1, d("sda", "MOVED"))
        self.assertEqual(self.f.report(W2, d("sda", "MOVED")).code,
                         "duplicate-disk-serial")  # fmt: skip
        old = self.successResultOf(self.forget("w1"))
        self.assertEqual(old.target, "MOVED")
        self.assertIsNone(self.f.report(W2, d("sda", "MOVED")).code)
        self.assertTrue(self.f.refusal("w1").startswith("disks-not-reported"))
        forgotten = [e for e in self.f.entries() if e[0] == "disks.forgotten"]
        self.assertEqual(forgotten[0][1:], ("w1", {"disks": 1, "target": "MOVED",
                         "reason": "retired"}))  # fmt: skip

    def test_forget_refusals(self) -> None:
        """Unknown reports and missing reasons are refused; nothing changes."""
        from fleetd.trust.model import TrustError

        error = self.failureResultOf(self.forget("w1"), TrustError).value
        self.assertEqual(error.kind, "not-found")
        self.f.report(W1, d("sda", "S"))
        self.failureResultOf(self.forget("w1", " "), TrustError)
        self.assertEqual(self.f.target("w1"), "S")

    def test_forget_faults_reportStays(self) -> None:
        """[J1] A forget that cannot be journaled leaves the report."""
        self.f.report(W1, d("sda", "S"))
        faults = Faults(self.f.fleet)
        for kind in FAULTS:
            faults.inject(kind)
            self.failureResultOf(
                self.forget("w1"), StoreError, sqlite3.OperationalError
            )
            faults.clear()
            self.assertEqual(self.f.target("w1"), "S")

    def test_forget_overAdminAPI(self) -> None:
        """POST /v1/admin/disks/NAME/forget: 200, then 404 one line."""
        from fleetd.admin.trust import DisksAdminResource
        from fleetd.web.resources import Router

        self.f.report(W1, d("sda", "S"))
        root = Router()
        root.putChild(b"disks", DisksAdminResource(self.f.service))
        stub: Any = StubTreq(root)
        url = "https://admin.test/disks/w1/forget"
        for expected in (200, 404):
            response = stub.post(url, data=b'{"reason": "retired"}')
            stub.flush()
            answer = self.successResultOf(response)
            self.assertEqual(answer.code, expected)
        body = self.successResultOf(answer.content())
        self.assertEqual(body, b"no disk report from w1\n")


class ReportFormatTests(SynchronousTestCase):
    def test_parse_trimsAndNormalises(self) -> None:
        """Serials are trimmed; an empty one is none; removable defaults false."""
        raw = json.dumps(
            {"disks": [{"name": "sda", "serial": "  S1  ", "wwn": "", "size": 1}]}
        ).encode()
        self.assertEqual(parseDiskReport(raw), [Disk("sda", "S1", None, 1, False)])

    def test_parse_badReports(self) -> None:
        """Malformed reports are one line naming the problem."""
        ok = {"name": "sda", "serial": "S", "size": 1}
        for doc in [
            [],
            {"disks": [], "extra": 1},
            {"disks": [{**ok, "size": -1}]},
            {"disks": [{**ok, "size": True}]},
            {"disks": [{**ok, "name": "../x"}]},
            {"disks": [{**ok, "colour": "red"}]},
            {"disks": [{**ok, "serial": 5}]},
            {"disks": [{**ok, "serial": "a\x01b"}]},
            {"disks": [ok, ok]},
        ]:
            with self.assertRaises(DiskReportError, msg=doc):
                parseDiskReport(json.dumps(doc).encode())
        for raw in [b"", b"\xff", b'{"disks": [], "disks": []}']:
            with self.assertRaises(DiskReportError):
                parseDiskReport(raw)


def body(*disks: Disk) -> bytes:
    return json.dumps({"disks": [x.toJSON() for x in disks]}).encode()


class NodeDisksResourceTests(SynchronousTestCase):
    """POST /v1/node/disks with a fake identification."""

    def setUp(self) -> None:
        self.f = DiskFleet(self)
        self.who: NodeIdentity | None = W1
        resource = NodeDisksResource(self.f.service, lambda request: self.who)
        node, v1 = Router(), Router()
        node.putChild(b"disks", resource)
        v1.putChild(b"node", node)
        self.stub: Any = StubTreq(deviceRoot(v1))

    def post(self, data: bytes) -> tuple[int, bytes]:
        d = self.stub.post("https://device.test/v1/node/disks", data=data)
        self.stub.flush()
        response = self.successResultOf(d)
        return response.code, self.successResultOf(response.content())

    def test_clean_200Target(self) -> None:
        """[D1] A clean report answers 200 with the target disk."""
        code, answer = self.post(body(d("sda", "S1")))
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(answer)["target"]["serial"], "S1")

    def test_refused_409ReasonCodeFirst(self) -> None:
        """[D1] Refusals are 409 and one line starting with the reason code."""
        code, answer = self.post(body(d("sda", "S1"), d("sdb", "S1")))
        self.assertEqual(code, 409)
        self.assertTrue(answer.startswith(b"duplicate-disk-serial: "), answer)
        self.assertEqual(answer.count(b"\n"), 1)

    def test_noIdentity_403NothingStored(self) -> None:
        """A request no LDevID identifies is a 403 line; nothing is recorded."""
        self.who = None
        code, answer = self.post(body(d("sda", "S1")))
        self.assertEqual(code, 403)
        self.assertIn(b"LDevID", answer)
        self.assertEqual(self.f.entries(), [])

    def test_malformed_400(self) -> None:
        """A malformed report is a 400 line; nothing is recorded."""
        code, answer = self.post(b'{"disks": 5}')
        self.assertEqual(code, 400)
        self.assertTrue(answer.startswith(b"disk report: "))
        self.assertEqual(self.f.entries(), [])

    def test_journalFails_503(self) -> None:
        """[J1] The journal refusing is a 503 line saying nothing changed."""
        Faults(self.f.fleet).inject("journal")
        code, answer = self.post(body(d("sda", "S1")))
        self.assertEqual(code, 503)
        self.assertIn(b"nothing changed", answer)
        self.assertIsNone(self.f.target("w1"))

    def test_otherPaths_404(self) -> None:
        """The device listener still answers 404 elsewhere."""
        d_ = self.stub.get("https://device.test/v1/node/nothing")
        self.stub.flush()
        self.assertEqual(self.successResultOf(d_).code, 404)


def sysfs(root: Path, name: str, **files: str | bytes) -> None:
    base = root / "block" / name
    (base / "device").mkdir(parents=True)
    for path, content in files.items():
        target = base / path.replace("__", "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = content if isinstance(content, bytes) else content.encode()
        target.write_bytes(data)


class AgentDisksTests(SynchronousTestCase):
    """fleetd-agent disks: sysfs reading, --from, and fleetd's answer."""

    def setUp(self) -> None:
        self.root = Path(self.mktemp())
        self.sent: list[bytes] = []
        self.answer: tuple[int, bytes] = (200, b"")

    def post(self, path: str, data: bytes) -> tuple[int, bytes]:
        self.assertEqual(path, "/v1/node/disks")
        self.sent.append(data)
        return self.answer

    def runAgent(self, *words: str) -> tuple[int, str, str]:
        from fleetd.agent import disks as agent_disks

        args = agent.buildParser().parse_args(
            ["--server", "https://127.0.0.1:1", *words]
        )
        out, err = io.StringIO(), io.StringIO()
        code = agent_disks.run(args, self.post, out, err)
        return code, out.getvalue(), err.getvalue()

    def test_readsSysfs(self) -> None:
        """
        [D1] Serials from device/serial, serial (virtio) or the VPD page,
        trimmed; WWN; size in bytes; removable; virtual devices skipped.
        """
        vpd = bytes([0, 0x80, 0, 8]) + b"  VPD-7 "
        sysfs(self.root, "nvme0n1", device__serial="  NV-1  \n", wwid="eui.1\n",
              size="1000000\n", removable="0\n")  # fmt: skip
        sysfs(self.root, "vda", serial="VIRT-1", size="2048")
        sysfs(self.root, "sda", device__vpd_pg80=vpd, device__wwid="naa.5", size="8")
        sysfs(self.root, "sdb", size="16", removable="1")
        sysfs(self.root, "sr0", size="0")
        (self.root / "block" / "loop0").mkdir(parents=True)
        self.answer = (200, json.dumps({"target": {"serial": "NV-1", "name":
                       "nvme0n1", "size": 512000000}}).encode())  # fmt: skip
        code, out, err = self.runAgent("disks", "--sysfs-root", str(self.root))
        self.assertEqual((code, err), (0, ""))
        self.assertIn("target disk serial NV-1", out)
        (sent,) = self.sent
        self.assertEqual(
            parseDiskReport(sent),
            [
                Disk("nvme0n1", "NV-1", "eui.1", 512_000_000, False),
                Disk("sda", "VPD-7", "naa.5", 4096, False),
                Disk("sdb", None, None, 8192, True),
                Disk("vda", "VIRT-1", None, 1_048_576, False),
            ],
        )

    def test_refusal_oneLineWithReasonCode_exit1(self) -> None:
        """[D1] fleetd's refusal: exit 1 and one line naming the reason code."""
        report = Path(self.mktemp())
        report.write_text(json.dumps({"disks": [{"name": "sda", "size": 1}]}))
        self.answer = (409, b"disk-serial-missing: disk sda of w1 exposes no serial\n")
        code, out, err = self.runAgent("disks", "--from", str(report))
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(err.count("\n"), 1)
        self.assertIn("disk-serial-missing:", err)

    def test_badFrom_exit2(self) -> None:
        """A --from file that is not a report is one line and exit 2; nothing sent."""
        report = Path(self.mktemp())
        report.write_text("{}")
        code, _, err = self.runAgent("disks", "--from", str(report))
        self.assertEqual(code, 2)
        self.assertEqual(err.count("\n"), 1)
        self.assertEqual(self.sent, [])


class DaemonDisksTests(DaemonTestMixin, TestCase):
    """The daemon mounts POST /v1/node/disks on the device listener [A3]."""

    def setUp(self) -> None:
        self.makeSettings()

    async def test_nodeDisks_onDeviceListenerOnly(self) -> None:
        """
        [A3] [D1] The device listener serves /v1/node/disks (refusing a node
        without an LDevID); the boot listener does not.
        """
        from twisted.internet.threads import deferToThread

        from fleetd.agent import disks as agent_disks

        service = self.startDaemon()
        port = self.port(service, "device")
        context = ssl.create_default_context(cafile=str(self.pki.public_ca))
        context.check_hostname = False
        post = agent_disks.httpsPost(f"https://127.0.0.1:{port}", None, context)
        status, answer = await deferToThread(post, "/v1/node/disks", body())
        self.assertEqual(status, 403)
        self.assertIn(b"LDevID", answer)
        status, _, _ = await self.get(service, "boot", "/v1/node/disks")
        self.assertEqual(status, 404)
