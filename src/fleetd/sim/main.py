"""
C{fleetd-sim}'s entry point: the rack needs the C{sim} extra (grpcio: the
tink-server stand-in and the nodes' tink agents), which a production
install leaves out. Without it, one line names the extra to install
instead of a traceback from deep in an import; with it, the command
proper (L{fleetd.sim.command}).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO

EXTRA = "sim"
MISSING = (
    "fleetd-sim: needs the {extra} extra ({module} is missing):"
    " pip install 'fleetd[{extra}]' (make demo installs it)"
)


def missingExtra() -> str | None:
    """One line naming the extra to install, or L{None} when it is there."""
    try:
        import grpc  # noqa: F401
    except ImportError:
        return MISSING.format(extra=EXTRA, module="grpcio")
    return None


def main(argv: Sequence[str] | None = None, err: IO[str] | None = None) -> int:
    """Exit 2 with one line on stderr when the C{sim} extra is missing."""
    line = missingExtra()
    if line is not None:
        (sys.stderr if err is None else err).write(line + "\n")
        return 2
    from fleetd.sim.command import main as run

    return run(argv)
