"""
A daemon with C{[kms]} and a node that may use it (issue 30): the device
C{w1} with an approved EK binding and a delivered configuration; Talos
played by the grpcio client of L{fleetd.testing.kmsclient}, and
C{cryptsetup} formatting and opening LUKS2 volumes on files.
"""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import grpc
from twisted.internet.threads import deferToThread

from fleetd.service import FleetdService
from fleetd.testing.kmsclient import KMSClient, secureChannel
from fleetd.trust.model import evidence
from tests.daemonsupport import UUID1, DeliveryMixin, configPath
from tests.support import missingPeer

KMS = {"listen": {"kms": "tcp:0:interface=127.0.0.1"}, "kms": {}}
EK = "ab" * 32
CRYPTSETUP = shutil.which("cryptsetup") or "/usr/sbin/cryptsetup"


def fetchFrom(port: int, path: str, ca: Path, source: str) -> tuple[int, bytes]:
    """GET C{path} on the boot listener from the loopback address C{source}."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(
        "localhost", port, timeout=10, context=context, source_address=(source, 0)
    )
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def luksPassphrase(raw: bytes) -> bytes:
    """What Talos gives cryptsetup for a KMS key: base64 of the 32 bytes
    it sealed (docs/decisions.md, issue 30)."""
    return base64.b64encode(raw)


def luksFormat(volume: Path, raw: bytes) -> None:
    """A LUKS2 volume on the file C{volume}, opened by C{raw}'s passphrase."""
    if not os.path.exists(CRYPTSETUP):
        raise missingPeer("cryptsetup (Debian cryptsetup-bin) is not installed")
    with open(volume, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(
        [CRYPTSETUP, "luksFormat", "--type", "luks2", "--batch-mode",
         "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
         "--key-file", "-", str(volume)],
        input=luksPassphrase(raw), check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def luksOpens(volume: Path, raw: bytes) -> bool:
    """Whether C{raw}'s passphrase opens the volume (no device-mapper)."""
    done = subprocess.run(
        [CRYPTSETUP, "open", "--test-passphrase", "--key-file", "-", str(volume)],
        input=luksPassphrase(raw), capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    return done.returncode == 0


class KMSDaemonMixin(DeliveryMixin):
    """One daemon with C{[kms]}; C{w1} ready to seal (L{startNode})."""

    async def startNode(
        self, source: str = "127.0.0.1", approve: bool = True, **overrides: Any
    ) -> FleetdService:
        """Start the daemon, add C{w1} (L{UUID1}), approve its EK binding
        and deliver its configuration to C{source}."""
        await self.startLoaded({**KMS, **overrides})
        await self.addDevice("w1", "SN-1", UUID1)
        if approve:
            await self.approveBinding("SN-1")
        await self.deliver("w1", UUID1, "SN-1", source)
        return self.service

    async def approveBinding(self, serial: str) -> None:
        claim = evidence(serial=serial, ek_sha256=EK, kind="receiving-scan")
        await self.service.trust.record([claim], actor="owner:test", via="test")
        await self.service.trust.approve(serial, actor="owner:test")

    async def deliver(self, name: str, uuid: str, serial: str, source: str) -> None:
        code = (await self.provision(name))[name]
        status, _ = await deferToThread(
            fetchFrom,
            self.port(self.service, "boot"),
            configPath(code, uuid, serial),
            self.pki.public_ca,
            source,
        )
        self.assertEqual(status, 200)  # type: ignore[attr-defined]
        await self.events("run.delivered")

    def kms(self, service: FleetdService | None = None) -> tuple[KMSClient, Any]:
        """A Talos-like client of the kms listener, trusting the dev CA."""
        port = self.port(service or self.service, "kms")
        channel = secureChannel("localhost", port, self.pki.public_ca.read_bytes())
        self.addCleanup(channel.close)  # type: ignore[attr-defined]
        return KMSClient(channel), channel

    async def seal(self, client: KMSClient, uuid: str, data: bytes) -> bytes:
        result: bytes = await deferToThread(client.seal, uuid, data)
        return result

    async def unseal(self, client: KMSClient, uuid: str, data: bytes) -> bytes:
        result: bytes = await deferToThread(client.unseal, uuid, data)
        return result

    async def refused(
        self, call: Any, uuid: str, data: bytes
    ) -> tuple[grpc.StatusCode, str]:
        """The status and message of a call that must be refused."""
        try:
            await deferToThread(call, uuid, data)
        except grpc.RpcError as e:
            return e.code(), e.details()
        self.fail("the call was answered")  # type: ignore[attr-defined]
        raise AssertionError
