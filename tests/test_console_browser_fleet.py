"""
The fleet view C{/} in a real headless Chromium (issue 20 acceptance):
an owner signs in with a C{fleetctl console} link and sees the fleet, and
after a simulated reboot of spore sees a lost run's alert in words. The
second test takes the README's screenshot of the fleet view.
"""

from __future__ import annotations

import shutil
import urllib.parse
from typing import TYPE_CHECKING

from twisted.internet.threads import deferToThread

from fleetd.runs.alerts import ALERT_WORDS
from tests.browsersupport import ConsoleBrowserTestCase, pageText
from tests.daemonsupport import UUID1, UUID2, configPath, httpsRequest

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

MISSING = "FleetInstallConfigMissing"
# A device's row as the browser renders its text: name, serial, status,
# class, cluster, run id, run state.
ROW = r"{}\s+\S+\s+{}\s+worker\s+{}\s+r-\S+\s+{}"


def uuid(i: int) -> str:
    return f"4c4c4544-0042-3510-8052-{i:012x}"


class FleetViewBrowserTests(ConsoleBrowserTestCase):
    """Issue 20 item 2 in a browser."""

    timeout = 180

    async def reboot(self) -> None:
        """
        spore reboots: the daemon stops, the vault (a tmpfs) loses its
        files, a new daemon starts over the same state directory.
        """
        await self.service.stopService()
        shutil.rmtree(self.settings.vault)
        self.service = self.startDaemon()
        await self.service.loading.whenReady()

    async def test_login_fleetShowsDevices(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1, cluster="folly")
        await self.addDevice("w2", "SER2", UUID2)
        await self.provision("w1")
        text = await self.login()
        self.assertIn("2 devices.", text)
        self.assertRegex(text, r"w1\s+SER1\s+planned\s+worker\s+folly\s+r-\S+\s+ready")
        self.assertRegex(text, r"w2\s+SER2\s+inventory\s+worker\s+—\s+—\s+never")

        url = self.adminURL(self.service, "/")

        def search(browser: WebDriver) -> str:
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support.ui import WebDriverWait

            browser.get(url)
            box = browser.find_element(By.NAME, "q")
            box.send_keys("ser2")
            box.submit()
            WebDriverWait(browser, 10).until(lambda b: "q=ser2" in b.current_url)
            return pageText(browser)

        found = await self.inBrowser(search)
        self.assertIn("2 devices, 1 matches.", found)
        self.assertIn("w2", found)
        self.assertNotIn("SER1", found)

    async def test_lostRunAlert_afterSimulatedReboot(self) -> None:
        """
        The fleet view shows a lost run's alert after a simulated reboot:
        a run provisioned before spore's reboot is lost with the vault,
        and its node's request raises FleetInstallConfigMissing.
        """
        await self.startConsole()
        devices = {
            "rack1-n1": "folly", "rack1-n2": "folly", "rack1-n3": "folly",
            "rack2-n1": "default", "rack2-n2": "default", "rack2-n3": "default",
        }  # fmt: skip
        serials = {}
        for i, (name, cluster) in enumerate(devices.items()):
            serials[name] = f"CZ2{i:04d}R{i}"
            await self.addDevice(
                name, serials[name], uuid(i), cluster=cluster,
                macs=[f"52:54:00:0c:00:{i:02x}"],
            )  # fmt: skip
        before = await self.provision("rack1-n1", "rack1-n2", "rack2-n3")
        status, _, _ = await self.fetch(
            configPath(before["rack1-n1"], uuid(0), serials["rack1-n1"])
        )
        self.assertEqual(status, 200)
        await self.events("run.delivered")  # released: survives the reboot
        text = await self.login()
        self.assertRegex(text, ROW.format("rack1-n2", "planned", "folly", "ready"))
        self.assertNotIn(MISSING, text)
        await self.reboot()
        await self.provision("rack2-n1", "rack2-n2")
        await self.service.console.retire.retire("rack2-n3", "owner:alice")
        status, _, _ = await self.fetch(
            configPath(before["rack1-n2"], uuid(1), serials["rack1-n2"])
        )
        self.assertEqual(status, 410)
        await self.events("config.missing")
        # Sessions are in memory: the new daemon needs a new link.
        text = await self.login()
        self.assertRegex(text, ROW.format("rack1-n2", "planned", "folly", "lost"))
        self.assertIn(MISSING, text)
        self.assertIn(ALERT_WORDS[MISSING], text)
        self.assertRegex(text, ROW.format("rack1-n1", "staged", "folly", "consumed"))
        self.assertRegex(text, ROW.format("rack2-n1", "planned", "default", "ready"))
        self.assertRegex(text, r"rack2-n3\s+\S+\s+decommissioning\s.*superseded")
        self.assertRegex(text, r"rack1-n3\s+\S+\s+inventory\s.*never provisioned")

        # A machine asks for approval through the device flow, for the picture.
        form = {"client_id": "talos", "uuid": uuid(9), "serial": "CZ29999X"}
        answer = await self.deviceCode(form)
        self.assertEqual(answer[0], 200, answer)
        url = self.adminURL(self.service, "/")

        def look(browser: WebDriver) -> str:
            browser.get(url)
            self.screenshot("fleet")
            return pageText(browser)

        text = await self.inBrowser(look)
        self.assertIn("Device-flow requests waiting (1)", text)
        self.assertIn("CZ29999X", text)

    async def deviceCode(self, form: dict[str, str]) -> tuple[int, bytes]:
        result: tuple[int, bytes] = await deferToThread(
            httpsRequest,
            self.port(self.service, "boot"),
            "POST",
            "/device/code",
            self.pki.public_ca,
            None,
            urllib.parse.urlencode(form).encode(),
            "application/x-www-form-urlencoded",
        )
        return result
