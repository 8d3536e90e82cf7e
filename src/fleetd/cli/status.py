"""
C{fleetctl status NAME}: the device's record, its latest run and that
run's state, open alerts, the last journal entries, and the recovery step,
in the words of L{fleetd.statuswords} (the console's device page uses
the same).
"""

from __future__ import annotations

import argparse
import urllib.parse
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.clitools import writeJSON
from fleetd.config import Settings
from fleetd.statuswords import statusLines


def addCommands(commands: Any) -> None:
    status = commands.add_parser(
        "status", help="what state a device is in, and what to do about it"
    )
    status.add_argument("name", metavar="NAME")
    status.set_defaults(handler=cmdStatus, deviceArgs=("name",))


def cmdStatus(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    name = urllib.parse.quote(args.name, safe="")
    doc = AdminClient(settings).request("GET", f"/v1/admin/status/{name}")
    if args.json:
        writeJSON(out, doc, sortKeys=True)
        return 0
    out.write("".join(line + "\n" for line in statusLines(doc)))
    return 0
