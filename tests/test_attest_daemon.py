"""
The device listener of a running daemon serves attestation and lookups,
and refuses a real TPM 1.2 swtpm driven by fleetd-agent [A3] [T2].
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.agent.client import Refusal, call, tlsContext
from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from tests.daemonsupport import DaemonTestMixin
from tests.support import TOPOLOGY, missingPeer
from tests.swtpm import AVAILABLE, SWTPM
from tests.swtpmsupport import runAgent


class DeviceListenerTests(DaemonTestMixin, TestCase):
    def setUp(self) -> None:
        self.makeSettings()

    def post(self, port: int, path: str, body: dict[str, Any] | None) -> Any:
        context = tlsContext(str(self.pki.public_ca))
        try:
            return call(f"https://localhost:{port}", path, context, body)
        except Refusal as e:
            return e.status, e.line

    async def test_deviceListener_attestationWired(self) -> None:
        """[T2][A3] the daemon's 8444 refuses a TPM 1.2 claim (journaled) and
        asks lookups for an LDevID."""
        service = self.startDaemon()
        port = self.port(service, "device")
        claim = {"tpm_version": "1.2", "serial": "SER1"}
        status, line = await deferToThread(
            self.post, port, "/v1/attest/challenge", claim
        )
        self.assertEqual(status, 403)
        self.assertTrue(line.startswith("tpm12-unsupported: "), line)
        entries = await service.journal.query()
        refused = [e for e in entries if e.event == "attest.refused"]
        self.assertEqual([e.fields["reason"] for e in refused], ["tpm12-unsupported"])
        lookup = await deferToThread(self.post, port, "/v1/node/plan", None)
        self.assertEqual(lookup, (401, "ldevid-required: this resource needs an "
                                  "LDevID client certificate"))  # fmt: skip

    async def test_status_showsLDevID(self) -> None:
        """[T4] the status report carries the node's LDevID (issuer, notAfter)."""
        from fleetd.inventory.model import Device
        from fleetd.pki.records import LDevIDRecord

        service = self.startDaemon()
        uuid = "4c4c4544-0000-1000-8000-000000000001"
        await service.inventory.add(
            Device("w1", "SER1", uuid, (), "worker", None), journal=[]
        )
        before = await service.status.report("w1")
        assert before is not None
        self.assertIsNone(before.toJSON()["ldevid"])
        record = LDevIDRecord("ab12", "SER1", "w1", "CN=issuer", 2e9, 1e9, "attest")
        service.ldevids.issued(record)
        after = await service.status.report("w1")
        assert after is not None
        shown = after.toJSON()["ldevid"]
        self.assertEqual(
            (shown["issuer"], shown["not_after"], shown["legacy"]),
            ("CN=issuer", 2e9, False),
        )


class TPM12DaemonTests(DaemonTestMixin, TestCase):
    """A TPM 1.2 swtpm against the real daemon [T2]; one swtpm per class."""

    swtpm: SWTPM
    classPKI: DevPKIPaths

    @classmethod
    def shared(cls) -> None:
        if "swtpm" in cls.__dict__:
            return
        if not AVAILABLE:
            raise missingPeer("swtpm is not installed")
        base = Path(tempfile.mkdtemp(prefix="fleetd-tpm12-"))
        atexit.register(shutil.rmtree, base, True)
        cls.classPKI = ensureDevPKI(base / "pki", str(TOPOLOGY["enrollment_name"]))
        cls.swtpm = SWTPM(base / "tpm", cls.classPKI, tpm2=False)
        cls.swtpm.start()
        atexit.register(cls.swtpm.stop)

    def setUp(self) -> None:
        self.shared()
        self.makeSettings()
        shutil.copytree(self.classPKI.ek_roots.parent, self.directory / "pki")

    async def test_tpm12_refusedByTheDaemon(self) -> None:
        """
        [T2] Real daemon, real agent, a real TPM 1.2 swtpm (with an EK
        certificate: refused by its version): tpm12-unsupported, one line,
        journaled with the reported serial, no LDevID.
        """
        service, _ = await self.startWithDevice(serial="SER1")
        state = Path(self.mktemp())
        argv = [
            "--server", f"https://localhost:{self.port(service, 'device')}",
            "--ca", str(self.pki.public_ca),
            "--tcti", self.swtpm.tcti,
            "--state", str(state),
            "attest", "--serial", "SER1",
        ]  # fmt: skip
        code, out, err = await deferToThread(runAgent, argv)
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("refused: tpm12-unsupported: ", err)
        entries = await service.journal.query(limit=1000)
        refused = [e for e in entries if e.event == "attest.refused"]
        self.assertEqual([e.fields["reason"] for e in refused], ["tpm12-unsupported"])
        self.assertEqual(refused[0].fields["reported_serial"], "SER1")
        self.assertFalse((state / "ldevid.pem").exists())
