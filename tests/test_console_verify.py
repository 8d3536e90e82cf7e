"""
The console's verification page C{/device} (issue 20 item 1; docs/design.md,
the owner console) over a real daemon through StubTreq: a node runs the device
flow on the boot listener; the owner looks its user code up, sees what it
reported beside the inventory record, and approves or denies.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.consolesupport import ConsoleMixin, text
from tests.daemonsupport import UUID1, UUID2
from tests.test_deviceflow_daemon import GRANT, boot

NODE_CODE = "one-time-node-code-Zq81"  # the one-time code a node reports
MAC = "52:54:00:ab:cd:ef"
SCRIPT = "<script>alert(1)</script>"


class DeviceFlowNodeCase(ConsoleMixin, TestCase):
    """A daemon, its console, and a node running the device flow (no tests)."""

    timeout = 120

    async def setUpDevice(self, serial: str = "SER1", **extra: Any) -> None:
        await self.startConsole()
        await self.addDevice("w1", serial, UUID1, macs=[MAC], **extra)
        await self.provision("w1")

    async def node(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        port = self.port(self.service, "boot")
        status, body = await deferToThread(
            boot, port, str(self.pki.public_ca), method, path, **kwargs
        )
        return status, body

    async def requestCode(self, serial: str = "SER1", **extra: str) -> dict[str, Any]:
        """A node starts the device flow, reporting what Talos reports."""
        form = {"client_id": "talos", "uuid": UUID1, "serial": serial,
                "mac": MAC.upper(), "hostname": "talos-x1", "code": NODE_CODE,
                **extra}  # fmt: skip
        status, body = await self.node("POST", "/device/code", form=form)
        self.assertEqual(status, 200, body)
        grant: dict[str, Any] = json.loads(body)
        self.secrets = [NODE_CODE, grant["device_code"]]
        return grant

    async def poll(self, grant: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        form = {"grant_type": GRANT, "device_code": grant["device_code"],
                "client_id": "talos"}  # fmt: skip
        status, body = await self.node("POST", "/token", form=form)
        document: dict[str, Any] = json.loads(body)
        return status, document

    async def show(self, path: str, code: int = 200, **kw: Any) -> str:
        status, _, body = await self.page("GET", path, **kw)
        self.assertEqual(status, code, text(body))
        self.assertNoSecret(body)
        return body

    async def decide(self, form: dict[str, str], code: int = 200, **kw: Any) -> str:
        status, _, body = await self.page("POST", "/device", form, **kw)
        self.assertEqual(status, code, text(body))
        self.assertNoSecret(body)
        return body

    def assertNoSecret(self, body: str) -> None:
        for secret in getattr(self, "secrets", ()):
            self.assertNotIn(secret, body)

    async def decisions(self) -> list[dict[str, Any]]:
        return [e for e in await self.journal() if e["event"].startswith("deviceflow.")]


class VerifyPageTests(DeviceFlowNodeCase):
    async def test_lookup_reportedBesideRecord(self) -> None:
        """
        The pending list names the request by its public id (not its user
        code: the owner types the code the node shows); the
        lookup, by a code typed in lower case without its dash, shows what
        the node reported beside the inventory record, nothing marked, and
        decides nothing.
        """
        await self.setUpDevice()
        grant = await self.requestCode()
        user = grant["user_code"]
        body = await self.show("/device")
        self.assertIn('data-refresh="10"', body)
        self.assertIn('name="user_code"', body)
        self.assertNotIn(user, body)  # typed by the owner, never listed
        (pending,) = self.service.deviceFlow.pending()
        self.assertIn(pending.id, text(body))
        self.assertIn("talos-x1", text(body))
        body = await self.show("/device?user_code=" + user.lower().replace("-", ""))
        self.assertNotIn("data-refresh", body)
        shown = text(body)
        for value in (UUID1, "SER1", MAC.upper(), MAC, "talos-x1", "127.0.0.1",
                      "w1", "worker", "planned"):  # fmt: skip
            self.assertIn(value, shown)
        self.assertNotIn("differs", shown)
        self.assertIn('name="device" value="w1"', body)
        self.assertIn('name="action" value="approve"', body)
        self.assertIn('name="action" value="deny"', body)
        self.assertNotIn("confirm_mismatch", body)
        self.assertEqual(await self.decisions(), [])
        _, document = await self.poll(grant)
        self.assertEqual(document["error"], "authorization_pending")

    async def test_completeURI_opensTheLookup(self) -> None:
        """The path of verification_uri_complete opens this request's lookup."""
        await self.setUpDevice()
        grant = await self.requestCode()
        complete = grant["verification_uri_complete"]
        path = complete[complete.index("/device") :]
        body = await self.show(path)
        self.assertIn(f'name="user_code" value="{grant["user_code"]}"', body)
        self.assertIn(UUID1, text(body))

    async def test_otherDevice_differencesMarked(self) -> None:
        """
        C{device} chooses the record to compare: another device's uuid and
        serial are marked as differing, and so is a MAC the record lacks.
        """
        await self.setUpDevice()
        await self.addDevice("w2", "SER2", UUID2, macs=["52:54:00:00:00:99"])
        grant = await self.requestCode()
        body = await self.show(f"/device?user_code={grant['user_code']}&device=w2")
        shown = text(body)
        self.assertIn("SER2", shown)
        self.assertEqual(shown.count("differs: approving needs a second step"), 2)
        self.assertIn("not among the record's MACs", shown)
        body = await self.show(
            f"/device?user_code={grant['user_code']}&device=w9", code=404
        )
        self.assertIn("No device named", text(body))
        self.assertNotIn('value="approve"', body)

    async def test_nodeAndInventoryValues_escaped(self) -> None:
        """
        A serial of C{<script>} reported by a node, and one held by the
        inventory, render as text in the list and the comparison.
        """
        await self.startConsole()
        await self.addDevice("w1", "<script>alert(2)</script>", UUID1)
        await self.provision("w1")
        grant = await self.requestCode(serial=SCRIPT, hostname="<b>x</b>")
        for path in ("/device", f"/device?user_code={grant['user_code']}&device=w1"):
            body = await self.show(path)
            self.assertNotIn("<script>alert", body)
            self.assertNotIn("<b>x", body)
            self.assertIn("&lt;script&gt;alert(1)&lt;/script&gt;", body)
            self.assertIn("&lt;b&gt;x&lt;/b&gt;", body)
        self.assertIn("&lt;script&gt;alert(2)&lt;/script&gt;", body)
        self.assertIn(SCRIPT, text(body))

    async def test_approve_journaledViaConsole_nodeFetches(self) -> None:
        """
        Approving journals what fleetctl's approval does, by the viewer,
        with via=console; the node's next poll gets its token and its
        configuration.
        """
        await self.setUpDevice()
        grant = await self.requestCode()
        form = {"user_code": grant["user_code"], "device": "w1", "action": "approve"}
        body = await self.decide(form)
        self.assertIn("will fetch its configuration on its next poll", text(body))
        (entry,) = await self.decisions()
        self.assertEqual(
            (entry["event"], entry["actor"], entry["device"]),
            ("deviceflow.approved", "owner:alice", "w1"),
        )
        self.assertEqual(entry["fields"]["via"], "console")
        self.assertNotIn("forced", entry["fields"])
        status, token = await self.poll(grant)
        self.assertEqual(status, 200, token)
        status, body = await self.node("GET", "/config", bearer=token["access_token"])
        self.assertEqual(status, 200)
        self.assertIn(b"hostname: w1", body)

    async def test_mismatch_needsTheSecondStep(self) -> None:
        """
        Approving a node that reported another serial is refused (409) with
        the difference explained and the box C{confirm_mismatch}; nothing
        is journaled. With the box ticked and the difference the 409 page
        carried (accept_mismatch) it is approved, journaled forced; another
        difference is refused.
        """
        await self.setUpDevice()
        grant = await self.requestCode(serial="SER-OTHER")
        body = await self.show(f"/device?user_code={grant['user_code']}&device=w1")
        self.assertNotIn("confirm_mismatch", body)
        form = {"user_code": grant["user_code"], "device": "w1", "action": "approve"}
        body = await self.decide(form, 409)
        self.assertIn('name="confirm_mismatch"', body)
        self.assertIn("another serial than w1", " ".join(text(body).split()))
        self.assertEqual(await self.decisions(), [])
        _, document = await self.poll(grant)
        self.assertEqual(document["error"], "authorization_pending")
        # the second step's form carries exactly the difference it showed
        self.assertIn('name="accept_mismatch" value="serial"', body)
        self.assertEqual(body.count('name="accept_mismatch"'), 1)
        # a difference other than the one shown is refused by the flow
        wrong = {**form, "confirm_mismatch": "yes", "accept_mismatch": "uuid"}
        body = await self.decide(wrong, 409)
        self.assertEqual(await self.decisions(), [])
        second = {**form, "confirm_mismatch": "yes", "accept_mismatch": "serial"}
        body = await self.decide(second)
        self.assertIn("journaled as forced", text(body))
        (entry,) = await self.decisions()
        self.assertEqual(entry["actor"], "owner:alice")
        fields = entry["fields"]
        self.assertEqual(
            (fields["forced"], fields["mismatch"], fields["via"]),
            (True, "serial", "console"),
        )
        self.assertEqual((fields["serial"], fields["inventory_serial"]),
                         ("SER-OTHER", "SER1"))  # fmt: skip

    async def test_deny(self) -> None:
        """Denying journals via=console; the node's poll gets access_denied."""
        await self.setUpDevice()
        grant = await self.requestCode()
        form = {"user_code": grant["user_code"], "device": "w1", "action": "deny"}
        body = await self.decide(form)
        self.assertIn("Denied", text(body))
        (entry,) = await self.decisions()
        self.assertEqual(
            (entry["event"], entry["actor"], entry["fields"]["via"]),
            ("deviceflow.denied", "owner:alice", "console"),
        )
        status, document = await self.poll(grant)
        self.assertEqual((status, document["error"]), (400, "access_denied"))
        body = await self.decide(form, 409)  # decided once
        self.assertIn("already-decided", text(body))
        await self.show(f"/device?user_code={grant['user_code']}", code=409)

    async def test_refusal_pageSaysTheOwnerAPIsLine_thenItsHint(self) -> None:
        """
        A refused decision's page shows the owner API's line for it (its
        kind first: a device-flow refusal is a reason-coded Refused) and
        then the console's hint, in one line.
        """
        await self.setUpDevice()
        grant = await self.requestCode()
        form = {"user_code": grant["user_code"], "device": "w1", "action": "deny"}
        await self.decide(form)
        body = text(await self.decide(form, 409))
        self.assertIn("already-decided: ", body)
        self.assertIn(" (a request is decided once)", body)

    async def test_unknownCodes_spendTheBudget(self) -> None:
        """
        RFC 8628 5.1: each unknown (or malformed) code looked up counts;
        after 5, even the right code is refused (429), to lookups and
        decisions alike.
        """
        await self.setUpDevice()
        grant = await self.requestCode()
        for guess in ("BBBB-BBBB", "CCCC-CCCC", "nonsense", "DDDD-DDDD", "FFFFGGGG"):
            body = await self.show(f"/device?user_code={guess}", code=404)
            self.assertIn("unknown-user-code", text(body))
        body = await self.show(f"/device?user_code={grant['user_code']}", code=429)
        self.assertIn("too-many-attempts", text(body))
        form = {"user_code": grant["user_code"], "device": "w1", "action": "approve"}
        await self.decide(form, 429)
        self.assertEqual(await self.decisions(), [])

    async def test_crossSiteLookup_refusedFree(self) -> None:
        """
        A lookup another site's page makes the browser send (its
        Sec-Fetch-Site says so) is refused before it spends the budget.
        """
        await self.setUpDevice()
        grant = await self.requestCode()
        for site in ("cross-site", "same-site", "cross-site", "cross-site",
                     "cross-site", "cross-site"):  # fmt: skip
            headers = {"sec-fetch-site": site}
            await self.show("/device?user_code=BBBB-BBBB", 403, headers=headers)
        headers = {"sec-fetch-site": "none"}  # typed, or opened from a QR code
        await self.show(f"/device?user_code={grant['user_code']}", headers=headers)

    async def test_noOwner_403(self) -> None:
        """Without an owner every request is refused, as the API refuses."""
        await self.setUpDevice()
        grant = await self.requestCode()
        user = grant["user_code"]
        for path in ("/device", f"/device?user_code={user}"):
            status, _, body = await self.page("GET", path, owner=None)
            self.assertEqual(status, 403)
            self.assertNotIn(user, body)
        form = {"user_code": user, "device": "w1", "action": "approve"}
        status, _, _ = await self.page("POST", "/device", form, owner=None)
        self.assertEqual(status, 403)
        self.assertEqual(await self.decisions(), [])

    async def test_postWithoutCSRF_403(self) -> None:
        """A decision without the CSRF token is refused; nothing changes."""
        await self.setUpDevice()
        grant = await self.requestCode()
        form = {"user_code": grant["user_code"], "device": "w1", "action": "approve"}
        status, _, body = await self.page("POST", "/device", form, csrf=False)
        self.assertEqual(status, 403)
        self.assertIn("CSRF", body)
        self.assertEqual(await self.decisions(), [])
        self.assertEqual(len(self.service.deviceFlow.pending()), 1)

    async def test_badDecisions_refused(self) -> None:
        """No action, no device, or an unknown device: refused, no change."""
        await self.setUpDevice()
        grant = await self.requestCode()
        user = grant["user_code"]
        await self.decide({"user_code": user, "device": "w1", "action": "x"}, 400)
        await self.decide({"user_code": user, "action": "approve"}, 400)
        await self.decide({"user_code": user, "device": "w9", "action": "approve"}, 404)
        await self.decide({"device": "w1", "action": "approve"}, 400)
        self.assertEqual(await self.decisions(), [])
        self.assertEqual(len(self.service.deviceFlow.pending()), 1)


class FormOriginTests(ConsoleMixin, TestCase):
    """
    The gate's origin check as browsers send it: under the console's
    C{Referrer-Policy: no-referrer} Chromium names the origin of the
    console's own forms C{null}; C{Sec-Fetch-Site} then tells whose form
    it is.
    """

    timeout = 60

    async def post(self, **headers: str) -> int:
        form = {"user_code": "BBBB-BBBB", "action": "deny"}
        status, _, _ = await self.page("POST", "/device", form, headers=headers)
        return status

    async def test_nullOrigin_sameOriginFetch_admitted(self) -> None:
        """The console's own form, as Chromium posts it, reaches the page."""
        await self.startConsole()
        same = {"sec-fetch-site": "same-origin"}
        self.assertEqual(await self.post(origin="null", **same), 404)  # no such code
        self.assertEqual(
            await self.post(origin="https://enroll.test:8446", **same), 404
        )

    async def test_otherSites_refused(self) -> None:
        """A null origin alone, or another site's fetch, is refused (403)."""
        await self.startConsole()
        self.assertEqual(await self.post(origin="null"), 403)
        for site in ("cross-site", "same-site", "none"):
            self.assertEqual(await self.post(**{"sec-fetch-site": site}), 403)
            self.assertEqual(
                await self.post(origin="null", **{"sec-fetch-site": site}), 403
            )
