"""
A real daemon on loopback for integration tests: start and stop it over a
temporary dev-style config, and talk to it with Python's C{ssl} (in a
thread, so the reactor keeps serving).
"""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from fleetd.config import Settings, loadSettings
from fleetd.pki.dev import DevPKIPaths
from fleetd.service import FleetdService, prepare
from tests.support import writeConfig


def httpsGet(
    port: int,
    path: str,
    ca: Path,
    clientCert: tuple[Path, Path] | None = None,
    method: str = "GET",
) -> tuple[int, bytes, bytes]:
    """One HTTPS request; return (status, content-type, body)."""
    context = ssl.create_default_context(cafile=str(ca))
    if clientCert is not None:
        context.load_cert_chain(str(clientCert[0]), str(clientCert[1]))
    conn = http.client.HTTPSConnection("localhost", port, timeout=10, context=context)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return (
            response.status,
            (response.getheader("content-type") or "").encode(),
            response.read(),
        )
    finally:
        conn.close()


class DaemonTestMixin:
    """Start and stop a real daemon over a temporary directory."""

    directory: Path
    settings: Settings
    pki: DevPKIPaths

    def makeSettings(self, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.directory = Path(self.mktemp()).resolve()  # type: ignore[attr-defined]
        self.settings = loadSettings(writeConfig(self.directory, overrides))
        self.pki = DevPKIPaths.inside(self.directory / "pki")

    def startDaemon(self, collector: Any = None) -> FleetdService:
        service = FleetdService(prepare(self.settings), reactor, collector=collector)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(self.stopDaemon, service)  # type: ignore[attr-defined]
        return service

    def stopDaemon(self, service: FleetdService) -> Deferred[Any] | None:
        if service.running:
            return service.stopService()
        return None

    def port(self, service: FleetdService, name: str) -> int:
        listener = service.listeners[name]
        assert listener.port is not None
        address: Any = listener.port.getHost()
        return int(address.port)

    def get(
        self, service: FleetdService, listener: str, path: str, owner: bool = False
    ) -> Deferred[tuple[int, bytes, bytes]]:
        cert = (self.pki.owner_cert, self.pki.owner_key) if owner else None
        return deferToThread(
            httpsGet, self.port(service, listener), path, self.pki.public_ca, cert
        )
