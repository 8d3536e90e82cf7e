"""
The device page in a real headless Chromium (issue 20 item 3): an owner
signed in with a C{fleetctl console} link opens a provisioned device,
provisions it again through the confirmation and sees the new code once;
going back or reloading shows it nowhere again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetd.statuswords import headline
from tests.browsersupport import ConsoleBrowserTestCase, pageText, urlPath
from tests.daemonsupport import configPath

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"
SERIAL = "SN-7731"
EK = "3f" * 32


class DevicePageBrowserTests(ConsoleBrowserTestCase):
    async def richDevice(self) -> str:
        """w1 with evidence, a delivered run, a pending request; its old code."""
        await self.addDevice(
            "w1", SERIAL, UUID, macs=["0c:c4:7a:00:00:01"], cluster="folly"
        )
        await self.addDevice("w2", "SN-7732", "4c4c4544-0042-3510-8050-b4c04f4d3233")
        claim = {"serial": SERIAL, "ek_sha256": EK, "kind": "supplier-record"}
        status, doc = await self.admin(
            "POST", "/v1/admin/evidence", claim | {"ref": "PO-88"}
        )
        self.assertEqual(status, 201, doc)
        code = (await self.provision("w1"))["w1"]
        status, _, _ = await self.fetch(configPath(code, UUID, SERIAL))
        self.assertEqual(status, 200)
        self.service.deviceFlow.requestCode(
            {"client_id": "talos", "uuid": UUID, "serial": SERIAL,
             "hostname": "talos-7731", "mac": "0c:c4:7a:00:00:01"},
            "10.0.7.31",
        )  # fmt: skip
        return code

    async def test_provisionAgain_codeShownOnce(self) -> None:
        await self.startConsole()
        old = await self.richDevice()
        status, doc = await self.admin("GET", "/v1/admin/status/w1", None)
        self.assertEqual(status, 200, doc)
        await self.login()
        device = self.adminURL(self.service, "/devices/w1")

        def open(browser: WebDriver) -> str:
            browser.get(device)
            self.screenshot("device")
            return pageText(browser)

        text = await self.inBrowser(open)
        self.assertIn(headline(doc), text)
        for words in ("consumed", "run.provisioned", "10.0.7.31", "Provision again"):
            self.assertIn(words, text)
        self.assertNotIn(old, text)

        def provisionAgain(browser: WebDriver) -> tuple[str, str, str]:
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support.ui import WebDriverWait

            browser.find_element(By.LINK_TEXT, "Provision again…").click()
            submit = WebDriverWait(browser, 20).until(
                lambda b: b.find_element(
                    By.CSS_SELECTOR, "main form button[type=submit]"
                )
            )
            confirm = pageText(browser)
            submit.click()
            # The answer to the POST is a new page: wait for it (a loaded
            # machine may still be on the confirmation when the click returns).
            code = (
                WebDriverWait(browser, 20)
                .until(lambda b: b.find_element(By.CSS_SELECTOR, "code.code"))
                .text
            )
            return confirm, pageText(browser), code

        confirm, shown, new = await self.inBrowser(provisionAgain)
        self.assertIn("supersedes run", confirm)
        self.assertEqual(shown.count(new), 1, shown)
        self.assertIn("META 0x0b", shown)
        self.assertNotEqual(new, old)

        def backAndReload(browser: WebDriver) -> list[tuple[str, str]]:
            from selenium.webdriver.common.by import By

            seen = []
            browser.find_element(By.LINK_TEXT, "Back to w1").click()
            seen.append((urlPath(browser.current_url), browser.page_source))
            browser.refresh()
            seen.append((urlPath(browser.current_url), browser.page_source))
            browser.back()  # to the provision's answer, from history
            seen.append((urlPath(browser.current_url), browser.page_source))
            browser.back()
            seen.append((urlPath(browser.current_url), browser.page_source))
            browser.get(device)
            seen.append((urlPath(browser.current_url), browser.page_source))
            return seen

        seen = await self.inBrowser(backAndReload)
        self.assertEqual(seen[0][0], "/devices/w1")
        for path, source in seen:
            self.assertNotIn(new, source, path)
        status, _, _ = await self.fetch(configPath(new, UUID, SERIAL))
        self.assertEqual(status, 200, "the code shown was the new run's")
