"""C{fleetctl journal [verify]}: show the journal, or check its hash chain."""

from __future__ import annotations

import argparse
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.cli.output import formatEntry
from fleetd.clitools import CLIError, writeJSON
from fleetd.config import Settings


def addCommands(commands: Any) -> None:
    """Register C{journal} on fleetctl's subcommand parsers."""
    journal = commands.add_parser("journal", help="show or verify the journal")
    journal.add_argument("action", nargs="?", help="'verify' to check the hash chain")
    journal.add_argument("--device", help="only entries about this device")
    journal.add_argument("--run", help="only entries about this run")
    journal.add_argument("--since", type=int, default=0, help="entries after this seq")
    journal.set_defaults(handler=cmdJournal)


def cmdJournal(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    client = AdminClient(settings)
    if args.action == "verify":
        result = client.request("GET", "/v1/admin/journal/verify")
        if args.json:
            writeJSON(out, result)
        elif result["ok"]:
            out.write(f"journal OK: {result['entries']} entries, chain intact\n")
        else:
            out.write(f"journal BROKEN at seq {result['seq']}: {result['problem']}\n")
        return 0 if result["ok"] else 1
    if args.action is not None:
        raise CLIError(f"journal: unknown action {args.action!r} (only 'verify')", 2)
    query = {}
    if args.device:
        query["device"] = args.device
    if args.run:
        query["run"] = args.run
    if args.since:
        query["since"] = str(args.since)
    result = client.request("GET", "/v1/admin/journal", query)
    if args.json:
        writeJSON(out, result["entries"])
    else:
        for entry in result["entries"]:
            out.write(formatEntry(entry) + "\n")
    return 0
