"""
The README's commands work as written (issue 19): each shell block marked
C{<!-- runnable: ... -->} runs, line by line in one shell, from a copy of
the checkout's C{conf/} against a fleetd started on the dev configuration
(its fixed loopback ports, its dev PKI under C{.dev/state}; only the vault
moves to a directory of the test's own). A line's exit status must be 0,
or the one its comment names (C{# exit 1 ...}); C{<CODE>} stands for the
code the block's C{provision} printed, as a reader would copy it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from twisted.trial.unittest import TestCase

from tests.support import REPO

MARK = "<!-- runnable:"
EXIT = re.compile(r"#.*\bexit (\d+)\b")
CODE = re.compile(r"\bcode (\S+)")
SENTINEL = "__readme_rc__"


def runnableBlocks(text: str) -> list[list[str]]:
    """The commands of each marked block, continuation lines joined."""
    blocks: list[list[str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(MARK) or not lines[i + 1].startswith("```"):
            continue
        commands: list[str] = []
        pending = ""
        for body in lines[i + 2 :]:
            if body.startswith("```"):
                break
            if body.endswith("\\"):
                pending += body[:-1] + " "
                continue
            command = (pending + body).strip()
            pending = ""
            if command:
                commands.append(command)
        blocks.append(commands)
    return blocks


class Shell:
    """One bash, fed a line at a time; each line's output and status."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, command: str) -> tuple[int, str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{command}\necho {SENTINEL}$?\n")
        self.process.stdin.flush()
        output: list[str] = []
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"the shell ended during: {command}")
            if line.startswith(SENTINEL):
                return int(line[len(SENTINEL) :]), "".join(output)
            output.append(line)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(10)


class ReadmeTests(TestCase):
    timeout = 180

    def setUp(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fleetd-readme-"))
        self.addCleanup(shutil.rmtree, self.root, True)
        shutil.copytree(REPO / "conf", self.root / "conf")
        (self.root / ".venv").symlink_to(REPO / ".venv")
        self.vault = Path(tempfile.mkdtemp(prefix="fleetd-readme-", dir="/dev/shm"))
        self.addCleanup(shutil.rmtree, self.vault, True)
        config = self.root / "conf" / "fleetd.dev.toml"
        text = config.read_text()
        own = re.sub(r'(?m)^vault = ".*"$', f'vault = "{self.vault}/configs"', text)
        self.assertNotEqual(own, text)
        config.write_text(own)
        self.env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        twistd = Path(sys.executable).parent / "twistd"
        self.log = self.root / "fleetd.log"
        with open(self.log, "wb") as log:
            self.daemon = subprocess.Popen(
                [str(twistd), "-n", "--pidfile=", "fleetd", "--config", str(config)],
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.addCleanup(self.stopDaemon)
        self.waitHealthy()

    def stopDaemon(self) -> None:
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(30)

    def waitHealthy(self) -> None:
        ca = self.root / ".dev" / "state" / "pki" / "public-ca.pem"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                last = self.log.read_text(errors="replace").splitlines()[-5:]
                self.fail(
                    f"fleetd on the dev configuration exited with"
                    f" {self.daemon.returncode} (are the dev ports taken, by"
                    f" `make run`?): " + " | ".join(last)
                )
            try:
                context = ssl.create_default_context(cafile=str(ca))
                with urllib.request.urlopen(
                    "https://localhost:8446/healthz", context=context, timeout=2
                ) as answer:
                    if answer.status == 200:
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        self.fail("fleetd on the dev configuration did not become ready")

    def test_walkthrough_runsAsWritten(self) -> None:
        """Every line of the README's runnable blocks exits as it says."""
        blocks = runnableBlocks((REPO / "README.md").read_text())
        self.assertTrue(blocks, "no runnable block in the README")
        shell = Shell(self.root, self.env)
        self.addCleanup(shell.close)
        code: str | None = None
        for commands in blocks:
            for command in commands:
                if "<CODE>" in command.split(" #")[0]:  # not in a comment
                    self.assertIsNotNone(code, f"no code printed before: {command}")
                    command = command.replace("<CODE>", str(code))
                expected = EXIT.search(command)
                status, output = shell.run(command)
                want = int(expected.group(1)) if expected else 0
                self.assertEqual(status, want, f"{command}\n{output}")
                found = CODE.search(output) if " provision " in command else None
                if found is not None:
                    code = found.group(1)
