"""
The fleet view C{/} (issue 20 item 2): every device with its status,
class, cluster, latest run, run state and open alerts in words; the
pending device-flow requests; filters, search and pages that keep them.
Over a real in-process daemon, through L{treq.testing.StubTreq}.
"""

from __future__ import annotations

import html
import re
import shutil
import urllib.parse
from typing import Any

import yaml
from twisted.internet.defer import fail
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.fleet.view import PAGE_SIZE, FleetQueryError, Search, fleetQuery
from fleetd.inventory.model import DeviceStatus, InventoryError, validateDevice
from fleetd.runs.alerts import (
    ALERT_NAMES,
    ALERT_WORDS,
    ATTESTATION_REFUSED,
    WORKFLOW_LOST,
    alertWords,
)
from fleetd.store.entries import Entry
from tests.consolesupport import ConsoleMixin, text
from tests.daemonsupport import UUID1, UUID2, configPath, httpsRequest
from tests.support import REPO

UUID3 = "4c4c4544-0042-3510-8050-b4c04f4d3234"
UUID4 = "4c4c4544-0042-3510-8050-b4c04f4d3235"
NODE_CODE = "node-one-time-code-0123456789"


def row(body: str, name: str) -> str:
    """The visible text of the fleet table's row of device C{name}."""
    for found in re.findall(r"<tr>.*?</tr>", body, re.S):
        if f'href="/devices/{name}"' in found:
            return " ".join(text(found).split())
    raise AssertionError(f"no row for {name}")


def names(body: str) -> list[str]:
    """The devices the page lists, in order."""
    return re.findall(r'<td><a href="/devices/([^"]+)">', body)


def links(body: str, rel: str) -> list[str]:
    return [
        html.unescape(m) for m in re.findall(rf'<a rel="{rel}" href="([^"]+)"', body)
    ]


class AlertWordsTests(SynchronousTestCase):
    """Every alert fleetd raises for a device has words for people."""

    def test_everyRaisedAlert_hasWords(self) -> None:
        for name in [*ALERT_NAMES.values(), ATTESTATION_REFUSED, WORKFLOW_LOST]:
            self.assertIn(name, ALERT_WORDS)
            self.assertNotEqual(alertWords(name), name)
        self.assertEqual(
            set(ALERT_WORDS),
            set(ALERT_NAMES.values()) | {ATTESTATION_REFUSED, WORKFLOW_LOST},
        )

    def test_everyDeviceRule_hasWords(self) -> None:
        """
        The rules of conf/alerts.yml that name a device are fleetd's, and
        so is FleetAttestationRefused (issue 27): fleet-wide in Prometheus,
        shown on the devices whose refusal stands.
        """
        rules = yaml.safe_load((REPO / "conf" / "alerts.yml").read_text())
        perDevice = {
            rule["alert"]
            for group in rules["groups"]
            for rule in group["rules"]
            if "device" in rule["expr"]
        }
        names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
        self.assertIn(ATTESTATION_REFUSED, names)
        self.assertEqual(perDevice | {ATTESTATION_REFUSED}, set(ALERT_WORDS))


class FleetQueryTests(SynchronousTestCase):
    """The filters as the page reads them from its query string."""

    def test_empty_isEverything(self) -> None:
        query = fleetQuery(None, "", None, "")
        self.assertEqual(
            (query.status, query.cluster, query.search, query.page), (None, None, "", 1)
        )

    def test_values(self) -> None:
        query = fleetQuery("planned", "Folly", " w1 ", "3")
        self.assertEqual(
            (query.status, query.cluster, query.search, query.page),
            (DeviceStatus.PLANNED, "folly", "w1", 3),
        )

    def test_refusals(self) -> None:
        for fields in [
            ("bogus", None, None, None),
            (None, "no such!", None, None),
            (None, None, "x" * 65, None),
            (None, None, None, "0"),
            (None, None, None, "-1"),
            (None, None, None, "two"),
            (None, None, None, "\u0661"),  # a digit, but not an ASCII one
            (None, None, None, "99999999"),
        ]:
            self.assertRaises(FleetQueryError, fleetQuery, *fields)

    def test_search_macForms(self) -> None:
        device = validateDevice(
            name="w1", serial="SN-1", uuid=UUID1,
            macs=["52:54:00:ab:cd:ef"], device_class="worker",
        )  # fmt: skip
        for search in ["AB:CD", "ab-cd-ef", "abcdef", "5254.00ab", "W1", "sn-"]:
            self.assertTrue(Search.of(search).matches(device), search)
        for search in ["ab:ce", "bc:d", "w2", "ffff", "cd:ef:00"]:
            self.assertFalse(Search.of(search).matches(device), search)


class FleetViewTests(ConsoleMixin, TestCase):
    timeout = 120

    async def bootRequest(self, path: str, form: dict[str, str]) -> tuple[int, bytes]:
        result: tuple[int, bytes] = await deferToThread(
            httpsRequest,
            self.port(self.service, "boot"),
            "POST",
            path,
            self.pki.public_ca,
            None,
            urllib.parse.urlencode(form).encode(),
            "application/x-www-form-urlencoded",
        )
        return result

    async def reboot(self) -> None:
        """spore reboots: the vault (a tmpfs) is gone, the database stays."""
        await self.service.stopService()
        shutil.rmtree(self.settings.vault)
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        self.consoleRoot()

    async def importDevices(self, count: int, **fields: Any) -> None:
        devices = [
            validateDevice(
                name=f"n{i:04d}",
                serial=f"SN{i:04d}",
                uuid=f"4c4c4544-0042-3510-8051-{i:012x}",
                macs=[f"52:54:01:00:{i // 256:02x}:{i % 256:02x}"],
                device_class="worker",
                **fields,
            )
            for i in range(count)
        ]
        entry = Entry("device.imported", actor="owner:alice", fields={"count": count})
        await self.service.inventory.importDevices(devices, journal=[entry])

    async def test_rows_statusClassClusterRunState(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1, cluster="folly")
        await self.addDevice("w2", "SER2", UUID2, cluster="default")
        await self.addDevice("w3", "SER3", UUID3, **{"class": "control-plane"})
        await self.addDevice("w4", "SER4", UUID4)
        codes = await self.provision("w1", "w2", "w4")
        status, _, _ = await self.fetch(configPath(codes["w2"], UUID2, "SER2"))
        self.assertEqual(status, 200)
        await self.events("run.delivered")
        runs = {}
        for name in ("w1", "w2", "w4"):
            current = self.service.runs.current(name)
            assert current is not None
            runs[name] = current.id
        await self.service.console.retire.retire("w4", "owner:alice")
        status, _, body = await self.page("GET", "/")
        self.assertEqual(status, 200, body)
        self.assertEqual(names(body), ["w1", "w2", "w3", "w4"])
        self.assertEqual(
            row(body, "w1"),
            f"w1 SER1 planned worker folly {runs['w1']} ready none",
        )
        self.assertEqual(
            row(body, "w2"),
            f"w2 SER2 staged worker default {runs['w2']} consumed none",
        )
        self.assertEqual(
            row(body, "w3"),
            "w3 SER3 inventory control-plane — — never provisioned none",
        )
        self.assertEqual(
            row(body, "w4"),
            f"w4 SER4 decommissioning worker — {runs['w4']} superseded none",
        )
        self.assertIn("4 devices.", text(body))
        for code in codes.values():
            self.assertNotIn(code, body)
        self.assertNotIn("data-refresh", body)

    async def test_lostRun_showsAlertInWords(self) -> None:
        """After spore's reboot a ready run is lost; its node's request
        raises FleetInstallConfigMissing, shown in words."""
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1)
        await self.addDevice("w2", "SER2", UUID2)
        codes = await self.provision("w1", "w2")
        await self.reboot()
        status, _, body = await self.page("GET", "/")
        self.assertIn(" lost ", row(body, "w1"))
        self.assertIn(" none", row(body, "w1"))
        status, _, _ = await self.fetch(configPath(codes["w1"], UUID1, "SER1"))
        self.assertEqual(status, 410)
        await self.events("config.missing")
        status, _, body = await self.page("GET", "/")
        self.assertEqual(status, 200, body)
        shown = row(body, "w1")
        self.assertIn(" lost ", shown)
        self.assertIn("FleetInstallConfigMissing", shown)
        self.assertIn(ALERT_WORDS["FleetInstallConfigMissing"], shown)
        self.assertNotIn("FleetInstallConfigMissing", row(body, "w2"))
        self.assertIn(" lost ", row(body, "w2"))

    async def test_filters_statusClusterSearch(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1, cluster="folly",
                             macs=["52:54:00:aa:bb:01"])  # fmt: skip
        await self.addDevice("w2", "SER2", UUID2, cluster="default",
                             macs=["52:54:00:aa:bb:02"])  # fmt: skip
        await self.addDevice("web3", "XY-77", UUID3, cluster="folly")
        await self.provision("w1")
        cases = {
            "/?status=planned": ["w1"],
            "/?status=inventory": ["w2", "web3"],
            "/?cluster=folly": ["w1", "web3"],
            "/?cluster=folly&status=inventory": ["web3"],
            "/?q=W": ["w1", "w2", "web3"],
            "/?q=web": ["web3"],
            "/?q=xy-7": ["web3"],
            "/?q=ser2": ["w2"],
            "/?q=AA:BB:02": ["w2"],
            "/?q=aa-bb-01": ["w1"],
            "/?q=aabb0": ["w1", "w2"],
            "/?q=nothing": [],
            "/?status=failed": [],
            "/?cluster=big": [],
        }
        for path, expected in cases.items():
            status, _, body = await self.page("GET", path)
            self.assertEqual((status, names(body)), (200, expected), path)
            matches = f"{len(expected)} match{'es' if len(expected) == 1 else ''}"
            self.assertIn(f"3 devices, {matches}.", text(body), path)
        status, _, body = await self.page("GET", "/?q=nothing")
        self.assertIn("No device matches.", text(body))
        # The form shows the filters it applied.
        status, _, body = await self.page("GET", "/?status=planned&cluster=folly&q=w")
        self.assertIn('<option value="planned" selected>', body)
        self.assertIn('<option value="folly" selected>', body)
        self.assertIn('name="q" value="w"', body)

    async def test_pages_keepFilters(self) -> None:
        await self.startConsole()
        await self.importDevices(2 * PAGE_SIZE + 30, cluster="folly")
        await self.addDevice("w1", "SER1", UUID1)  # not in folly
        status, _, body = await self.page("GET", "/?cluster=folly&q=n0")
        self.assertEqual(status, 200, body)
        shown = names(body)
        self.assertEqual(shown[0], "n0000")
        self.assertEqual(len(shown), PAGE_SIZE)
        self.assertIn("231 devices, 230 match; page 1 of 3.", text(body))
        self.assertEqual(links(body, "prev"), [])
        (following,) = links(body, "next")
        self.assertEqual(following, "/?page=2&cluster=folly&q=n0")
        status, _, body = await self.page("GET", following)
        self.assertEqual(names(body)[0], f"n{PAGE_SIZE:04d}")
        self.assertEqual(links(body, "prev"), ["/?cluster=folly&q=n0"])
        (last,) = links(body, "next")
        status, _, body = await self.page("GET", last)
        self.assertEqual(len(names(body)), 30)
        self.assertEqual(names(body)[-1], f"n{2 * PAGE_SIZE + 29:04d}")
        self.assertEqual(links(body, "next"), [])
        self.assertIn("page 3 of 3", text(body))
        # Without filters w1 is in, last by name.
        status, _, body = await self.page("GET", "/?page=3")
        self.assertEqual(names(body)[-1], "w1")

    async def test_badPage_400(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1)
        for path, line in [
            ("/?page=abc", "page: 'abc' is not a page number"),
            ("/?page=0", "page: 0 is not a page number"),
            ("/?page=2", "page: 2 is past the last page (1)"),
            ("/?page=1&page=2", "the field page is repeated"),
            ("/?status=bogus", "status: 'bogus' is not one of"),
            ("/?cluster=%3Cb%3E", "cluster: '<b>' must be a-z"),
            ("/?q=" + "x" * 65, "search: at most 64 characters"),
        ]:
            status, _, body = await self.page("GET", path)
            self.assertEqual(status, 400, path)
            self.assertIn(line, text(body), path)
            self.assertNotIn("<b>", body)

    async def test_inventoryValues_escaped(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "<script>x</script>", UUID1)
        status, _, body = await self.page("GET", "/?q=%3Cscript")
        self.assertEqual((status, names(body)), (200, ["w1"]))
        self.assertNotIn("<script>x", body)
        self.assertIn("&lt;script&gt;x&lt;/script&gt;", body)
        self.assertIn('value="&lt;script"', body)

    async def test_pendingRequests_shownWithoutNodeCode(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        form = {
            "client_id": "talos", "uuid": UUID1, "serial": "SER1",
            "mac": "52:54:00:12:34:56", "code": NODE_CODE,
        }  # fmt: skip
        status, answer = await self.bootRequest("/device/code", form)
        self.assertEqual(status, 200, answer)
        stranger = {"client_id": "talos", "uuid": UUID4, "serial": "<i>S9</i>"}
        status, answer = await self.bootRequest("/device/code", stranger)
        self.assertEqual(status, 200, answer)
        (mine, theirs) = self.service.deviceFlow.pending()
        status, _, body = await self.page("GET", "/")
        self.assertEqual(status, 200, body)
        self.assertNotIn(NODE_CODE, body)
        self.assertNotIn(codes["w1"], body)
        self.assertIn('<body data-refresh="15">', body)
        shown = text(body)
        self.assertIn("Device-flow requests waiting (2)", shown)
        for pending in (mine, theirs):  # named by public id, never by a code
            self.assertIn(pending.id, shown)
            self.assertNotIn(pending.user_code, body)
        self.assertIn('href="/device"', body)
        self.assertIn("52:54:00:12:34:56", shown)
        self.assertIn("&lt;i&gt;S9&lt;/i&gt;", body)
        self.assertNotIn("<i>S9", body)
        rows = re.findall(r"<tr>.*?</tr>", body, re.S)
        (line,) = [r for r in rows if mine.id in r]
        self.assertIn('href="/devices/w1"', line)
        self.assertRegex(" ".join(text(line).split()), r"127\.0\.0\.1 w1 \d+ s ago")

    async def test_inventoryUnavailable_503(self) -> None:
        """NetBox down and no cache: a 503 page saying so, not a 500."""
        await self.startConsole()
        down = InventoryError("NetBox is not answering", "unavailable")
        self.patch(self.service.console.inventory, "list", lambda: fail(down))
        status, _, body = await self.page("GET", "/")
        self.assertEqual(status, 503)
        self.assertIn(
            "the inventory cannot be read: NetBox is not answering", text(body)
        )

    async def test_noOwner_403(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1)
        status, _, body = await self.page("GET", "/?q=w1", owner=None)
        self.assertEqual(status, 403)
        self.assertNotIn("w1", body)
