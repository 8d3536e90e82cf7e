"""The device listener of a running daemon serves attestation and lookups [A3] [T2]."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.cli.agent_client import Refusal, call, tlsContext
from tests.test_daemon import DaemonTestMixin


class DeviceListenerTests(DaemonTestMixin, TestCase):
    def setUp(self) -> None:
        self.makeSettings()

    def post(self, port: int, path: str, body: dict[str, Any] | None) -> Any:
        context = tlsContext(str(self.pki.public_ca))
        try:
            return call(f"https://localhost:{port}", path, context, body)
        except Refusal as e:
            return e.status, e.line

    async def _tpm12(self) -> None:
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

    def test_deviceListener_attestationWired(self) -> Deferred[None]:
        """[T2][A3] the daemon's 8444 refuses a TPM 1.2 claim (journaled) and
        asks lookups for an LDevID."""
        return ensureDeferred(self._tpm12())

    async def _status(self) -> None:
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

    def test_status_showsLDevID(self) -> Deferred[None]:
        """[T4] the status report carries the node's LDevID (issuer, notAfter)."""
        return ensureDeferred(self._status())
