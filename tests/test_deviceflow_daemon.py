"""
The RFC 8628 device flow through the whole daemon over real TLS: Talos asks
for a code, the owner approves it with fleetctl, Talos polls for the token
and fetches its configuration once with it.  These tests speak only HTTP
and fleetctl, so they hold for any implementation of the flow.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.daemonsupport import UUID1, DeliveryMixin
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig

GRANT = "urn:ietf:params:oauth:grant-type:device_code"
RFC8628 = {"authorization_pending", "slow_down"}


def boot(
    port: int, ca: str, method: str, path: str,
    form: dict[str, str] | None = None, bearer: str | None = None,
    source: str = "127.0.0.1",
) -> tuple[int, bytes]:  # fmt: skip
    context = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection(
        "localhost", port, timeout=30, context=context, source_address=(source, 0)
    )
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

    async def fleetctl(self, *argv: str) -> tuple[int, str, str]:
        admin = self.port(self.service, "admin")
        return await fleetctlAgainst(ownerConfig(self.directory, admin), *argv)

    async def requestCode(self, serial: str = "SER1", **extra: str) -> dict[str, Any]:
        form = {"client_id": "talos", "uuid": UUID1, "serial": serial, **extra}
        status, body = await self.call("POST", "/device/code", form)
        self.assertEqual(status, 200, body)
        grant: dict[str, Any] = json.loads(body)
        return grant

    async def poll(self, grant: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        form = {"grant_type": GRANT, "device_code": grant["device_code"],
                "client_id": "talos"}  # fmt: skip
        status, body = await self.call("POST", "/token", form)
        document: dict[str, Any] = json.loads(body)
        return status, document

    async def provisionRun(self, name: str) -> str:
        status, doc = await self.admin(
            "POST", "/v1/admin/provision", {"devices": [name]}
        )
        self.assertEqual(status, 201, doc)
        run: str = doc["runs"][0]["run"]
        return run

    async def test_deviceFlow_endToEnd(self) -> None:
        """
        POST /device/code, fleetctl approve, POST /token, then GET /config
        with the bearer token: 200 once, then 410 consumed; no device code,
        access token, user code or one-time code in any log line or journal
        entry (user codes are secrets too).
        """
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        grant = await self.requestCode(hostname="t")
        self.assertRegex(
            grant["user_code"], r"^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$"
        )
        status, document = await self.poll(grant)
        self.assertEqual((status, document["error"]), (400, "authorization_pending"))
        code, out, err = await self.fleetctl(
            "approve", grant["user_code"], "--device", "w1"
        )
        self.assertEqual(code, 0, err)
        self.assertIn(UUID1, out)
        status, token = await self.poll(grant)
        self.assertEqual(status, 200, token)
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
        secrets = [
            grant["device_code"],
            token["access_token"],
            codes["w1"],
            grant["user_code"],
            grant["user_code"].replace("-", ""),
        ]
        logged = "\n".join(repr(e) for e in self.logged)
        journal = json.dumps(await self.journal())
        for secret in secrets:
            self.assertNotIn(secret, logged)
            self.assertNotIn(secret, journal)

    async def test_token_reprovisionAfterApproval_deliversCurrentRun(self) -> None:
        """
        [F2] The token is bound to the device, not to a run: after the owner
        provisions again, the token delivers the device's run that is ready
        at the GET, and only once.
        """
        await self.addDevice("w1", "SER1", UUID1)
        first = await self.provisionRun("w1")
        grant = await self.requestCode()
        code, _, err = await self.fleetctl(
            "approve", grant["user_code"], "--device", "w1"
        )
        self.assertEqual(code, 0, err)
        status, token = await self.poll(grant)
        self.assertEqual(status, 200, token)
        second = await self.provisionRun("w1")  # the owner provisions again
        self.assertNotEqual(first, second)
        status, body = await self.call("GET", "/config", bearer=token["access_token"])
        self.assertEqual(status, 200, body)
        await self.events("run.delivered")  # recorded once the OS has the body
        entries = await self.journal()
        delivered = [e["run"] for e in entries if e["event"] == "run.delivered"]
        self.assertEqual(delivered, [second])
        third = await self.provisionRun("w1")  # one delivery per token, ever
        status, _ = await self.call("GET", "/config", bearer=token["access_token"])
        self.assertEqual(status, 410)
        self.assertTrue(third)

    async def test_token_hammered_slowDownNever429(self) -> None:
        """
        [F1] Polling /token far too fast gets slow_down (RFC 8628), never a
        429 (which ends golang.org/x/oauth2's flow), and the token still
        comes after approval.
        """
        await self.addDevice("w1", "SER1", UUID1)
        await self.provision("w1")
        grant = await self.requestCode()
        answers = []
        for _ in range(30):  # far faster than the interval, probe pairs included
            status, document = await self.poll(grant)
            answers.append((status, document.get("error")))
        self.assertEqual({status for status, _ in answers}, {400})
        self.assertLessEqual({error for _, error in answers}, RFC8628)
        self.assertIn((400, "slow_down"), answers)
        code, _, err = await self.fleetctl(
            "approve", grant["user_code"], "--device", "w1"
        )
        self.assertEqual(code, 0, err)
        status, token = await self.poll(grant)
        self.assertEqual(status, 200, token)

    async def test_verificationURI_adminDevicePage(self) -> None:
        """
        [F3] verification_uri is the admin listener's /device under the
        enrollment name (verification_uri_complete adds the user code);
        that page is the console's verification page, for owners only; the
        boot listener has no /device [A2].
        """
        grant = await self.requestCode()
        admin = self.port(self.service, "admin")
        self.assertEqual(
            grant["verification_uri"], f"https://enroll.lolwtf.ca:{admin}/device"
        )
        self.assertEqual(
            grant["verification_uri_complete"],
            f"https://enroll.lolwtf.ca:{admin}/device?user_code={grant['user_code']}",
        )
        status, kind, body = await self.get(
            self.service, "admin", "/device", owner=True
        )
        self.assertEqual((status, kind), (200, b"text/html; charset=utf-8"))
        self.assertIn(b'name="user_code"', body)
        # listed by its public id, never by its user code (the owner types it)
        self.assertNotIn(grant["user_code"].encode(), body)
        (pending,) = self.service.deviceFlow.pending()
        self.assertIn(pending.id.encode(), body)
        status, _, body = await self.get(self.service, "admin", "/device")
        self.assertEqual(status, 403)
        self.assertNotIn(grant["user_code"].encode(), body)
        status, _, _ = await self.get(self.service, "boot", "/device")
        self.assertEqual(status, 404)

    async def test_flood_manySources_knownNodeStillGetsCode(self) -> None:
        """
        [F4] 300 requests from 150 loopback addresses fill the strangers'
        pool (refusals are 429/503), yet a node that reports an inventory
        device's uuid and serial still gets its code.
        """
        await self.addDevice("w1", "SER1", UUID1)
        await self.provision("w1")
        port, ca = self.port(self.service, "boot"), str(self.pki.public_ca)

        def flood() -> list[int]:
            def one(i: int) -> int:
                form = {"client_id": "talos", "uuid": f"u{i}", "serial": f"s{i}"}
                source = f"127.0.{1 + i // 500}.{2 + (i // 2) % 250}"
                return boot(port, ca, "POST", "/device/code", form, source=source)[0]

            with ThreadPoolExecutor(4) as pool:
                return list(pool.map(one, range(300)))

        statuses: list[int] = await deferToThread(flood)
        self.assertIn(200, statuses)
        refused = [s for s in statuses if s != 200]
        self.assertTrue(refused, "the strangers' pool must fill")
        self.assertLessEqual(set(refused), {429, 503})
        # The known node is not locked out; a stranger from a fresh address is.
        status, body = await self.call(
            "POST", "/device/code",
            {"client_id": "talos", "uuid": UUID1.upper(), "serial": "ser1"},
            source="127.0.3.10",
        )  # fmt: skip
        self.assertEqual(status, 200, body)
        status, _ = await self.call(
            "POST", "/device/code", {"client_id": "talos"}, source="127.0.3.9"
        )
        self.assertEqual(status, 503)

    async def test_fleetctlApprove_serialCaseInsensitive(self) -> None:
        """
        fleetctl approve compares serials without regard to case, as the
        server does: a node reporting ser1 for SER1 is approved without
        --force.
        """
        await self.addDevice("w1", "SER1", UUID1)
        await self.provision("w1")
        grant = await self.requestCode(serial="ser1")
        code, out, err = await self.fleetctl(
            "approve", grant["user_code"], "--device", "w1"
        )
        self.assertEqual((code, err), (0, ""))
        self.assertNotIn("MISMATCH", out)

    async def test_fleetctlApprove_forceJournaledAsForced(self) -> None:
        """
        A mismatch is refused without --force; with it the approval is
        journaled forced=true with what differed (reported and inventory
        serial).
        """
        await self.addDevice("w1", "SER1", UUID1)
        await self.provision("w1")
        grant = await self.requestCode(serial="OTHER")
        code, _, err = await self.fleetctl(
            "approve", grant["user_code"], "--device", "w1"
        )
        self.assertEqual(code, 1)
        self.assertIn("MISMATCH", err)
        code, _, err = await self.fleetctl(
            "approve", grant["user_code"], "--device", "w1", "--force"
        )
        self.assertEqual(code, 0, err)
        (entry,) = [
            e for e in await self.journal() if e["event"] == "deviceflow.approved"
        ]
        self.assertIs(entry["fields"]["forced"], True)
        self.assertEqual(entry["fields"]["mismatch"], "serial")
        self.assertEqual(entry["fields"]["serial"], "OTHER")
        self.assertEqual(entry["fields"]["inventory_serial"], "SER1")

    async def _journalFails(self, argv: Callable[[str], list[str]]) -> None:
        await self.addDevice("w1", "SER1", UUID1)
        await self.provision("w1")
        grant = await self.requestCode()
        journal: Any = self.service.journal
        journal.append = lambda *a, **k: fail(OSError("disk full"))
        try:
            code, _, err = await self.fleetctl(*argv(grant["user_code"]))
        finally:
            del journal.append
        self.assertNotEqual(code, 0)
        self.assertEqual(err.count("\n"), 1, err)
        for _ in range(3):
            status, document = await self.poll(grant)
            self.assertEqual(status, 400)
            self.assertIn(document["error"], RFC8628)
        events = [e["event"] for e in await self.journal()]
        self.assertNotIn("deviceflow.approved", events)
        self.assertNotIn("deviceflow.denied", events)
        self.assertNotIn("deviceflow.issued", events)
        # Nothing changed: the owner can decide again once the journal works.
        code, _, err = await self.fleetctl(*argv(grant["user_code"]))
        self.assertEqual(code, 0, err)

    async def test_approve_journalFails_noToken(self) -> None:
        """
        [J1] An approval whose journal entry fails changes nothing: the
        owner gets one line, the node keeps hearing authorization_pending
        and gets no token, and the request can be approved later.
        """
        await self._journalFails(lambda user: ["approve", user, "--device", "w1"])

    async def test_deny_journalFails_nothingChanges(self) -> None:
        """
        [J1] A denial whose journal entry fails changes nothing: the node
        keeps hearing authorization_pending, not access_denied.
        """
        await self._journalFails(lambda user: ["approve", user, "--deny"])
