"""
A reader in a real headless Chromium [O4]: signed in with the link
C{fleetctl console} prints for a reader's certificate, the console shows
the device and its journal and offers no change; a change forged in the
page (the form an owner's confirmation posts, with the session's own CSRF
token) is refused with the reader's line, journaled, and changes nothing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fleetd.admin.readers import refusalLine
from tests.browsersupport import ConsoleBrowserTestCase, pageText
from tests.daemonsupport import UUID1
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.readersupport import reader

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

FORGE = """
const form = document.createElement("form");
form.method = "post";
form.action = "/devices/w1/provision";
for (const [name, value] of [["run", ""], ["csrf", arguments[0]]]) {
  const input = document.createElement("input");
  input.type = "hidden"; input.name = name; input.value = value;
  form.appendChild(input);
}
document.body.appendChild(form);
form.submit();
"""


class ReaderConsoleBrowserTests(ConsoleBrowserTestCase):
    async def test_readerLink_readsOnly(self) -> None:
        """
        [O4] A reader's console link signs the browser in as a reader: the
        device page names the role and offers no action; a provision
        forged in the page is refused 403 with the reader's line and
        journaled (via console); no run is made.
        """
        await self.startConsole()
        await self.addDevice("w1", "SN-1", UUID1)
        cert, key = reader(self.pki, "nightwatch")
        port = self.port(self.service, "admin")
        mine = {"client_cert": str(cert), "client_key": str(key)}
        server = {"server": f"https://localhost:{port}"}
        config = ownerConfig(self.directory, port, {"owner": server | mine})
        code, out, err = await fleetctlAgainst(config, "--json", "console")
        self.assertEqual((code, err), (0, ""))
        await self.login(json.loads(out)["url"])
        device = self.adminURL(self.service, "/devices/w1")

        def look(browser: WebDriver) -> tuple[str, list[str], str]:
            from selenium.webdriver.common.by import By

            browser.get(device)
            self.screenshot("device-reader")
            text = pageText(browser)
            links = [
                str(a.get_attribute("href"))
                for a in browser.find_elements(By.CSS_SELECTOR, "main a")
            ]
            csrf = browser.find_element(By.CSS_SELECTOR, 'input[name="csrf"]')
            return text, links, str(csrf.get_attribute("value"))

        text, links, csrf = await self.inBrowser(look)
        self.assertIn("nightwatch", text)
        self.assertIn("reader", text)
        self.assertIn("provisioning, approving and retiring are for owners", text)
        self.assertEqual([a for a in links if "/devices/w1/" in a], [])

        def forge(browser: WebDriver) -> str:
            browser.execute_script(FORGE, csrf)
            return pageText(browser)

        refused = await self.inBrowser(forge)
        line = refusalLine("nightwatch", "POST /devices/w1/provision")
        self.assertIn(line, refused)
        entries = await self.journal()
        found = [
            (e["actor"], e["fields"]["via"])
            for e in entries
            if e["event"] == "admin.reader-refused"
        ]
        self.assertEqual(found, [("reader:nightwatch", "console")])
        self.assertNotIn("run.created", [e["event"] for e in entries])
