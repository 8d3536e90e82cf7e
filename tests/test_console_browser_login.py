"""
Entering the owner console in a real headless Chromium (issue 20 item 5,
acceptance): a link from C{fleetctl --json console} signs the browser in
once; a reused or expired link is refused; a form without its CSRF token is
refused and changes nothing; the pages fit a phone's width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.browsersupport import ConsoleBrowserTestCase, pageText, urlPath
from tests.daemonsupport import UUID1

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

PHONE = (390, 844)  # CSS pixels of a common phone held upright


class ConsoleLoginTests(ConsoleBrowserTestCase):
    async def test_fleetctlConsoleLink_signsIn_onceOnly(self) -> None:
        await self.startConsole()
        url = await self.consoleLink()
        self.assertTrue(url.startswith(self.adminURL(self.service, "/login?")), url)
        text = await self.login(url)
        self.assertIn("Fleet", text)

        def reuse(browser: WebDriver) -> tuple[str, list[dict[str, object]]]:
            browser.delete_all_cookies()
            browser.get(url)
            return pageText(browser), browser.get_cookies()

        text, cookies = await self.inBrowser(reuse)
        self.assertIn("used already", text)
        self.assertEqual(cookies, [])

    async def test_expiredLink_refused(self) -> None:
        await self.startConsole()
        self.service.consoleSessions.linkLifetime = 0.0  # expired at once
        url = await self.consoleLink()

        def follow(browser: WebDriver) -> tuple[str, str, list[dict[str, object]]]:
            browser.get(url)
            text = pageText(browser)
            browser.get(self.adminURL(self.service, "/"))
            return text, pageText(browser), browser.get_cookies()

        login, fleet, cookies = await self.inBrowser(follow)
        self.assertIn("has expired", login)
        self.assertIn("owner client certificate required", fleet)
        self.assertEqual(cookies, [])

    async def test_formWithoutCSRF_refused_sessionKept(self) -> None:
        """
        The logout form posted without its hidden C{csrf} field (as a forged
        form would be) is refused; the session is still open afterwards.
        """
        await self.startConsole()
        await self.login()
        home = self.adminURL(self.service, "/")

        def forge(browser: WebDriver) -> tuple[str, str]:
            browser.get(home)
            browser.execute_script(
                "var f = document.querySelector('form[action=\"/logout\"]');"
                "f.querySelector('input[name=csrf]').remove(); f.submit();"
            )
            refused = pageText(browser)
            browser.get(home)
            return refused, pageText(browser)

        refused, after = await self.inBrowser(forge)
        self.assertIn("CSRF token is missing or wrong", refused)
        self.assertIn("Log out", after)  # still signed in: nothing changed
        self.assertNotIn("owner client certificate required", after)

    async def test_pages_fitAPhone(self) -> None:
        """Every page reads at a phone's width: nothing wider than the screen."""
        await self.startConsole()
        await self.addDevice("w1", "SER-0001", UUID1, macs=["52:54:00:00:00:01"])
        await self.provision("w1")
        await self.login()
        paths = ["/", "/devices/w1", "/device", "/journal", "/devices/w1/retire"]
        urls = [self.adminURL(self.service, p) for p in paths]

        def measure(browser: WebDriver) -> list[tuple[str, int, int]]:
            browser.set_window_size(*PHONE)
            widths = []
            for url in urls:
                browser.get(url)
                widths.append(
                    (
                        urlPath(url),
                        browser.execute_script(
                            "return document.documentElement.scrollWidth"
                        ),
                        browser.execute_script("return innerWidth"),
                    )
                )
            return widths

        for path, scroll, inner in await self.inBrowser(measure):
            self.assertLessEqual(scroll, inner, path)
