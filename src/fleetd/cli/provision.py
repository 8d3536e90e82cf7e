"""
C{fleetctl provision NAME... [--desired-action netboot]}.

One run per device, all in one request (a rack at once). Prints each run
id and its one-time code; the codes are shown here and nowhere else, so
this output is what the owner writes to META 0x0b (or hands to the
installer). C{--json}: an object for one name, an array for several.
With C{[tinkerbell]} each run's Workflow and the device's Hardware follow
(issue 28): made, or waiting for a retry and why.
"""

from __future__ import annotations

import argparse
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.clitools import writeJSON
from fleetd.config import Settings
from fleetd.statuswords import objectRows


def addCommands(commands: Any) -> None:
    provision = commands.add_parser(
        "provision", help="start a run per device: render, mint a one-time code"
    )
    provision.add_argument("names", nargs="+", metavar="NAME")
    provision.add_argument(
        "--desired-action",
        choices=["netboot"],
        help="the run expects a network boot after install",
    )
    provision.set_defaults(handler=cmdProvision, deviceArgs=("names",))


def cmdProvision(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    result = AdminClient(settings).request(
        "POST",
        "/v1/admin/provision",
        body={"devices": args.names, "desired_action": args.desired_action},
    )
    runs = result["runs"]
    if args.json:
        writeJSON(out, runs[0] if len(runs) == 1 else runs)
    else:
        for run in runs:
            out.write(f"{run['device']}  run {run['run']}  code {run['code']}\n")
            for row in objectRows(run.get("tinkerbell")):
                out.writelines(f"  {line}\n" for line in row.lines())
    return 0
