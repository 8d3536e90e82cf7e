"""
The journal view in a real headless Chromium (issue 20 acceptance: the
journal view shows a broken chain).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from tests.browsersupport import ConsoleBrowserTestCase, pageText
from tests.daemonsupport import UUID1

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver


class JournalViewBrowserTests(ConsoleBrowserTestCase):
    """An owner reads the journal and sees the chain break."""

    async def test_journal_verifiedThenBroken(self) -> None:
        await self.startConsole()
        await self.addDevice("w1", "SER-1", UUID1)
        await self.provision("w1")
        await self.service.chain.verify()
        await self.login()
        journal = self.adminURL(self.service, "/journal")

        def look(browser: WebDriver) -> str:
            browser.get(journal)
            self.screenshot("journal")
            return pageText(browser)

        shown = await self.inBrowser(look)
        for event in ("fleetd.started", "device.added", "run.provisioned"):
            self.assertIn(event, shown)
        self.assertIn("Verified through seq 3", shown)
        self.assertNotIn("BROKEN", shown)

        db = sqlite3.connect(self.settings.state / "fleetd.sqlite3")
        try:
            with db:
                db.execute("UPDATE journal SET actor = 'mallory' WHERE seq = 2")
        finally:
            db.close()

        def verifyNow(browser: WebDriver) -> tuple[str, str, str]:
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support import expected_conditions as seen
            from selenium.webdriver.support.ui import WebDriverWait

            browser.refresh()
            before = pageText(browser)
            browser.find_element(By.CSS_SELECTOR, "button[name=verify]").click()
            alert = WebDriverWait(browser, 20).until(
                seen.presence_of_element_located((By.CSS_SELECTOR, "[role=alert]"))
            )
            return before, alert.text, browser.current_url

        before, alert, url = await self.inBrowser(verifyNow)
        self.assertIn("Verified through seq 3", before, "a reload shows the verdict")
        self.assertIn("mallory", before)
        self.assertIn("BROKEN at seq 2: entry 2 fails its digest", alert)
        self.assertEqual(url, journal)
