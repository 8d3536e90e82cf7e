"""
C{make run}'s last words: once the fleetd it started is ready, what to try
next (issue 27, item 10).

    .venv/bin/python scripts/next_steps.py --config conf/fleetd.dev.toml --pid PID

C{make run} starts this in the background, then execs C{twistd -n fleetd}
in the foreground in the same shell, so PID (the shell's, C{$$}) is the
daemon's: fleetd and its signals stay as C{twistd -n} has them. This
waits until C{/healthz} answers 200 through the owner's admin client (the
dev CA; ready means a TLS handshake with every listener passed), prints
the next steps to its standard output, the terminal of C{make run}, and
exits: a fleetctl line to try, the owner console's one-time login link
(C{fleetctl console}), and C{make demo}. It exits without a word when PID
ends first (the daemon did not start: its own log says why) or after
C{--wait} seconds.

The login link is a credential (one session, once, within minutes), so it
is printed only to a terminal: when standard output is a file or a pipe,
which may persist, the line names the command that prints one instead.
fleetd's own log never holds it, and its journal records only that a link
was issued.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))  # this checkout's fleetd, as make run's

from fleetd.cli import fleetctl  # noqa: E402
from fleetd.cli.client import AdminClient  # noqa: E402
from fleetd.clitools import CLIError  # noqa: E402
from fleetd.config import ConfigError, Settings, loadSettings  # noqa: E402

POLL = 0.25  # seconds between /healthz attempts


def alive(pid: int) -> bool:
    """Whether process C{pid} still exists (the daemon make run execs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ready(settings: Settings) -> bool:
    """Whether the fleetd of C{settings} answers C{/healthz} with 200."""
    try:
        AdminClient(settings, timeout=5).request("GET", "/healthz")
    except (CLIError, OSError):  # OSError: the dev PKI not yet generated
        return False
    return True


def consoleLink(config: Path) -> tuple[str, float] | None:
    """A one-time login link from C{fleetctl console}, and its expiry."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config", str(config), "--json", "console"]
    if fleetctl.main(argv, out, err, io.StringIO()) != 0:
        return None
    document = json.loads(out.getvalue())
    return str(document["url"]), float(document["expires_at"])


def nextSteps(config: str, link: tuple[str, float] | None, terminal: bool) -> list[str]:
    """The lines to print; the link only when C{terminal}."""
    fleetctlLine = f".venv/bin/fleetctl --config {shlex.quote(config)}"
    console = f"{fleetctlLine} console"
    if link is not None and terminal:
        url, expires = link
        until = datetime.fromtimestamp(expires, UTC).strftime("%H:%M:%S UTC")
        consoleLines = [url, f"(open it once, before {until}; another: {console})"]
    else:
        consoleLines = [f"{console}    (prints a one-time login link)"]
    steps = [
        ("the owner's CLI", [f"{fleetctlLine} device list"]),
        ("the owner console", consoleLines),
        (
            "virtual nodes",
            [
                "make demo    (a rack of 8 on a fleetd of its own)",
                f".venv/bin/fleetd-sim --config {shlex.quote(config)} --nodes 3"
                "    (a rack against this fleetd)",
            ],
        ),
    ]
    lines = [f"== fleetd is ready ({config}). Next, in another terminal:"]
    for title, values in steps:
        for i, value in enumerate(values):
            lines.append(f"  {title + ':' if i == 0 else '':19} {value}")
    return lines


def waitReady(
    settings: Settings,
    pid: int,
    wait: float,
    isReady: Callable[[Settings], bool] = ready,
    isAlive: Callable[[int], bool] = alive,
) -> bool:
    """Poll until the daemon is ready (True), or gone or too slow (False)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not isAlive(pid):
            return False
        if isReady(settings):
            return True
        time.sleep(POLL)
    return False


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="next_steps.py", description="make run's next steps, once ready."
    )
    parser.add_argument("--config", required=True, help="the config make run uses")
    parser.add_argument("--pid", type=int, required=True, help="the daemon's pid")
    parser.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for readiness"
    )
    args = parser.parse_args(argv)
    output = sys.stdout if out is None else out
    config = Path(args.config)
    try:
        settings = loadSettings(config)
    except ConfigError:
        return 0  # the daemon stops on it too, and its log says why
    if not waitReady(settings, args.pid, args.wait):
        return 0
    terminal = output.isatty()
    link = consoleLink(config) if terminal else None
    output.write("\n".join(nextSteps(args.config, link, terminal)) + "\n")
    output.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
