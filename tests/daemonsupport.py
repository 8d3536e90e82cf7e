"""
A real daemon on loopback for integration tests: start and stop it over a
temporary dev-style config, and talk to it with Python's C{ssl} (in a
thread, so the reactor keeps serving); L{DeliveryMixin} adds devices,
provisions runs and fetches configurations through it.
"""

from __future__ import annotations

import http.client
import io
import json
import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import ILogObserver, globalLogPublisher

from fleetd.config import Settings, loadSettings
from fleetd.pki.dev import DevPKIPaths
from fleetd.reactors import fleetdReactor
from fleetd.service import FleetdService, prepare
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.support import writeConfig


@dataclass(frozen=True)
class Fleetctl:
    """fleetctl's words against one daemon: (exit status, stdout, stderr)."""

    config: Path
    """The owner's config naming the daemon's admin listener."""

    def __call__(
        self, *words: str, stdin: io.StringIO | None = None
    ) -> Deferred[tuple[int, str, str]]:
        return fleetctlAgainst(self.config, *words, stdin=stdin)


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
        service = FleetdService(
            prepare(self.settings), fleetdReactor(reactor), collector=collector
        )
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

    async def daemonWithDevice(
        self,
        overrides: dict[str, dict[str, Any]] | None = None,
        *,
        serial: str = "SN-1",
        cluster: str | None = None,
    ) -> tuple[FleetdService, Fleetctl]:
        """
        Start a daemon over the dev config plus C{overrides}, wait until its
        runs are loaded, and add the worker C{w1} (C{serial}, L{UUID1}, in
        C{cluster} if given) with C{fleetctl device add}, as the owner would.
        Return the service and fleetctl against its admin listener (its
        config has the same C{overrides}).
        """
        self.makeSettings(overrides)
        return await self.startWithDevice(overrides, serial=serial, cluster=cluster)

    async def startWithDevice(
        self,
        overrides: dict[str, dict[str, Any]] | None = None,
        *,
        serial: str = "SN-1",
        cluster: str | None = None,
    ) -> tuple[FleetdService, Fleetctl]:
        """
        L{daemonWithDevice} over the settings L{makeSettings} made already
        (for a test that changes the directory first); fleetctl's config is
        the dev config plus C{overrides}.
        """
        service = self.startDaemon()
        await service.loading.whenReady()
        # DaemonTestMixin's own, for a test case whose port is an attribute
        admin = DaemonTestMixin.port(self, service, "admin")
        fleetctl = Fleetctl(ownerConfig(self.directory, admin, overrides))
        where = () if cluster is None else ("--cluster", cluster)
        await self.deviceAdd(fleetctl, "w1", serial, UUID1, *where)
        return service, fleetctl

    async def deviceAdd(
        self, fleetctl: Fleetctl, name: str, serial: str, uuid: str, *extra: str
    ) -> None:
        """C{fleetctl device add} of a worker (plus C{extra} words): exit 0."""
        code, _, err = await fleetctl(
            "device", "add", name, "--serial", serial, "--uuid", uuid,
            "--class", "worker", *extra,
        )  # fmt: skip
        self.assertEqual(code, 0, err)  # type: ignore[attr-defined]


UUID1 = "4c4c4544-0042-3510-8050-b4c04f4d3232"


UUID2 = "4c4c4544-0042-3510-8050-b4c04f4d3233"


def httpsJSON(
    port: int, method: str, path: str, ca: Path, cert: tuple[Path, Path], body: Any
) -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert[0]), str(cert[1]))
    conn = http.client.HTTPSConnection("localhost", port, timeout=30, context=context)
    try:
        conn.request(
            method,
            path,
            body=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        response = conn.getresponse()
        data = response.read()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data.decode()
    finally:
        conn.close()


def configPath(code: str, uuid: str, serial: str) -> str:
    return "/config?" + urllib.parse.urlencode(
        {"code": code, "serial": serial, "uuid": uuid}
    )


class DeliveryMixin(DaemonTestMixin):
    service: FleetdService

    def startLoaded(
        self, overrides: dict[str, dict[str, Any]] | None = None
    ) -> Deferred[None]:
        """Start a daemon; the Deferred fires once its runs are loaded."""
        self.makeSettings(overrides)
        self.service = self.startDaemon()
        return self.service.loading.whenReady()

    def captureLogs(self) -> list[dict[str, Any]]:
        """Every log event of the test, as emitted (before any redaction)."""
        logged: list[dict[str, Any]] = []
        observer = cast(ILogObserver, logged.append)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)  # type: ignore[attr-defined]
        return logged

    async def admin(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        result: tuple[int, Any] = await deferToThread(
            httpsJSON,
            self.port(self.service, "admin"),
            method,
            path,
            self.pki.public_ca,
            (self.pki.owner_cert, self.pki.owner_key),
            body,
        )
        return result

    async def addDevice(self, name: str, serial: str, uuid: str, **extra: Any) -> None:
        status, doc = await self.admin(
            "POST", "/v1/admin/devices",
            {"name": name, "serial": serial, "uuid": uuid, "class": "worker", **extra},
        )  # fmt: skip
        self.assertEqual(status, 201, doc)  # type: ignore[attr-defined]

    async def provision(self, *names: str) -> dict[str, str]:
        status, doc = await self.admin(
            "POST", "/v1/admin/provision", {"devices": list(names)}
        )
        self.assertEqual(status, 201, doc)  # type: ignore[attr-defined]
        return {run["device"]: run["code"] for run in doc["runs"]}

    async def fetch(self, path: str) -> tuple[int, bytes, bytes]:
        result: tuple[int, bytes, bytes] = await deferToThread(
            httpsGet, self.port(self.service, "boot"), path, self.pki.public_ca
        )
        return result

    async def events(self, *wanted: str) -> list[str]:
        """The journal's events once all of C{wanted} are in it (bounded wait)."""
        for _ in range(200):
            events = [e["event"] for e in await self.journal()]
            if all(w in events for w in wanted):
                break
            await deferLater(reactor, 0.01, lambda: None)
        return events

    async def journal(self) -> list[dict[str, Any]]:
        status, doc = await self.admin("GET", "/v1/admin/journal", None)
        self.assertEqual(status, 200)  # type: ignore[attr-defined]
        entries: list[dict[str, Any]] = doc["entries"]
        return entries


def httpsRequest(
    port: int,
    method: str,
    path: str,
    ca: Path,
    clientCert: tuple[Path, Path] | None,
    body: bytes | None = None,
    contentType: str | None = None,
) -> tuple[int, bytes]:
    """One HTTPS request with an optional body; return (status, body)."""
    context = ssl.create_default_context(cafile=str(ca))
    if clientCert is not None:
        context.load_cert_chain(str(clientCert[0]), str(clientCert[1]))
    conn = http.client.HTTPSConnection("localhost", port, timeout=10, context=context)
    try:
        headers = {} if contentType is None else {"content-type": contentType}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
