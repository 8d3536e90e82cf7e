"""
Configuration delivery through the whole daemon, over real TLS [C1] [C2] [V4].

Devices are added and runs provisioned through the admin API with the
owner certificate; nodes are Python TLS clients on the boot listener.
"""

from __future__ import annotations

import http.client
import io
import json
import shutil
import socket
import ssl
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.logs import makeObserver
from tests.daemonsupport import (
    UUID1,
    UUID2,
    DeliveryMixin,
    configPath,
    httpsGet,
)
from tests.test_vault_directory import giveAway
from tests.vaults import REFUSED


def rawTLS(port: int, ca: Path, payload: bytes) -> bytes:
    """Send C{payload} on one TLS connection; return all it got until closed."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(payload)
            chunks = []
            while chunk := tls.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


class DeliveryTests(DeliveryMixin, TestCase):
    timeout = 120

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        return self.startLoaded()

    async def test_provision_workerG2Refused(self) -> None:
        """[T2] Devices of class worker-g2 cannot be provisioned; journaled."""
        await self.addDevice("g2", "SERG2", UUID2, **{"class": "worker-g2"})
        await self.addDevice("w1", "SER1", UUID1)
        status, doc = await self.admin(
            "POST", "/v1/admin/provision", {"devices": ["w1", "g2"]}
        )
        self.assertEqual(status, 409)
        self.assertTrue(doc.startswith("class-refused: g2 is of class worker-g2"), doc)
        events = await self.events("provision.refused")
        self.assertIn("provision.refused", events)
        # Nothing was provisioned, not even the acceptable device.
        self.assertNotIn("run.provisioned", events)
        status, doc = await self.admin("GET", "/v1/admin/devices/w1", None)
        self.assertEqual(doc["status"], "inventory")

    async def test_config_deliveredOnceThen410(self) -> None:
        """[C1][C2] GET /config answers 200 YAML once, then 410 consumed, journaled."""
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        path = configPath(codes["w1"], UUID1, "SER1")
        status, ctype, body = await self.fetch(path)
        self.assertEqual((status, ctype), (200, b"application/yaml"))
        self.assertIn(b"hostname: w1", body)
        status, _, body = await self.fetch(path)
        self.assertEqual(status, 410)
        self.assertTrue(body.startswith(b"consumed:"))
        wanted = (
            "run.provisioned",
            "run.delivered",
            "config.refetched",
        )
        events = await self.events(*wanted)
        for event in wanted:
            self.assertIn(event, events)
        _, _, metrics = await self.get(self.service, "admin", "/metrics")
        self.assertIn(b'fleetd_install_config_refetched{device="w1"} 1.0', metrics)
        self.assertIn(b'fleetd_config_requests_total{outcome="delivered"} 1.0', metrics)

    async def test_config_refusals(self) -> None:
        """
        Malformed requests are 400 (also a literal ${code}), another machine's
        code 403, unknown 404, HEAD/POST 405: one line each, nothing consumed.
        """
        await self.addDevice("w1", "SER1", UUID1)
        await self.addDevice("w2", "SER2", UUID2)
        codes = await self.provision("w1", "w2")
        code = codes["w1"]
        cases = [
            ("/config?code=%24%7Bcode%7D&uuid=" + UUID1 + "&serial=SER1", 400),
            ("/config?code=${code}&uuid=" + UUID1 + "&serial=SER1", 400),
            (f"/config?code={code}&serial=SER1", 400),
            (f"/config?code={code}&code={code}&uuid={UUID1}&serial=SER1", 400),
            (f"/config?code={code}&uuid={UUID1}&serial=%ff", 400),
            ("/config?code=" + "A" * 32 + f"&uuid={UUID1}&serial=SER1", 404),
            (configPath(code, UUID2, "SER2"), 403),
            (configPath(code, UUID1, "SER9"), 403),
            ("/config?code=" + "%00" * 40, 400),
        ]
        for path, expected in cases:
            status, ctype, body = await self.fetch(path)
            self.assertEqual(status, expected, path)
            self.assertEqual(body.count(b"\n"), 1, body)
            self.assertTrue(ctype.startswith(b"text/plain"))
        for method in ("HEAD", "POST"):
            status, _, _ = await deferToThread(
                httpsGet, self.port(self.service, "boot"),
                configPath(code, UUID1, "SER1"), self.pki.public_ca, None, method,
            )  # fmt: skip
            self.assertEqual(status, 405)
        # None of that consumed the run.
        status, _, _ = await self.fetch(configPath(code, UUID1, "SER1"))
        self.assertEqual(status, 200)

    def bigTemplate(self, size: int) -> None:
        """A cluster C{big} whose configurations carry C{size} bytes of padding."""
        big = self.directory / "templates" / "big.yaml"
        template = (self.directory / "templates" / "default.yaml").read_text()
        big.write_text(
            template.replace("persist: true", f"persist: true\nnote: {'x' * size}")
        )

    async def test_config_concurrent50_exactlyOne(self) -> None:
        """
        [C1] 50 concurrent TLS clients on one code, while a 4 MiB body is in
        flight: exactly one 200.
        """
        # A 4 MiB body takes many reactor turns to send over TLS, so the
        # other 49 requests really arrive while the first is in flight.
        self.bigTemplate(4 << 20)
        await self.addDevice("w1", "SER1", UUID1, cluster="big")
        codes = await self.provision("w1")
        path = configPath(codes["w1"], UUID1, "SER1")
        port = self.port(self.service, "boot")
        barrier = threading.Barrier(50)

        def one(_: int) -> int:
            context = ssl.create_default_context(cafile=str(self.pki.public_ca))
            conn = http.client.HTTPSConnection(
                "localhost", port, timeout=60, context=context
            )
            try:
                conn.connect()
                barrier.wait(30)
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                return response.status
            finally:
                conn.close()

        def all50() -> list[int]:
            with ThreadPoolExecutor(50) as pool:
                return list(pool.map(one, range(50)))

        statuses = await deferToThread(all50)
        # Exactly one delivery; the others were refused while it was in
        # flight (503 busy) or after it (410 consumed); never a second 200.
        self.assertEqual(statuses.count(200), 1, statuses)
        self.assertEqual(set(statuses) - {200, 410, 503}, set(), statuses)
        self.assertIn(503, statuses)  # the overlap really happened
        self.assertEqual((await self.fetch(path))[0], 410)

    async def test_config_clientStopsReadingThenResets_notConsumed(self) -> None:
        """
        [C1] A node that stops reading and then resets the connection never
        had the whole body: the mark is withdrawn, the run deliverable again.
        """
        # More than the kernel's socket buffers hold (tcp_wmem tops out at
        # 4 MiB), so part of the body stays with fleetd when the node stops.
        self.bigTemplate(24 << 20)
        await self.addDevice("w1", "SER1", UUID1, cluster="big")
        codes = await self.provision("w1")
        path = configPath(codes["w1"], UUID1, "SER1")
        port = self.port(self.service, "boot")
        connected = threading.Event()
        reset = threading.Event()

        def requestThenStopReading() -> None:
            context = ssl.create_default_context(cafile=str(self.pki.public_ca))
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.settimeout(30)
            raw.connect(("127.0.0.1", port))
            tls = context.wrap_socket(raw, server_hostname="localhost")
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            connected.set()
            reset.wait(30)  # never reads a byte of the answer
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            tls.close()

        client = deferToThread(requestThenStopReading)
        await deferToThread(connected.wait, 30)
        await deferLater(reactor, 1.0, lambda: None)  # fleetd fills its buffers
        self.assertIsNone(self.service.runs.readyRun("w1"))  # in flight
        reset.set()
        await client
        events = await self.events("run.delivery-aborted")
        self.assertIn("run.delivery-aborted", events)
        status, _, body = await self.fetch(path)
        self.assertEqual(status, 200)
        self.assertGreater(len(body), 24 << 20)

    async def test_config_connectionDiesMidBody_notConsumed(self) -> None:
        """[C1] A response whose connection dies before completing consumes nothing."""
        big = self.directory / "templates" / "big.yaml"
        template = (self.directory / "templates" / "default.yaml").read_text()
        padding = "x" * (24 << 20)  # larger than any socket buffer on loopback
        big.write_text(
            template.replace("persist: true", f"persist: true\nnote: {padding}")
        )
        await self.addDevice("w1", "SER1", UUID1, cluster="big")
        codes = await self.provision("w1")
        path = configPath(codes["w1"], UUID1, "SER1")
        port = self.port(self.service, "boot")

        def readALittleThenReset() -> bytes:
            context = ssl.create_default_context(cafile=str(self.pki.public_ca))
            raw = socket.create_connection(("127.0.0.1", port), timeout=30)
            tls = context.wrap_socket(raw, server_hostname="localhost")
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            head = tls.recv(64)
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            tls.close()
            return head

        head = await deferToThread(readALittleThenReset)
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        events = await self.events("run.delivery-aborted")  # the server saw the reset
        self.assertIn("run.delivery-aborted", events)
        status, _, body = await self.fetch(path)
        self.assertEqual(status, 200)
        self.assertEqual(len(body) > (24 << 20), True)


class RestartDeliveryTests(DeliveryMixin, TestCase):
    timeout = 120

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        return self.startLoaded()

    async def restart(self, wipeVault: bool = False) -> None:
        await self.service.stopService()
        if wipeVault:
            shutil.rmtree(self.settings.vault)
        self.service = self.startDaemon()
        await self.service.loading.whenReady()

    async def test_restart_foreignConfigFile_refusedBeforeRunsLoad(self) -> None:
        """
        [V2] Issue 17 item 17: the daemon checks the vault's entries while
        it reads the runs, and a run's configuration file that
        is not fleetd's is refused and removed before any run is restored
        from it: the run is lost, never ready. As root.
        """
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        await self.service.stopService()
        configs = [p for p in self.settings.vault.iterdir() if p.suffix == ".yaml"]
        self.assertEqual(len(configs), 1)
        giveAway(self, configs[0])
        logged = self.captureLogs()
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        # The vault was checked (beside the database reads) before any
        # run was restored from it: the file was never counted ready.
        (loaded,) = [
            e for e in logged if e.get("log_format", "").startswith("runs.loaded")
        ]
        self.assertEqual((loaded["runs"], loaded["ready"]), (1, 0))
        refused = [e["name"] for e in logged if e.get("log_format") == REFUSED]
        self.assertEqual(refused, [configs[0].name])
        self.assertFalse(configs[0].exists())
        status, _, body = await self.fetch(configPath(codes["w1"], UUID1, "SER1"))
        self.assertEqual((status, body.split(b":")[0]), (410, b"lost"))

    async def test_restart_readyOnceConsumedRefused(self) -> None:
        """[V2][C1] Across a restart: ready delivered once, consumed refused."""
        await self.addDevice("w1", "SER1", UUID1)
        await self.addDevice("w2", "SER2", UUID2)
        codes = await self.provision("w1", "w2")
        self.assertEqual(
            (await self.fetch(configPath(codes["w1"], UUID1, "SER1")))[0], 200
        )
        await self.restart()
        self.assertEqual(
            (await self.fetch(configPath(codes["w1"], UUID1, "SER1")))[0], 410
        )
        self.assertEqual(
            (await self.fetch(configPath(codes["w2"], UUID2, "SER2")))[0], 200
        )
        self.assertEqual(
            (await self.fetch(configPath(codes["w2"], UUID2, "SER2")))[0], 410
        )

    async def test_reboot_missingVersusRefetched(self) -> None:
        """
        [V4][C2][V5] After a reboot (vault emptied): the released run is
        consumed, the undelivered one lost (device planned, alert up); a new
        provision recovers and clears the alert.
        """
        await self.addDevice("w1", "SER1", UUID1)
        await self.addDevice("w2", "SER2", UUID2)
        codes = await self.provision("w1", "w2")
        self.assertEqual(
            (await self.fetch(configPath(codes["w1"], UUID1, "SER1")))[0], 200
        )
        await self.events("run.delivered")  # released with it: survives a reboot
        await self.restart(wipeVault=True)
        status, _, body = await self.fetch(configPath(codes["w1"], UUID1, "SER1"))
        self.assertEqual((status, body.split(b":")[0]), (410, b"consumed"))
        status, _, body = await self.fetch(configPath(codes["w2"], UUID2, "SER2"))
        self.assertEqual((status, body.split(b":")[0]), (410, b"lost"))
        # The series go up once their first requests are stored [J1] [V6].
        await self.events("config.missing", "config.refetched")
        _, _, metrics = await self.get(self.service, "admin", "/metrics")
        self.assertIn(b'fleetd_install_config_missing{device="w2"} 1.0', metrics)
        self.assertIn(b'fleetd_install_config_refetched{device="w1"} 1.0', metrics)
        status, doc = await self.admin("GET", "/v1/admin/devices/w2", None)
        self.assertEqual(doc["status"], "planned")
        # Recovery: a new provision.
        new = await self.provision("w2")
        self.assertEqual(
            (await self.fetch(configPath(new["w2"], UUID2, "SER2")))[0], 200
        )
        _, _, metrics = await self.get(self.service, "admin", "/metrics")
        self.assertNotIn(b'fleetd_install_config_missing{device="w2"}', metrics)


class SecretsTests(DeliveryMixin, TestCase):
    timeout = 120

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        self.logged = self.captureLogs()
        return self.startLoaded()

    async def test_fullScenario_noSecretInLogsOrJournal(self) -> None:
        """No code or config body reaches a log line or the journal."""
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        path = configPath(codes["w1"], UUID1, "SER1")
        status, _, body = await self.fetch(path)
        self.assertEqual(status, 200)
        # The dev config fills the example's placeholders (issue 27).
        self.assertNotIn(b"REPLACE-WITH", body)
        machine = next(yaml.safe_load_all(body))
        secret, trustd = machine["cluster"]["secret"], machine["machine"]["token"]
        await self.fetch(path)
        await self.fetch(configPath(codes["w1"], UUID2, "SER1"))
        await self.service.stopService()
        secretish = [codes["w1"], secret, trustd]
        logged = "\n".join(repr(e) for e in self.logged)
        self.assertIn("/config", logged)
        for secret in secretish:
            self.assertNotIn(secret, logged)
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        journal = json.dumps(await self.journal())
        for secret in secretish:
            self.assertNotIn(secret, journal)

    async def test_anyMethod_noCodeInLogs(self) -> None:
        """
        [A2] [C1] HEAD, OPTIONS, TRACE and made-up methods on /config with a
        live code, one by one and 200 pipelined HEADs, are 405s (HEAD with
        headers only) that consume nothing, and the code appears in no log
        event and no formatted log line, text or JSON.
        """
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        path = configPath(codes["w1"], UUID1, "SER1")
        port = self.port(self.service, "boot")
        for method in ("HEAD", "OPTIONS", "FOO", "TRACE", "POST", "DELETE"):
            status, _, body = await deferToThread(
                httpsGet, port, path, self.pki.public_ca, None, method
            )
            self.assertEqual(status, 405, method)
            self.assertEqual(body, b"" if method == "HEAD" else b"method not allowed\n")
        heads = (f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n" * 200).encode()
        last = f"FOO {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        answer = await deferToThread(
            rawTLS, port, self.pki.public_ca, heads + last.encode()
        )
        self.assertEqual(answer.count(b"HTTP/1.1 405 "), 201)
        self.assertEqual(answer.count(b"method not allowed\n"), 1)  # FOO's only
        # None of that consumed the run; the node still gets its config.
        self.assertEqual((await self.fetch(path))[0], 200)
        await self.service.stopService()
        logged = "\n".join(repr(e) for e in self.logged)
        self.assertIn("/config", logged)
        self.assertFalse(codes["w1"] in logged, "the code is in a log event")
        for fmt in ("text", "json"):
            out = io.StringIO()
            observer = makeObserver(fmt, out)
            for event in self.logged:
                observer(event)
            self.assertIn("/config", out.getvalue())
            self.assertFalse(codes["w1"] in out.getvalue(), f"the code is in {fmt}")


class BruteForceTests(DeliveryMixin, TestCase):
    timeout = 120

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        return self.startLoaded({"boot": {"failure_burst": 5, "failure_rate": 0.001}})

    async def test_codeGuessing_limitedPerSource(self) -> None:
        """Guessing codes costs tokens per source; an empty bucket gets cheap 429s."""
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        statuses = []
        for i in range(8):
            guess = configPath(f"{i:032d}", UUID1, "SER1")
            statuses.append((await self.fetch(guess))[0])
        self.assertEqual(statuses, [404] * 5 + [429] * 3)
        # Limited sources are refused before any lookup, even with the right code.
        status, _, body = await self.fetch(configPath(codes["w1"], UUID1, "SER1"))
        self.assertEqual((status, body), (429, b"too many requests\n"))
        _, _, metrics = await self.get(self.service, "admin", "/metrics")
        self.assertIn(
            b'fleetd_config_requests_total{outcome="rate_limited"} 4.0', metrics
        )


def fetchFrom(source: str, port: int, path: str, ca: Path) -> int:
    """GET over TLS from the loopback address C{source} (another node)."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(
        "localhost", port, timeout=30, context=context, source_address=(source, 0)
    )
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


class GlobalLimitTests(DeliveryMixin, TestCase):
    timeout = 120

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        return self.startLoaded(
            {
                "boot": {
                    "failure_burst": 3,
                    "failure_rate": 0.001,
                    "global_failure_burst": 6,
                    "global_failure_rate": 0.001,
                }
            }
        )

    async def test_globalLimit_guessersRefusedNodesServed(self) -> None:
        """
        The global failure budget stops guessing spread over many sources,
        without refusing a node that never failed.
        """
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        port = self.port(self.service, "boot")
        ca = self.pki.public_ca

        async def guess(source: str, i: int) -> int:
            path = configPath(f"{i:032d}", UUID1, "SER1")
            status: int = await deferToThread(fetchFrom, source, port, path, ca)
            return status

        # Three guessers spend the global budget of 6 between them.
        statuses = [await guess(f"127.0.0.{2 + i % 3}", i) for i in range(6)]
        self.assertEqual(statuses, [404] * 6)
        # A guesser that failed before is now refused by the global limit...
        self.assertEqual(await guess("127.0.0.2", 99), 429)
        # ...and so is a fresh one once it failed once (its first guess is free).
        self.assertEqual(await guess("127.0.0.7", 100), 404)
        self.assertEqual(await guess("127.0.0.7", 101), 429)
        # A node that never failed still gets its configuration.
        path = configPath(codes["w1"], UUID1, "SER1")
        self.assertEqual(
            await deferToThread(fetchFrom, "127.0.0.9", port, path, ca), 200
        )
