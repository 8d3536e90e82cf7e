"""
The browser tests' own machinery (tests/browsersupport.py) against the real
daemon as it is: a headless Chromium reaches the admin listener by the
enrollment name, trusts the dev public CA and nothing else, and contacts
nothing beyond loopback.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
from collections.abc import Callable, Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.ssl import PrivateCertificate
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import Data

from fleetd.pki.dev import ensureDevPKI
from tests.browsersupport import (
    NAME,
    WINDOW,
    Browser,
    BrowserTestCase,
    pageText,
)

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver


def remoteAddresses(netlog: Path) -> Iterator[tuple[str, str]]:
    """
    (event, address) of each TCP connection attempt and each UDP socket
    that sent bytes in Chromium's network log. (A UDP socket connected but
    silent is Chromium's IPv6 reachability probe: a route lookup, no packet.)
    """
    log = json.loads(netlog.read_text())
    types = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    udp: dict[int, str] = {}
    sent: set[int] = set()
    for event in log["events"]:
        kind, params = types[event["type"]], event.get("params", {})
        if "address" not in params and kind != "UDP_BYTES_SENT":
            continue  # the end of an event says how it went, not where
        if kind == "TCP_CONNECT_ATTEMPT":
            yield kind, params["address"]
        elif kind == "UDP_CONNECT":
            udp[event["source"]["id"]] = params["address"]
        elif kind == "UDP_BYTES_SENT":
            sent.add(event["source"]["id"])
    for source in sent:
        yield "UDP_BYTES_SENT", udp.get(source, "unconnected")


def loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


class BrowserInfraTests(BrowserTestCase):
    """One browser for the class; a daemon per test."""

    async def test_healthz_byEnrollmentName(self) -> None:
        """The browser opens /healthz at https://<enrollment name>:<admin
        port>, trusting the daemon's certificate through the dev CA."""
        self.makeSettings()
        service = self.startDaemon()
        await service.loading.whenReady()
        url = self.adminURL(service, "/healthz")
        self.assertTrue(url.startswith(f"https://{NAME}:"), url)

        def steps(browser: WebDriver) -> tuple[str, str]:
            browser.get(url)
            return browser.current_url, pageText(browser)

        current, text = await self.inBrowser(steps)
        self.assertEqual(current, url)
        self.assertIn('"status"', text)
        self.assertEqual(json.loads(text)["status"], "ok")
        self.assertIs(self.browser.capabilities.get("acceptInsecureCerts"), False)

    async def test_whoami_withoutClientCertificate(self) -> None:
        """Owner resources refuse a browser without an owner certificate."""
        self.makeSettings()
        service = self.startDaemon()
        url = self.adminURL(service, "/v1/admin/whoami")

        def steps(browser: WebDriver) -> str:
            browser.get(url)
            return pageText(browser)

        text = await self.inBrowser(steps)
        self.assertIn("owner client certificate required", text)

    async def test_otherCA_refused(self) -> None:
        """A server for the same name under another CA gets Chromium's
        interstitial, not its page: the trust is the dev CA's, not a
        blanket acceptance."""
        other = ensureDevPKI(Path(self.mktemp()) / "pki", NAME)
        pem = other.public_key.read_bytes() + other.public_cert.read_bytes()
        root = Resource()
        root.putChild(b"", Data(b"impostor page", "text/plain"))
        listening = reactor.listenSSL(  # type: ignore[attr-defined]
            0,
            Site(root),
            PrivateCertificate.loadPEM(pem).options(),
            interface="127.0.0.1",
        )
        self.addCleanup(listening.stopListening)
        url = self.url(listening.getHost().port, "/")

        def steps(browser: WebDriver) -> tuple[str, str]:
            browser.get(url)
            return pageText(browser), browser.page_source

        text, source = await self.inBrowser(steps)
        self.assertNotIn("impostor page", text)
        self.assertIn("ERR_CERT_AUTHORITY_INVALID", source)

    async def test_onlyLoopback(self) -> None:
        """Chromium, as started here, connects to loopback only: its network
        log of a start, a page and a wait shows no other address."""
        self.makeSettings()
        service = self.startDaemon()
        url = self.adminURL(service, "/healthz")
        netlog = Path(self.mktemp())

        def browse() -> str:
            from selenium.common.exceptions import WebDriverException

            browser = Browser([self.browserPKI.public_ca], netlog=netlog)
            try:
                browser.driver.get(url)
                try:
                    browser.driver.get("https://example.com/")
                except WebDriverException as e:
                    return str(e)
                return pageText(browser.driver)
            finally:
                browser.quit()

        self.assertIn("ERR_NAME_NOT_RESOLVED", await deferToThread(browse))
        seen = list(remoteAddresses(netlog))
        self.assertIn(
            ("TCP_CONNECT_ATTEMPT", f"127.0.0.1:{self.port(service, 'admin')}"), seen
        )
        self.assertEqual([s for s in seen if not loopback(s[1])], [])

    async def test_reset_forgetsCookies(self) -> None:
        """Between tests the browser forgets cookies, which are not per
        port (a later test's daemon would be sent them) and extra windows."""
        self.makeSettings()
        service = self.startDaemon()
        url = self.adminURL(service, "/healthz")

        def steps(browser: WebDriver) -> list[dict[str, Any]]:
            browser.get(url)
            browser.add_cookie({"name": "session", "value": "x", "secure": True})
            browser.switch_to.new_window("tab")
            self._browsing.started().reset()
            browser.get(url)
            return browser.get_cookies()

        self.assertEqual(await self.inBrowser(steps), [])
        self.assertEqual(len(self.browser.window_handles), 1)

    async def test_screenshot(self) -> None:
        """screenshot(name) writes name.png into $FLEETD_SCREENSHOTS."""
        self.makeSettings()
        service = self.startDaemon()
        url = self.adminURL(service, "/healthz")
        directory = Path(self.mktemp()).resolve()
        self.patch(os, "environ", {**os.environ, "FLEETD_SCREENSHOTS": str(directory)})

        def steps(browser: WebDriver) -> Path:
            browser.get(url)
            return self.screenshot("healthz")

        path = await self.inBrowser(steps)
        self.assertEqual(path, directory / "healthz.png")
        png = path.read_bytes()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(struct.unpack(">II", png[16:24]), WINDOW)  # IHDR's size

    async def test_failure_savesBrowserState(self) -> None:
        """A failing browser test leaves the page's screenshot, source and
        console log in its temporary directory, and says where."""
        self.makeSettings()
        service = self.startDaemon()
        url = self.adminURL(service, "/healthz")
        await self.inBrowser(lambda b: b.get(url))
        failing = BrowserInfraTests("failsOnPurpose")
        failing._browsing = self._browsing
        failing._captureFailures()
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        wrapped = cast(Callable[[], Deferred[None]], failing.failsOnPurpose)
        await self.assertFailure(wrapped(), failing.failureException)
        self.assertIn("browser state at the failure", stderr.getvalue())
        saved = {p.name: p for p in failing.failureState}
        self.assertEqual(
            sorted(saved),
            [
                "failure.chromedriver.log",
                "failure.console.txt",
                "failure.html",
                "failure.png",
            ],
        )
        self.assertIn('"status"', saved["failure.html"].read_text())

    def failsOnPurpose(self) -> None:
        """Run only by test_failure_savesBrowserState."""
        self.fail("on purpose")
