"""
The RFC 8628 device flow through the whole daemon over real TLS: Talos asks
for a code, the owner approves it with fleetctl, Talos polls for the token
and fetches its configuration once with it.
"""

from __future__ import annotations

import http.client
import io
import json
import ssl
import urllib.parse
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from fleetd.cli import fleetctl
from tests.support import writeConfig
from tests.test_delivery import UUID1, DeliveryMixin

GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def boot(
    port: int, ca: str, method: str, path: str,
    form: dict[str, str] | None = None, bearer: str | None = None,
) -> tuple[int, bytes]:  # fmt: skip
    context = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection("localhost", port, timeout=30, context=context)
    headers = {}
    body = None
    if form is not None:
        body = urllib.parse.urlencode(form).encode()
        headers["content-type"] = "application/x-www-form-urlencoded"
    if bearer is not None:
        headers["authorization"] = f"Bearer {bearer}"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class DeviceFlowDaemonTests(DeliveryMixin, TestCase):
    timeout = 120

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        self.logged = self.captureLogs()
        return self.startLoaded()

    async def call(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        port = self.port(self.service, "boot")
        result: tuple[int, bytes] = await deferToThread(
            boot, port, str(self.pki.public_ca), *args, **kwargs
        )
        return result

    async def _flow(self) -> None:
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        status, body = await self.call(
            "POST", "/device/code",
            {"client_id": "talos", "uuid": UUID1, "serial": "SER1", "hostname": "t"},
        )  # fmt: skip
        self.assertEqual(status, 200, body)
        grant = json.loads(body)
        self.assertRegex(
            grant["user_code"], r"^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$"
        )
        poll = {"grant_type": GRANT, "device_code": grant["device_code"],
                "client_id": "talos"}  # fmt: skip
        status, body = await self.call("POST", "/token", poll)
        self.assertEqual(
            (status, json.loads(body)["error"]), (400, "authorization_pending")
        )

        config = writeConfig(
            self.directory,
            {
                "owner": {
                    "server": f"https://localhost:{self.port(self.service, 'admin')}"
                }
            },
        )
        out, err = io.StringIO(), io.StringIO()
        code = await deferToThread(
            fleetctl.main,
            ["--config", str(config), "approve", grant["user_code"], "--device", "w1"],
            out, err,
        )  # fmt: skip
        self.assertEqual(code, 0, err.getvalue())
        self.assertIn(UUID1, out.getvalue())

        status, body = await self.call("POST", "/token", poll)
        self.assertEqual(status, 200, body)
        token = json.loads(body)
        self.assertEqual(token["token_type"], "Bearer")
        status, body = await self.call("GET", "/config", bearer=token["access_token"])
        self.assertEqual(status, 200)
        self.assertIn(b"hostname: w1", body)
        status, body = await self.call("GET", "/config", bearer=token["access_token"])
        self.assertEqual(status, 410)
        status, _ = await self.call("GET", "/config", bearer="not-a-token")
        self.assertEqual(status, 404)
        wanted = ("deviceflow.approved", "deviceflow.issued", "run.delivered")
        events = await self.events(*wanted)
        for event in wanted:
            self.assertIn(event, events)
        secrets = [grant["device_code"], token["access_token"], codes["w1"]]
        logged = "\n".join(repr(e) for e in self.logged)
        journal = json.dumps(await self.journal())
        self.assertIn(grant["user_code"], journal)
        for secret in secrets:
            self.assertNotIn(secret, logged)
            self.assertNotIn(secret, journal)

    def test_deviceFlow_endToEnd(self) -> None:
        """
        POST /device/code, fleetctl approve, POST /token, then GET /config
        with the bearer token: 200 once, then 410 consumed; no device code,
        access token or one-time code in any log line or journal entry.
        """
        return ensureDeferred(self._flow())  # type: ignore[return-value]
