"""
fleetctl against a running daemon: one harness for every test that drives it.

fleetctl runs in-process (its C{main} with captured output) in a thread,
so the reactor keeps serving the daemon it talks to.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from fleetd.cli import fleetctl
from tests.support import writeConfig


class Terminal(io.StringIO):
    """Standard input that is a terminal, holding what the person types."""

    def isatty(self) -> bool:
        return True


def runFleetctl(
    argv: list[str], stdin: io.StringIO | None = None
) -> tuple[int, str, str]:
    """
    fleetctl's C{main} over C{argv}: (exit status, stdout, stderr). Its
    standard input is C{stdin}, by default empty and not a terminal (as
    in a script), never the test runner's.
    """
    out, err = io.StringIO(), io.StringIO()
    code = fleetctl.main(argv, out, err, io.StringIO() if stdin is None else stdin)
    return code, out.getvalue(), err.getvalue()


def ownerConfig(
    directory: Path,
    port: int,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """
    Rewrite the dev config in C{directory} with C{owner.server} naming the
    admin listener on C{localhost:port} (plus C{overrides}); return its path.
    """
    tables = {"owner": {"server": f"https://localhost:{port}"}, **(overrides or {})}
    return writeConfig(directory, tables)


def fleetctlAgainst(
    config: Path | str, *argv: str, stdin: io.StringIO | None = None
) -> Deferred[tuple[int, str, str]]:
    """Run C{fleetctl --config config argv...} in a thread."""
    return deferToThread(runFleetctl, ["--config", str(config), *argv], stdin)
