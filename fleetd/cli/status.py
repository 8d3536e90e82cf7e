"""
C{fleetctl status NAME}: the device's record, its latest run and that
run's state, open alerts, the last journal entries, and the recovery step.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from datetime import UTC, datetime
from typing import IO, Any

from fleetd.config import Settings


def addCommands(commands: Any) -> None:
    status = commands.add_parser(
        "status", help="what state a device is in, and what to do about it"
    )
    status.add_argument("name", metavar="NAME")
    status.set_defaults(handler=cmdStatus)


def cmdStatus(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    from fleetd.cli.fleetctl import AdminClient, formatEntry

    name = urllib.parse.quote(args.name, safe="")
    doc = AdminClient(settings).request("GET", f"/v1/admin/status/{name}")
    if args.json:
        out.write(json.dumps(doc, sort_keys=True) + "\n")
        return 0
    device = doc["device"]
    out.write(
        f"{device['name']}  {device['status']}  class {device['class']}"
        f"  serial {device['serial']}  uuid {device['uuid']}\n"
    )
    run = doc["run"]
    if run is None:
        out.write("run:      none\n")
    else:
        out.write(f"run:      {run['run']}  {run['state']}\n")
    out.write(f"state:    {doc['state']}\n")
    ldevid = doc.get("ldevid")
    if ldevid is None:
        out.write(
            "ldevid:   none from spore (a capsule/forge LDevID is accepted"
            " until the node renews)\n"
        )
    else:
        until = datetime.fromtimestamp(ldevid["not_after"], UTC).strftime("%Y-%m-%d")
        out.write(
            f"ldevid:   {ldevid['issuer']}  until {until}  ({ldevid['how']},"
            " current issuer; legacy LDevIDs refused)\n"
        )
    alerts = doc["alerts"]
    out.write(f"alerts:   {', '.join(alerts) if alerts else 'none'}\n")
    out.write(f"recovery: {doc['recovery'] or 'nothing to do'}\n")
    if doc["journal"]:
        out.write("journal:\n")
        for entry in doc["journal"]:
            out.write(f"  {formatEntry(entry)}\n")
    return 0
