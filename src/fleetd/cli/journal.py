"""
C{fleetctl journal [verify | reanchor --reason TEXT]}: show the journal,
check its hash chain, or acknowledge a break (issue 19 item 5; the
runbook is in docs/operations.md).
"""

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
    journal.add_argument(
        "action",
        nargs="?",
        help="'verify' to check the hash chain; 'reanchor' to acknowledge a break",
    )
    journal.add_argument("--reason", help="why the break is acknowledged (reanchor)")
    journal.add_argument("--device", help="only entries about this device")
    journal.add_argument("--run", help="only entries about this run")
    journal.add_argument("--since", type=int, default=0, help="entries after this seq")
    journal.set_defaults(handler=cmdJournal, deviceArgs=("device",))


def cmdJournal(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    if args.action not in (None, "verify", "reanchor"):
        raise CLIError(
            f"journal: unknown action {args.action!r} (only 'verify', 'reanchor')", 2
        )
    if (args.action == "reanchor") != (args.reason is not None):
        raise CLIError("journal: --reason goes with 'reanchor', and it needs one", 2)
    client = AdminClient(settings)
    if args.action == "verify":
        result = client.request("GET", "/v1/admin/journal/verify")
        if args.json:
            writeJSON(out, result)
        else:
            out.write(describeVerification(result) + "\n")
        return 0 if result["ok"] else 1
    if args.action == "reanchor":
        done = client.request(
            "POST", "/v1/admin/journal/reanchor", body={"reason": args.reason}
        )
        if args.json:
            writeJSON(out, done)
        else:
            out.write(
                f"journal re-anchored at seq {done['seq']}: break at seq"
                f" {done['break_seq']} acknowledged ({done['problem']}; found"
                f" {done['found'] or 'nothing'}, expected"
                f" {done['expected'] or 'unknown'})\n"
            )
        return 0
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


def describeVerification(result: dict[str, Any]) -> str:
    """C{fleetctl journal verify}'s line for a verification."""
    acknowledged = result.get("acknowledged") or []
    if result["ok"] and not acknowledged:
        return f"journal OK: {result['entries']} entries, chain intact"
    earlier = "".join(
        f"; break at seq {a['break_seq']} acknowledged at seq {a['seq']}"
        for a in acknowledged[:-1]
    )
    if result["ok"]:
        last = acknowledged[-1]
        return (
            f"journal OK: {result['entries']} entries, intact since re-anchor at"
            f" seq {last['seq']}; break at seq {last['break_seq']} acknowledged"
            f"{earlier}"
        )
    line = f"journal BROKEN at seq {result['seq']}: {result['problem']}"
    if acknowledged:
        last = acknowledged[-1]
        line += (
            f" (after the re-anchor at seq {last['seq']}; break at seq"
            f" {last['break_seq']} acknowledged{earlier})"
        )
    return line + "; see docs/operations.md before 'fleetctl journal reanchor'"
