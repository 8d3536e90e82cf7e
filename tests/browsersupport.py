"""
Real headless Chromium for the owner console's tests, driven by Selenium
through the system chromedriver (Debian C{chromium}, C{chromium-driver}).

L{Browser} is one Chromium with its own temporary HOME and profile. It trusts
exactly the CAs it is given, through an NSS database in that HOME (how
Chromium on Linux takes locally trusted roots; made with C{certutil} from
C{libnss3-tools}), so a page loads only over a certificate that really
verifies for its name: no C{acceptInsecureCerts}. Its host resolver maps the
given names (the site's enrollment name) to 127.0.0.1 and no other name
resolves at all, so the URL C{fleetctl console} prints works unchanged and
nothing leaves loopback (Chromium 156 still tries a few Google and search
engine requests however it is flagged; they die at this resolver).

L{BrowserTestCase} is a trial TestCase with a real daemon in the test's
reactor (L{DaemonTestMixin}) and one browser per test class. Selenium
blocks, so every step that touches the browser runs in a thread
(L{BrowserTestCase.inBrowser}), which leaves the reactor free to serve the
pages; the class's dev PKI is copied into each test's daemon, so the browser
started for the first test trusts every later test's daemon too::

    class FleetPageTests(BrowserTestCase):
        async def test_fleet(self) -> None:
            self.makeSettings()
            service = self.startDaemon()
            url = self.adminURL(service, "/healthz")

            def steps(browser: WebDriver) -> str:
                browser.get(url)
                self.screenshot("healthz")
                return pageText(browser)

            self.assertIn('"status"', await self.inBrowser(steps))
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, TestCase

from fleetd.pki.dev import DevPKIPaths, ensureDevPKI
from fleetd.service import FleetdService
from tests.daemonsupport import DaemonTestMixin, DeliveryMixin
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.support import REPO, TOPOLOGY, missingPeer

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

# Debian's binary itself, not the /usr/bin/chromium wrapper, which exports
# Google API keys and loads the extensions under /usr/share/chromium.
CHROMIUM = Path("/usr/lib/chromium/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
NAME = str(TOPOLOGY["enrollment_name"])
WINDOW = (1280, 900)
LOADING_TIMEOUT = 30  # seconds for one page load or script

# Features that reach out on their own (hints, on-device models, the media
# router, translation, network time, preconnecting the search engine).
QUIET_FEATURES = (
    "OptimizationHints,OptimizationHintsFetching,OptimizationGuideModelDownloading,"
    "OptimizationGuideOnDeviceModel,MediaRouter,DialMediaRouteProvider,Translate,"
    "NetworkTimeServiceQuerying,SearchEnginePreconnector,SearchEnginePreconnect2,"
    "AutofillServerCommunication,CertificateTransparencyComponentUpdater"
)

_T = TypeVar("_T")
_P = ParamSpec("_P")
_log = Logger()


def missing() -> list[str]:
    """What the browser tests need and this machine lacks (empty: nothing)."""
    lacking = []
    if not os.access(CHROMIUM, os.X_OK):
        lacking.append(f"chromium ({CHROMIUM})")
    if not os.access(CHROMEDRIVER, os.X_OK):
        lacking.append(f"chromium-driver ({CHROMEDRIVER})")
    if shutil.which("certutil") is None:
        lacking.append("certutil (libnss3-tools)")
    if importlib.util.find_spec("selenium") is None:
        lacking.append("selenium (the test extras)")
    return lacking


def requireBrowser() -> None:
    """Skip, or fail under C{make test}, when a browser cannot start here."""
    lacking = missing()
    if lacking:
        raise missingPeer("browser tests need " + ", ".join(lacking))


def chromiumArguments(
    profile: Path, names: Sequence[str], address: str = "127.0.0.1"
) -> list[str]:
    """
    Chromium's command line: headless, as root, in C{profile}, with each of
    C{names} resolving to C{address} and no other name resolving at all
    (C{localhost} and 127.0.0.1 stay usable), no proxy, no background
    traffic worth the name.
    """
    rules = [f"MAP {name} {address}" for name in names]
    rules += ["MAP * ~NOTFOUND", "EXCLUDE localhost", "EXCLUDE 127.0.0.1"]
    return [
        "--headless=new",
        "--no-sandbox",  # the tests run as root
        "--disable-dev-shm-usage",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--force-device-scale-factor=1",
        "--lang=en-US",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=" + ", ".join(rules),
        "--no-proxy-server",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-breakpad",
        "--disable-search-engine-choice-screen",
        "--no-pings",
        "--metrics-recording-only",
        "--disable-features=" + QUIET_FEATURES,
    ]


class Browser:
    """
    One headless Chromium and its chromedriver, in a directory of their own
    (removed by L{quit}). Starting it blocks (0.3-0.6 s here).

    @ivar driver: the Selenium session.
    @ivar startSeconds: how long the start took.
    """

    def __init__(
        self,
        cas: Sequence[Path] = (),
        names: Sequence[str] = (NAME,),
        *,
        directory: Path | None = None,
        netlog: Path | None = None,
    ) -> None:
        """
        @param cas: PEM files of the CAs to trust for TLS servers (each
            file's first certificate).
        @param names: the host names that resolve, to 127.0.0.1.
        @param directory: where HOME, profile and logs go; a new temporary
            directory when L{None}.
        @param netlog: write Chromium's network log here (complete once the
            browser has quit).
        """
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        began = time.monotonic()
        self.directory = Path(tempfile.mkdtemp(prefix="fleetd-browser-", dir=directory))
        home = self.directory / "home"
        nssdb = home / ".pki" / "nssdb"  # the database Chromium reads on Linux
        nssdb.mkdir(parents=True)
        certutil = ["certutil", "-d", f"sql:{nssdb}"]
        subprocess.run([*certutil, "-N", "--empty-password"], check=True)
        for i, ca in enumerate(cas):
            add = ["-A", "-n", f"fleetd test CA {i}", "-t", "C,,", "-i", str(ca)]
            subprocess.run([*certutil, *add], check=True)
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for argument in chromiumArguments(self.directory / "profile", names):
            options.add_argument(argument)
        if netlog is not None:
            options.add_argument(f"--log-net-log={netlog}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        env = {
            **os.environ,
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
        }
        service = Service(
            executable_path=str(CHROMEDRIVER),
            env=env,
            log_output=str(self.directory / "chromedriver.log"),
        )
        try:
            self.driver: WebDriver = webdriver.Chrome(options=options, service=service)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        try:
            self.driver.set_page_load_timeout(LOADING_TIMEOUT)
            self.driver.set_script_timeout(LOADING_TIMEOUT)
            self._fitViewport()
        except BaseException:
            self.quit()
            raise
        self.startSeconds = time.monotonic() - began

    def _fitViewport(self) -> None:
        """
        Size the window so the page gets WINDOW (headless Chromium counts a
        window's bars: --window-size=1280,900 leaves the page 1280x757).
        """
        inner = self.driver.execute_script("return [innerWidth, innerHeight]")
        outer = self.driver.get_window_size()
        self._window = (
            outer["width"] + WINDOW[0] - inner[0],
            outer["height"] + WINDOW[1] - inner[1],
        )
        self.driver.set_window_size(*self._window)

    def reset(self) -> None:
        """
        Forget what one test left: extra windows, cookies (which are not
        per port, so a later daemon would get them), the cache, the size.
        """
        handles = self.driver.window_handles
        for handle in handles[1:]:
            self.driver.switch_to.window(handle)
            self.driver.close()
        self.driver.switch_to.window(handles[0])
        self.driver.get("about:blank")
        self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
        self.driver.execute_cdp_cmd("Network.clearBrowserCache", {})
        self.driver.set_window_size(*self._window)

    def saveState(self, directory: Path, stem: str) -> list[Path]:
        """
        Write the page's screenshot, source and console log (C{stem}.png,
        .html, .console.txt) and chromedriver's log into C{directory}.
        """
        directory.mkdir(parents=True, exist_ok=True)
        saved = []
        shot = directory / f"{stem}.png"
        if self.driver.save_screenshot(str(shot)):
            saved.append(shot)
        source = directory / f"{stem}.html"
        source.write_text(
            f"<!-- {self.driver.current_url} -->\n{self.driver.page_source}"
        )
        saved.append(source)
        console = directory / f"{stem}.console.txt"
        entries = self.driver.get_log("browser")
        console.write_text("".join(f"{e['level']} {e['message']}\n" for e in entries))
        saved.append(console)
        driverLog = self.directory / "chromedriver.log"
        if driverLog.exists():
            saved.append(
                Path(shutil.copy(driverLog, directory / f"{stem}.chromedriver.log"))
            )
        return saved

    def quit(self) -> None:
        """Stop Chromium and chromedriver; remove the directory."""
        try:
            self.driver.quit()
        except Exception:
            _log.warn("quitting Chromium failed; stopping chromedriver")
            self.driver.service.stop()  # the session is gone: end chromedriver
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def pageText(driver: WebDriver) -> str:
    """The text of the page's body as rendered (C{innerText})."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def screenshotDirectory() -> Path | None:
    """
    C{FLEETD_SCREENSHOTS} as a directory (relative to the checkout, since
    trial runs in C{_trial_temp}), or L{None} when unset.
    """
    value = os.environ.get("FLEETD_SCREENSHOTS")
    if not value:
        return None
    return REPO / value  # an absolute value stays itself


class _ClassBrowser:
    """A test class's dev PKI and the browser that trusts its public CA."""

    def __init__(self, owner: type, name: str) -> None:
        self.owner = owner
        self.name = name
        self.base = Path(tempfile.mkdtemp(prefix="fleetd-browser-class-"))
        self.pki = ensureDevPKI(self.base / "pki", name)
        self.browser: Browser | None = None

    def started(self) -> Browser:
        if self.browser is None:
            self.browser = Browser(
                [self.pki.public_ca], [self.name], directory=self.base
            )
        return self.browser

    def retire(self) -> None:
        try:
            browser = self.browser
            self.browser = None
            if browser is not None:
                browser.quit()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


_current: _ClassBrowser | None = None


def _forClass(owner: type, name: str) -> _ClassBrowser:
    """The browser of C{owner}'s tests; the previous class's is quit."""
    global _current
    previous = _current
    if previous is not None and (previous.owner, previous.name) != (owner, name):
        _current = None
        previous.retire()
    if _current is None:
        _current = _ClassBrowser(owner, name)
    return _current


@atexit.register
def _retireLast() -> None:
    if _current is not None:
        _current.retire()


class BrowserTestCase(DaemonTestMixin, TestCase):
    """
    A test with a real daemon (L{DaemonTestMixin}: L{makeSettings},
    L{startDaemon}, L{port}) and C{self.browser}, a Selenium session on a
    headless Chromium shared by the tests of the class (reset between
    them). Touch the browser only in L{inBrowser} steps.

    L{makeSettings} seeds the daemon's dev PKI with the class's, which the
    browser trusts; a daemon started otherwise (a twistd process) needs
    L{seedPKI} on its C{pki/} directory before it starts.

    When the test fails, the page's screenshot, source and console log are
    saved under the test's temporary directory (the path is logged and
    written to stderr).

    @cvar mappedName: the name the browser resolves to 127.0.0.1 and the
        class's certificate is for; the settings' enrollment name must be it.
    """

    mappedName: ClassVar[str] = NAME
    browser: WebDriver
    _browsing: _ClassBrowser
    _shots: Path | None = None
    failureState: list[Path]

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        requireBrowser()
        self._captureFailures()

        def started(shared: _ClassBrowser) -> None:
            self._browsing = shared
            self.browser = shared.started().driver
            # First registered, last run: after the daemon has stopped.
            self.addCleanup(deferToThread, self._resetBrowser)

        d = deferToThread(_forClass, type(self), self.mappedName)
        return d.addCallback(started)

    def _resetBrowser(self) -> None:
        browser = self._browsing.browser
        if browser is None:
            return
        try:
            browser.reset()
        except Exception:
            # A crashed or wedged browser: the next test starts a fresh one.
            self._browsing.browser = None
            browser.quit()
            raise

    def _captureFailures(self) -> None:
        """Wrap the test method to save the browser's state when it fails."""
        name = self._testMethodName
        method = getattr(self, name)

        @functools.wraps(method)
        def captured() -> Deferred[object]:
            def failed(failure: Failure) -> Deferred[object] | Failure:
                if failure.check(SkipTest) or self._browsing.browser is None:
                    return failure
                d = deferToThread(self._saveFailure)
                return d.addBoth(lambda _: failure)

            return maybeDeferred(method).addErrback(failed)

        setattr(self, name, captured)

    def _saveFailure(self) -> None:
        browser = self._browsing.browser
        assert browser is not None
        saved = self.failureState = browser.saveState(Path(self.mktemp()), "failure")
        where = ", ".join(str(path.resolve()) for path in saved)
        _log.info(
            "{test}: browser state at the failure: {where}", test=self, where=where
        )
        sys.stderr.write(f"\n{self.id()}: browser state at the failure: {where}\n")

    def makeSettings(self, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        """L{DaemonTestMixin.makeSettings}, then the class's dev PKI seeded."""
        super().makeSettings(overrides)
        name = self.settings.topology.enrollment_name
        self.assertEqual(
            name, self.mappedName, "the browser resolves and trusts mappedName only"
        )
        self.seedPKI(self.settings.tls.cert.parent)

    @property
    def browserPKI(self) -> DevPKIPaths:
        """The class's dev PKI, whose public CA the browser trusts."""
        return self._browsing.pki

    def seedPKI(self, directory: Path) -> None:
        """
        Copy the class's dev PKI into C{directory} (a daemon's C{pki/}, the
        parent of C{[tls] cert}); with C{[dev] generate_pki} the daemon keeps
        a complete set as it is.
        """
        shutil.copytree(self.browserPKI.directory, directory, dirs_exist_ok=True)
        os.chmod(directory, 0o700)

    def url(self, port: int, path: str = "/") -> str:
        """C{path} on the mapped name and C{port}, over HTTPS."""
        return f"https://{self.mappedName}:{port}{path}"

    def adminURL(self, service: FleetdService, path: str = "/") -> str:
        """C{path} on C{service}'s admin listener, as a browser reaches it."""
        return self.url(self.port(service, "admin"), path)

    def inBrowser(
        self,
        steps: Callable[Concatenate[WebDriver, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> Deferred[_T]:
        """Run C{steps(self.browser, *args, **kwargs)} in a thread."""
        return deferToThread(steps, self.browser, *args, **kwargs)

    def screenshot(self, name: str) -> Path:
        """
        Save the page as C{name}.png in C{$FLEETD_SCREENSHOTS} when set (so
        C{FLEETD_SCREENSHOTS=docs/console make unit} renews the committed
        pictures), else in the test's temporary directory. Blocks: call it
        in L{inBrowser} steps.
        """
        directory = screenshotDirectory()
        if directory is None:
            if self._shots is None:
                self._shots = Path(self.mktemp())
            directory = self._shots
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.png"
        if not self.browser.save_screenshot(str(path)):
            raise AssertionError(f"no screenshot written to {path}")
        return path


class ConsoleBrowserTestCase(DeliveryMixin, BrowserTestCase):
    """
    A browser test of the owner console: L{startConsole} starts the daemon
    (as L{DeliveryMixin}: C{addDevice}, C{provision}, C{journal}, ...) and
    L{login} signs the class's browser in with a link from C{fleetctl
    --json console}, as an owner would.
    """

    service: FleetdService

    async def startConsole(
        self, overrides: dict[str, dict[str, Any]] | None = None
    ) -> FleetdService:
        self.makeSettings(overrides)
        self.service = self.startDaemon()
        await self.service.loading.whenReady()
        return self.service

    async def consoleLink(self) -> str:
        """A one-time login link, as C{fleetctl --json console} prints it."""
        config = ownerConfig(self.directory, self.port(self.service, "admin"))
        code, out, err = await fleetctlAgainst(config, "--json", "console")
        if code != 0:
            raise AssertionError(f"fleetctl console failed: {err}")
        url: str = json.loads(out)["url"]
        return url

    async def login(self, url: str | None = None) -> str:
        """
        Sign the browser in with C{url} (by default a new link from
        fleetctl): open it and press its "Sign in" button; returns the page
        text of the fleet view it lands on.
        """
        if url is None:
            url = await self.consoleLink()

        def steps(browser: WebDriver) -> str:
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support.ui import WebDriverWait

            browser.get(url)
            browser.find_element(
                By.CSS_SELECTOR, 'form[action="/login"] button'
            ).click()

            WebDriverWait(browser, 10).until(lambda b: urlPath(b.current_url) == "/")
            return pageText(browser)

        text: str = await self.inBrowser(steps)
        return text


def urlPath(url: str) -> str:
    return urlsplit(url).path
