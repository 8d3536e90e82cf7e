"""
The verification page in a real headless Chromium (issue 20 acceptance): a
node runs the device flow against the boot listener, the owner signs in
with a C{fleetctl console} link, types the node's user code on C{/device},
sees what the node reported beside the record, and approves (the node then
fetches its configuration) or denies; a mismatch needs the second step.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from twisted.internet.threads import deferToThread

from fleetd.admin.console import verify as verifyModule
from tests.browsersupport import ConsoleBrowserTestCase, pageText
from tests.daemonsupport import UUID1
from tests.test_deviceflow_daemon import GRANT, boot

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

MAC = "52:54:00:ab:cd:ef"
WAIT = 15  # seconds for a page to show what a step waits for


def waitFor(browser: WebDriver, css: str) -> Any:
    """The element C{css} selects, once the page shows it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT)
    return wait.until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def click(browser: WebDriver, css: str, typing: tuple[str, str] | None = None) -> None:
    """
    Click C{css} and wait for the page it submits to replace this one;
    C{typing}: first type C{typing[1]} into the field C{typing[0]} selects.
    """
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    if typing is not None:
        waitFor(browser, typing[0]).send_keys(typing[1])
    button = waitFor(browser, css)
    button.click()
    WebDriverWait(browser, WAIT).until(expected_conditions.staleness_of(button))


def lookUp(browser: WebDriver, url: str, userCode: str) -> str:
    """Open C{/device}, type C{userCode} and look it up; the page's text."""
    browser.get(url)
    field = 'input[type=text][name="user_code"]'
    click(browser, "form[method=get] button[type=submit]", typing=(field, userCode))
    waitFor(browser, 'button[name="action"][value="deny"]')
    return pageText(browser)


class VerifyPageBrowserTests(ConsoleBrowserTestCase):
    """Issue 20 item 1: the device flow decided on /device in a browser."""

    timeout = 180

    async def setUpNode(self, serial: str = "SER1") -> dict[str, Any]:
        """A daemon with w1 provisioned, an owner signed in, a node asking."""
        await self.startConsole()
        await self.addDevice("w1", "SER1", UUID1, macs=[MAC])
        await self.provision("w1")
        await self.login()
        form = {"client_id": "talos", "uuid": UUID1, "serial": serial, "mac": MAC,
                "hostname": "talos-x1", "code": "node-secret-1"}  # fmt: skip
        status, body = await self.node("POST", "/device/code", form=form)
        self.assertEqual(status, 200, body)
        grant: dict[str, Any] = json.loads(body)
        return grant

    async def node(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        port = self.port(self.service, "boot")
        result: tuple[int, bytes] = await deferToThread(
            boot, port, str(self.pki.public_ca), method, path, **kwargs
        )
        return result

    async def poll(self, grant: dict[str, Any]) -> dict[str, Any]:
        form = {"grant_type": GRANT, "device_code": grant["device_code"],
                "client_id": "talos"}  # fmt: skip
        _, body = await self.node("POST", "/token", form=form)
        document: dict[str, Any] = json.loads(body)
        return document

    async def decisions(self) -> list[dict[str, Any]]:
        entries = await self.journal()
        decided = ("deviceflow.approved", "deviceflow.denied")
        return [e for e in entries if e["event"] in decided]

    async def test_approve_nodeFetchesItsConfiguration(self) -> None:
        """
        Typed in lower case without its dash, the user code shows the
        node's report beside w1's record; approving lets the node's next
        poll get a token, and the token its configuration.
        """
        grant = await self.setUpNode()
        url = self.adminURL(self.service, "/device")
        typed = grant["user_code"].lower().replace("-", "")

        def steps(browser: WebDriver) -> tuple[str, str]:
            shown = lookUp(browser, url, typed)
            self.screenshot("verify")
            click(browser, 'button[name="action"][value="approve"]')
            return shown, pageText(browser)

        shown, outcome = await self.inBrowser(steps)
        for value in (UUID1, "SER1", MAC, "talos-x1", "127.0.0.1", "Inventory: w1"):
            self.assertIn(value, shown)
        self.assertNotIn("differs", shown)
        self.assertNotIn("node-secret-1", shown)
        self.assertIn("will fetch its configuration on its next poll", outcome)
        token = await self.poll(grant)
        self.assertIn("access_token", token)
        status, body = await self.node("GET", "/config", bearer=token["access_token"])
        self.assertEqual(status, 200)
        self.assertIn(b"hostname: w1", body)
        (entry,) = await self.decisions()
        self.assertEqual((entry["event"], entry["fields"]["via"]),
                         ("deviceflow.approved", "console"))  # fmt: skip

    async def test_automaticReload_isNotUse(self) -> None:
        """
        /device reloads itself while a request waits (console.js, at its URL
        with auto=1): the reload does not count as use of the session (the
        idle timeout still ends it), and the marker leaves the address bar.
        """
        await self.setUpNode()
        self.patch(verifyModule, "REFRESH", 2)
        (session,) = self.service.consoleSessions._sessions.values()
        url = self.adminURL(self.service, "/device")

        def steps(browser: WebDriver) -> tuple[float, str, str]:
            from selenium.webdriver.support.ui import WebDriverWait

            browser.get(url)
            seen = session.seen
            browser.execute_script("window.fleetdBefore = 1;")
            WebDriverWait(browser, WAIT).until(
                lambda b: b.execute_script(
                    "return window.fleetdBefore === undefined"
                    " && document.readyState === 'complete'"
                )
            )
            return seen, browser.current_url, pageText(browser)

        seen, current, shown = await self.inBrowser(steps)
        self.assertIn("Pending requests", shown)
        self.assertEqual(session.seen, seen, "an automatic reload counted as use")
        self.assertEqual(current, url, "the auto marker stayed in the address bar")

    async def test_deny_nodeHearsAccessDenied(self) -> None:
        """Denying on the page ends the node's flow with access_denied."""
        grant = await self.setUpNode()
        url = self.adminURL(self.service, "/device")

        def steps(browser: WebDriver) -> str:
            lookUp(browser, url, grant["user_code"])
            click(browser, 'button[name="action"][value="deny"]')
            return pageText(browser)

        self.assertIn("Denied", await self.inBrowser(steps))
        self.assertEqual((await self.poll(grant))["error"], "access_denied")
        (entry,) = await self.decisions()
        self.assertEqual(entry["event"], "deviceflow.denied")

    async def test_mismatch_needsTheSecondStep(self) -> None:
        """
        A node reporting another serial: the first approval is refused and
        shows the box confirm_mismatch; ticked, the approval goes through,
        journaled as forced.
        """
        grant = await self.setUpNode(serial="SER-OTHER")
        url = self.adminURL(self.service, "/device")

        def first(browser: WebDriver) -> str:
            shown = lookUp(browser, url, grant["user_code"])
            self.assertIn("no inventory device's", shown)  # none to pre-choose
            click(
                browser,
                'form:has(input[name="device"]) button',
                typing=('input[name="device"]', "w1"),
            )
            shown = pageText(browser)
            self.assertIn("differs: approving needs a second step", shown)
            self.assertIn("SER-OTHER", shown)
            click(browser, 'button[name="action"][value="approve"]')
            waitFor(browser, 'input[type=checkbox][name="confirm_mismatch"]')
            return pageText(browser)

        refused = await self.inBrowser(first)
        self.assertIn("mismatch", refused)
        self.assertEqual(await self.decisions(), [])

        def second(browser: WebDriver) -> str:
            self.screenshot("verify-mismatch")
            waitFor(browser, 'input[name="confirm_mismatch"]').click()
            click(browser, 'button[name="action"][value="approve"]')
            return pageText(browser)

        self.assertIn("journaled as forced", await self.inBrowser(second))
        (entry,) = await self.decisions()
        fields = entry["fields"]
        self.assertEqual((entry["event"], fields["forced"], fields["mismatch"]),
                         ("deviceflow.approved", True, "serial"))  # fmt: skip
        self.assertIn("access_token", await self.poll(grant))
