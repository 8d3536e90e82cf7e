"""
C{make run} ends with the next steps (issue 27, item 10): the Makefile's
own C{run} recipe, run by make on a terminal (a pty) against a dev-style
config on free ports, prints, once fleetd is ready, a fleetctl line, the
owner console's login link (which opens) and C{make demo}; printed to a
file instead, it holds no link. Ctrl-C stops fleetd as before.
"""

from __future__ import annotations

import http.client
import os
import pty
import re
import select
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from twisted.trial.unittest import SynchronousTestCase

from fleetd.pki.dev import DevPKIPaths
from fleetd.sim.daemon import freePort
from tests.support import REPO, writeConfig

BANNER = "== fleetd is ready"
LINK = re.compile(r"https://\S+/login\?token=\S+")
# What make must not redo here: the venv (pip) and the system packages.
SKIP = ["-o", ".venv/.installed", "-o", "system-build"]


def devStyleConfig(directory: Path) -> tuple[Path, int]:
    """A dev-style config with each listener on its own free port and
    console links under localhost, as conf/fleetd.dev.toml has them; the
    config and its admin port."""
    listen = "tcp:{}:interface=127.0.0.1"
    admin = freePort()
    tables = {
        "listen": {
            "boot": listen.format(freePort()),
            "device": listen.format(freePort()),
            "admin": listen.format(admin),
            "tink": listen.format(freePort()),
            "dns": f"{freePort()}:interface=127.0.0.1",
        },
        "owner": {"server": f"https://localhost:{admin}", "console_host": "localhost"},
    }
    return writeConfig(directory, tables), admin


def opens(url: str, ca: Path) -> tuple[int, str]:
    """GET C{url} as a browser here: resolved by the system, verified."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(
        parts.hostname, parts.port, context=context, timeout=10
    )
    try:
        conn.request("GET", f"{parts.path}?{parts.query}")
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


class MakeRunTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = Path(self.mktemp()).resolve()
        self.config, self.admin = devStyleConfig(self.directory)
        self.env = {**os.environ, "PYTHONPATH": str(REPO / "src")}

    def makeRun(self, stdout: int | IO[bytes]) -> subprocess.Popen[bytes]:
        """C{make run} with this test's config, in its own session (a
        terminal's foreground group, for Ctrl-C); stopped at cleanup."""
        bin = Path(sys.executable).parent
        process = subprocess.Popen(
            ["make", "--no-print-directory", *SKIP, "run",
             f"DEV_CONFIG={self.config}", f"BIN={bin}"],
            cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.addCleanup(self.stop, process)
        return process

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def readUntil(self, fd: int, done: Callable[[str], bool], seconds: float) -> str:
        """What C{fd} (a pty) says until C{done} holds of it."""
        text, deadline = "", time.monotonic() + seconds
        while not done(text) and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the pty closed: everyone is gone
                    break
                text += chunk.decode(errors="replace")
        return text

    def test_terminal_nextStepsWithAWorkingLink(self) -> None:
        """On a terminal, once fleetd is ready: the fleetctl line, a login
        link to this admin port that opens here (dev CA), and make demo;
        then Ctrl-C stops fleetd and make."""
        master, slave = pty.openpty()
        self.addCleanup(os.close, master)
        process = self.makeRun(slave)
        os.close(slave)
        text = self.readUntil(master, lambda t: "make demo" in t, 90)
        self.assertIn(BANNER, text, text[-3000:])
        steps = text[text.index(BANNER) :]
        self.assertIn(f"fleetctl --config {self.config} device list", steps)
        found = LINK.search(steps)
        assert found is not None, steps
        parts = urlsplit(found.group(0))
        self.assertEqual((parts.hostname, parts.port), ("localhost", self.admin))
        ca = DevPKIPaths.inside(self.directory / "pki").public_ca
        status, page = opens(found.group(0), ca)
        self.assertEqual(status, 200)
        self.assertIn("Sign in", page)
        os.killpg(process.pid, signal.SIGINT)
        after = self.readUntil(master, lambda t: "Server Shut Down" in t, 30)
        self.assertIn("Server Shut Down", after)
        process.wait(30)

    def test_file_noLinkKept(self) -> None:
        """To a file (which may persist), the next steps name the command
        that prints a link, and no link or token is written anywhere."""
        out = self.directory / "run.out"
        with out.open("wb") as sink:
            process = self.makeRun(sink)
        deadline = time.monotonic() + 90
        while "make demo" not in out.read_text() and time.monotonic() < deadline:
            self.assertIsNone(process.poll(), out.read_text()[-3000:])
            time.sleep(0.2)
        text = out.read_text()
        self.assertIn(BANNER, text, text[-3000:])
        self.assertIn(f"fleetctl --config {self.config} console", text)
        self.assertNotIn("token=", text)
        self.assertIsNone(LINK.search(text))
