"""
End-to-end: C{twistd -n fleetd} as a process, the way systemd runs it.

These start the real plugin with the venv's twistd, read the listen lines
from its log to find the ports (the config asks for port 0), talk TLS to
it, and stop it with SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from fleetd.pki.dev import DevPKIPaths
from tests.daemonsupport import httpsGet
from tests.support import writeConfig

TWISTD = [str(Path(sys.executable).parent / "twistd")]
LISTEN = re.compile(
    r"listen\.started (\w+) IPv4Address\(type='TCP', host='[\d.]+', port=(\d+)\)"
)
# The same line with --log-format json.
LISTEN_JSON = re.compile(
    r'"event": "listen\.started", "listener": "(\w+)", "address": "[\d.]+:(\d+)"'
)


class Twistd(ProcessProtocol):
    """Collect output; fire C{ended} with the exit code."""

    def __init__(self) -> None:
        self.out = b""
        self.err = b""
        self.ended: Deferred[int] = Deferred()
        self.ports: dict[str, int] = {}
        self._ready: Deferred[None] | None = Deferred()
        self._ready.addErrback(self._early)
        self._earlyFailure: Failure | None = None

    def outReceived(self, data: bytes) -> None:
        self.out += data
        text = self.out.decode("utf-8", "replace")
        for name, port in LISTEN.findall(text) + LISTEN_JSON.findall(text):
            self.ports[name] = int(port)
        if b"fleetd.ready" in self.out and self._ready is not None:
            ready, self._ready = self._ready, None
            ready.callback(None)

    def errReceived(self, data: bytes) -> None:
        self.err += data

    def _early(self, f: Failure) -> None:
        self._earlyFailure = f

    async def ready(self) -> None:
        if self._ready is not None:
            await self._ready
        if self._earlyFailure is not None:
            self._earlyFailure.raiseException()

    def processEnded(self, reason: Failure) -> None:
        if self._ready is not None:
            ready, self._ready = self._ready, None
            ready.errback(
                RuntimeError(f"fleetd exited early: {self.err!r} {self.out!r}")
            )
        # twistd re-raises SIGTERM on the way out, as systemd expects.
        value = reason.value
        if isinstance(value, ProcessTerminated) and value.signal == signal.SIGTERM:
            self.ended.callback(0)
        elif isinstance(value, ProcessDone | ProcessTerminated):
            self.ended.callback(value.exitCode if value.exitCode is not None else -1)
        else:
            self.ended.callback(-1)


def spawn(
    test: TestCase, config: Path, *extra: str, notifySocket: str | None = None
) -> Twistd:
    proto = Twistd()
    argv = [*TWISTD, "-n", "--pidfile=", "fleetd", "--config", str(config), *extra]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FLEETD_CONFIG", "NOTIFY_SOCKET")
    }
    if notifySocket is not None:
        env["NOTIFY_SOCKET"] = notifySocket
    transport = reactor.spawnProcess(proto, argv[0], argv, env=env)

    def cleanup() -> Deferred[Any] | None:
        if not proto.ended.called:
            transport.signalProcess("KILL")
            return proto.ended
        return None

    test.addCleanup(cleanup)
    return proto


class TwistdTests(TestCase):
    timeout = 120

    async def test_sigterm_stopsCleanly(self) -> None:
        """
        twistd -n fleetd serves, logs JSON lines with --log-format json, and
        stops on SIGTERM with status 0, ports closed and no traceback.
        """
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory)
        proto = spawn(self, config, "--log-format", "json")
        await proto.ready()
        pki = DevPKIPaths.inside(directory / "pki")
        status, _, body = await deferToThread(
            httpsGet, proto.ports["admin"], "/healthz", pki.public_ca
        )
        self.assertEqual((status, json.loads(body)["status"]), (200, "ok"))
        status, _, body = await deferToThread(
            httpsGet, proto.ports["boot"], "/metrics", pki.public_ca
        )
        self.assertEqual(status, 404)
        os.kill(proto_pid(proto), signal.SIGTERM)
        code = await proto.ended
        self.assertEqual(code, 0, proto.err)
        self.assertNotIn(b"Traceback", proto.out + proto.err)
        for line in proto.out.splitlines():
            json.loads(line)  # every line is one JSON object
        for name in ("boot", "device", "admin", "tink"):
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", proto.ports[name]), 5).close()

    async def test_notifySocket_readyOnceServing(self) -> None:
        """
        Under systemd (Type=notify), twistd -n fleetd sends READY=1 to
        NOTIFY_SOCKET (here an abstract '@' address, a real AF_UNIX
        datagram socket) once the runs are loaded: /healthz is 200 by
        then. SIGTERM sends STOPPING=1.
        """
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory)
        name = f"fleetd-twistd-test-{os.getpid()}-{id(self)}"
        systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(systemd.close)
        systemd.bind("\0" + name)  # abstract, as systemd's own socket may be
        systemd.settimeout(60)
        proto = spawn(self, config, notifySocket="@" + name)
        message = await deferToThread(systemd.recv, 4096)
        self.assertEqual(message.split(b"\n")[0], b"READY=1")
        self.assertIn(b"fleetd.ready", proto.out)
        pki = DevPKIPaths.inside(directory / "pki")
        status, _, body = await deferToThread(
            httpsGet, proto.ports["admin"], "/healthz", pki.public_ca
        )
        self.assertEqual((status, json.loads(body)["status"]), (200, "ok"))
        os.kill(proto_pid(proto), signal.SIGTERM)
        self.assertEqual(await proto.ended, 0, proto.err)
        self.assertEqual(await deferToThread(systemd.recv, 4096), b"STOPPING=1")

    async def _badConfig(self, config: Path, expect: str, binds: bool = False) -> None:
        proto = spawn(self, config)
        code = await proto.ended
        self.assertEqual(code, 2)
        lines = proto.err.decode().strip().splitlines()
        self.assertEqual(len(lines), 1, proto.err)
        self.assertIn(expect, lines[0])
        self.assertNotIn(b"Traceback", proto.out + proto.err)
        if not binds:
            self.assertNotIn(b"listen.started", proto.out)
        for port in proto.ports.values():  # whatever bound is closed again
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), 5).close()

    async def test_badConfig_oneLine(self) -> None:
        """A bad config value: one line naming the key, exit 2, nothing started."""
        config = writeConfig(Path(self.mktemp()), {"limits": {"max_connections": -1}})
        await self._badConfig(config, "limits.max_connections")

    async def test_badTopology_oneLine(self) -> None:
        """[A1] A bad topology file: one line naming the key, exit 2."""
        config = writeConfig(Path(self.mktemp()), topology={"SPORE_IP": "10.20.0.5"})
        await self._badConfig(config, "site.topology.SPORE_BOOTSTRAP_IP")

    async def test_portInUse_oneLine(self) -> None:
        """A listener that cannot bind: one line naming it, exit 2."""
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        self.addCleanup(busy.close)
        port = busy.getsockname()[1]
        config = writeConfig(
            Path(self.mktemp()),
            {"listen": {"device": f"tcp:{port}:interface=127.0.0.1"}},
        )
        await self._badConfig(config, "listen.device", binds=True)

    async def test_restart_twice(self) -> None:
        """[V2] twistd -n fleetd restarts over its state and rebuilds the vault."""
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory)
        first = spawn(self, config)
        await first.ready()
        self.assertIn(b"vault=0", first.out)
        os.kill(proto_pid(first), signal.SIGTERM)
        self.assertEqual(await first.ended, 0)
        entry = directory / "vault" / "run-1.yaml"
        fd = os.open(entry, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"machine: {}\n")
        os.close(fd)
        second = spawn(self, config)
        await second.ready()
        self.assertIn(b"vault=1", second.out)
        os.kill(proto_pid(second), signal.SIGTERM)
        self.assertEqual(await second.ended, 0)
        await deferLater(reactor, 0, lambda: None)


def proto_pid(proto: Twistd) -> int:
    transport = proto.transport
    assert transport is not None and transport.pid is not None
    return int(transport.pid)
