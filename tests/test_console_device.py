"""
The console's device page C{/devices/NAME} and its owner actions (issue
20 item 3), over a real daemon through StubTreq: fleetctl status's rows
in its words, escaping, the provision code shown once, and each action
journaled like fleetctl's, with C{via=console}, after a confirmation.
"""

from __future__ import annotations

import html
import re
from typing import Any

from twisted.trial.unittest import TestCase

from fleetd.statuswords import Row
from tests.consolesupport import ConsoleMixin, text
from tests.daemonsupport import configPath
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"
SERIAL = "SN-1"
UUID2 = "4c4c4544-0042-3510-8050-b4c04f4d3233"
EK = "ab" * 32


def words(body: str) -> str:
    """A page's visible text with its whitespace collapsed."""
    return " ".join(text(body).split())


def statusRowsOf(body: str) -> list[Row]:
    """The rows of the page's status list (C{<dl class="record status">})."""
    found = re.search(r'<dl class="record status">(.*?)</dl>', body, re.S)
    assert found is not None, "no status list on the page"
    rows = []
    for label, dd in re.findall(r"<dt>(.*?)</dt>\s*<dd>(.*?)</dd>", found[1], re.S):
        span = re.search(r'<span class="mono">(.*?)</span>', dd, re.S)
        items = re.findall(r'<li class="mono">(.*?)</li>', dd, re.S)
        rows.append(
            Row(
                html.unescape(label),
                html.unescape(span[1]) if span else "",
                tuple(html.unescape(i) for i in items),
            )
        )
    return rows


def journalLinesOf(body: str) -> list[str]:
    """The page's journal table, each row's cells joined as fleetctl joins them."""
    table = re.search(r'<table class="journal">(.*?)</table>', body, re.S)
    assert table is not None, "no journal table on the page"
    lines = []
    for row in re.findall(r"<tr>(.*?)</tr>", table[1], re.S)[1:]:
        cells = [
            html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        lines.append("  ".join([cells[0].rjust(6), *cells[1:]]))
    return lines


class DevicePageTests(ConsoleMixin, TestCase):
    async def device(self, name: str = "w1", serial: str = SERIAL) -> None:
        await self.startConsole()
        await self.addDevice(name, serial, UUID)

    async def fleetctl(self, *argv: str) -> tuple[int, str, str]:
        config = ownerConfig(self.directory, self.port(self.service, "admin"))
        return await fleetctlAgainst(config, *argv)

    async def runOf(self, name: str) -> str:
        """The latest run of C{name}, from the journal."""
        runs = [
            e["run"]
            for e in await self.journal()
            if e["event"] == "run.provisioned" and e["device"] == name
        ]
        return str(runs[-1])

    async def test_rows_areFleetctlStatusLines(self) -> None:
        """The page's status list and journal say what fleetctl status says."""
        await self.device()
        await self.provision("w1")
        code, _, body = await self.page("GET", "/devices/w1")
        self.assertEqual(code, 200, body)
        status, out, err = await self.fleetctl("status", "w1")
        self.assertEqual(status, 0, err)
        printed = out.splitlines()
        rows = statusRowsOf(body)
        self.assertIn("binding", [row.label for row in rows])
        shown = [line for row in rows for line in row.lines()]
        journal = printed.index("journal:")
        self.assertEqual(printed[1:journal], shown)
        headline = re.search(r'<p class="mono headline">(.*?)</p>', body)
        assert headline is not None
        self.assertEqual(html.unescape(headline[1]), printed[0])
        self.assertEqual(journalLinesOf(body), [x[2:] for x in printed[journal + 1 :]])
        self.assertIn("run.provisioned", journalLinesOf(body)[-1])

    async def test_inventoryAndNodeFields_escaped(self) -> None:
        await self.device(serial="<script>x</script>")
        await self.provision("w1")
        self.service.deviceFlow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": "<script>x</script>",
             "hostname": "<b>h</b>", "code": "node-secret-code"},
            "127.0.0.1",
        )  # fmt: skip
        code, _, body = await self.page("GET", "/devices/w1")
        self.assertEqual(code, 200, body)
        self.assertNotIn("<script>x", body)
        self.assertNotIn("<b>h", body)
        self.assertIn("&lt;script&gt;x&lt;/script&gt;", body)
        self.assertIn("&lt;b&gt;h&lt;/b&gt;", body)
        self.assertNotIn("node-secret-code", body)
        (pending,) = self.service.deviceFlow.pending()
        self.assertIn(pending.id, body)
        self.assertNotIn(pending.user_code, body)

    async def test_provisionAgain_showsTheCodeOnce(self) -> None:
        await self.device()
        old = (await self.provision("w1"))["w1"]
        oldRun = await self.runOf("w1")
        code, _, page = await self.page("GET", "/devices/w1")
        self.assertIn('href="/devices/w1/provision"', page)
        code, _, confirm = await self.page("GET", "/devices/w1/provision")
        self.assertEqual(code, 200, confirm)
        self.assertIn(f"supersedes run {oldRun}", words(confirm))
        before = len(await self.journal())
        code, headers, body = await self.page(
            "POST", "/devices/w1/provision", {"run": oldRun}
        )
        self.assertEqual(code, 200, body)
        self.assertEqual(headers.getRawHeaders("cache-control"), ["no-store"])
        new = re.search(r'<code class="code">(.*?)</code>', body)
        assert new is not None
        self.assertIn("META 0x0b", words(body))
        entries = (await self.journal())[before:]
        provisioned = [e for e in entries if e["event"] == "run.provisioned"]
        self.assertEqual(len(provisioned), 1)
        self.assertEqual(provisioned[0]["actor"], "owner:alice")
        self.assertEqual(provisioned[0]["fields"]["via"], "console")
        self.assertIn(provisioned[0]["run"], body)
        self.assertNotIn(new[1], repr(entries))
        # the code shown is the run's: the node fetches its configuration with it
        status, _, _ = await self.fetch(configPath(new[1], UUID, SERIAL))
        self.assertEqual(status, 200)
        status, _, _ = await self.fetch(configPath(old, UUID, SERIAL))
        self.assertEqual(status, 410)
        for path in ["/devices/w1", "/devices/w1/provision", "/"]:
            code, _, again = await self.page("GET", path)
            self.assertNotIn(new[1], again, path)
            self.assertNotIn(old, again, path)

    async def test_provision_staleConfirmation_refused(self) -> None:
        await self.device()
        await self.provision("w1")
        before = await self.journal()
        code, _, body = await self.page("POST", "/devices/w1/provision", {"run": ""})
        self.assertEqual(code, 409, body)
        self.assertIn("confirm again; nothing was provisioned", words(body))
        self.assertEqual(await self.journal(), before)

    async def test_get_changesNothing(self) -> None:
        """A GET of an action is its confirmation page, whatever it carries."""
        await self.device()
        await self.provision("w1")
        before = await self.journal()
        for path in [
            "/devices/w1/provision?run=x",
            "/devices/w1/retire?confirm_name=w1",
        ]:
            code, _, body = await self.page("GET", path)
            self.assertEqual(code, 200, body)
            self.assertIn('method="post"', body)
        self.assertEqual(await self.journal(), before)

    async def test_retire_typedNameMustMatch(self) -> None:
        await self.device()
        await self.addDevice("w2", "SN-2", UUID2)
        code, _, confirm = await self.page("GET", "/devices/w1/retire")
        self.assertIn('name="confirm_name"', confirm)
        before = await self.journal()
        for typed in ["w2", "", "w1x"]:
            code, _, body = await self.page(
                "POST", "/devices/w1/retire", {"confirm_name": typed}
            )
            self.assertEqual(code, 400, body)
            self.assertIn("not confirmed", words(body))
            self.assertIn("nothing changed", words(body))
        self.assertEqual(await self.journal(), before)
        code, _, body = await self.page(
            "POST", "/devices/w1/retire", {"confirm_name": "w1"}
        )
        self.assertEqual(code, 200, body)
        self.assertIn("w1 decommissioning", words(body))
        (retired,) = [e for e in await self.journal() if e["event"] == "device.retired"]
        self.assertEqual((retired["actor"], retired["device"]), ("owner:alice", "w1"))
        self.assertEqual(retired["fields"]["via"], "console")
        code, _, page = await self.page("GET", "/devices/w1")
        self.assertNotIn("/devices/w1/retire", page)
        self.assertNotIn("/devices/w1/provision", page)

    async def test_bindingApproval_onlyWhereTheEvidenceAllows(self) -> None:
        await self.device()
        code, _, page = await self.page("GET", "/devices/w1")
        self.assertNotIn("/devices/w1/approve-binding", page)
        self.assertIn(
            "approval not offered: no evidence names serial SN-1", words(page)
        )
        code, _, body = await self.page("GET", "/devices/w1/approve-binding")
        self.assertEqual(code, 409, body)
        code, _, body = await self.page("POST", "/devices/w1/approve-binding", {})
        self.assertEqual(code, 409, body)
        status, line = await self.admin(
            "POST", "/v1/admin/bindings/approve", {"serial": SERIAL}
        )
        self.assertEqual(status, 409)
        self.assertIn(str(line).strip(), words(body))  # fleetctl's refusal line
        refused = [e for e in await self.journal() if e["event"] == "binding.refused"]
        self.assertEqual([e["fields"].get("via") for e in refused], ["console", None])
        self.assertEqual(refused[0]["actor"], "owner:alice")
        claim = {"serial": SERIAL, "ek_sha256": EK, "kind": "supplier-record"}
        status, doc = await self.admin("POST", "/v1/admin/evidence", claim)
        self.assertEqual(status, 201, doc)
        code, _, page = await self.page("GET", "/devices/w1")
        self.assertIn('href="/devices/w1/approve-binding"', page)
        code, _, confirm = await self.page("GET", "/devices/w1/approve-binding")
        self.assertEqual(code, 200, confirm)
        self.assertIn(EK, confirm)
        code, _, body = await self.page(
            "POST", "/devices/w1/approve-binding", {"ek_sha256": EK}
        )
        self.assertEqual(code, 200, body)
        self.assertIn(f"approved: serial {SERIAL} (device w1) <-> EK {EK}", words(body))
        (approved,) = [
            e for e in await self.journal() if e["event"] == "binding.approved"
        ]
        self.assertEqual(approved["actor"], "owner:alice")
        self.assertEqual(approved["fields"]["via"], "console")
        code, _, page = await self.page("GET", "/devices/w1")
        self.assertNotIn("/devices/w1/approve-binding", page)  # it holds now

    async def test_denyPendingRequest(self) -> None:
        await self.device()
        await self.provision("w1")
        flow = self.service.deviceFlow
        flow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": SERIAL}, "127.0.0.9"
        )
        (pending,) = flow.pending()
        code, _, page = await self.page("GET", "/devices/w1")
        self.assertIn(f"/devices/w1/deny?request={pending.id}", page)
        code, _, confirm = await self.page(
            "GET", f"/devices/w1/deny?request={pending.id}"
        )
        self.assertEqual(code, 200, confirm)
        self.assertIn("127.0.0.9", confirm)
        self.assertNotIn(pending.user_code, confirm)
        code, _, body = await self.page(
            "POST", "/devices/w1/deny", {"request": "dfr-0"}
        )
        self.assertEqual(code, 404, body)
        await self.addDevice("w2", "SN-2", UUID2)
        await self.provision("w2")
        flow.requestCode({"client_id": "talos", "uuid": UUID2, "serial": "SN-2"}, "::1")
        (other,) = [v for v in flow.pending() if v.known == "w2"]
        code, _, page = await self.page("GET", "/devices/w1")
        self.assertNotIn(other.id, page)
        code, _, body = await self.page(
            "POST", "/devices/w1/deny", {"request": other.id}
        )
        self.assertEqual(code, 404, "another device's request")
        self.assertEqual(len(flow.pending()), 2)
        code, _, body = await self.page(
            "POST", "/devices/w1/deny", {"request": pending.id}
        )
        self.assertEqual(code, 200, body)
        self.assertEqual(flow.pending(), [other])
        (denied,) = [
            e for e in await self.journal() if e["event"] == "deviceflow.denied"
        ]
        self.assertEqual(denied["actor"], "owner:alice")
        self.assertEqual(denied["fields"]["via"], "console")
        code, _, body = await self.page(
            "POST", "/devices/w1/deny", {"request": pending.id}
        )
        self.assertEqual(code, 404, "decided already")

    async def test_unknownDeviceOrPath_404Page(self) -> None:
        await self.device()
        paths = ["/devices/w9", "/devices/", "/devices", "/devices/w1/reboot",
                 "/devices/w1/retire/x", "/devices/W%201",
                 "/devices/w9/retire"]  # fmt: skip
        for path in paths:
            code, headers, body = await self.page("GET", path)
            self.assertEqual(code, 404, path)
            self.assertIn("text/html", headers.getRawHeaders("content-type")[0], path)
        code, _, body = await self.page("GET", "/devices/w9")
        self.assertIn("no device named w9", words(body))
        code, _, body = await self.page(
            "POST", "/devices/w9/retire", {"confirm_name": "w9"}
        )
        self.assertEqual(code, 404)

    async def test_noOwner_403(self) -> None:
        await self.device()
        paths = ["/devices/w1", "/devices/w1/provision", "/devices/w1/retire",
                 "/devices/w1/approve-binding", "/devices/"]  # fmt: skip
        for path in paths:
            for method in ("GET", "POST"):
                code, _, _ = await self.page(method, path, owner=None)
                self.assertEqual(code, 403, (method, path))

    async def test_postWithoutCSRF_403_nothingChanges(self) -> None:
        await self.device()
        await self.provision("w1")
        before = await self.journal()
        forms: list[tuple[str, dict[str, Any]]] = [
            ("/devices/w1/provision", {"run": await self.runOf("w1")}),
            ("/devices/w1/retire", {"confirm_name": "w1"}),
            ("/devices/w1/approve-binding", {}),
        ]
        for path, form in forms:
            code, _, body = await self.page("POST", path, form, csrf=False)
            self.assertEqual(code, 403, path)
            self.assertIn("CSRF", body)
        self.assertEqual(await self.journal(), before)

    async def test_nullOriginForm_fromTheSameOriginOnly(self) -> None:
        """
        Under Referrer-Policy: no-referrer Chromium posts the console's own
        forms with C{Origin: null}: accepted when C{Sec-Fetch-Site} says
        same-origin, refused when it names another site or is absent (a
        sandboxed frame elsewhere also posts as C{null}).
        """
        await self.device()
        form = {"confirm_name": "w2"}
        for site, expected in [("same-origin", 400), (None, 403),
                               ("cross-site", 403), ("same-site", 403)]:  # fmt: skip
            headers = {"origin": "null"}
            if site is not None:
                headers["sec-fetch-site"] = site
            code, _, body = await self.page(
                "POST", "/devices/w1/retire", form, headers=headers
            )
            self.assertEqual(code, expected, (site, body))
