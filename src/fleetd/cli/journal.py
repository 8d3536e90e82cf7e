"""
C{fleetctl journal list | verify | reanchor --reason TEXT}: show the
journal, check its hash chain, or acknowledge a break (issue 19 item 5;
the runbook is in docs/operations.md).

C{fleetctl journal [--device NAME] [--run RUN] [--since SEQ]}, without a
sub-command, is C{journal list} as it always was (issue 27, item 11).
"""

from __future__ import annotations

import argparse
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.cli.output import formatEntry
from fleetd.clitools import CLIError, writeJSON
from fleetd.config import Settings

FILTERS = ("device", "run", "since")


def addFilters(parser: argparse.ArgumentParser, *, keepEarlier: bool = False) -> None:
    """
    C{--device}, C{--run}, C{--since} on C{parser}. With C{keepEarlier}
    (on C{journal list}), a filter not given there leaves the one given
    before the sub-command (C{journal --device w1 list}) as it is.
    """

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if keepEarlier else value

    parser.add_argument(
        "--device", default=default(None), help="only entries about this device"
    )
    parser.add_argument(
        "--run", default=default(None), help="only entries about this run"
    )
    parser.add_argument(
        "--since", type=int, default=default(0), help="entries after this seq"
    )


def addCommands(commands: Any) -> None:
    """Register C{journal} and its sub-commands on fleetctl's parsers."""
    journal = commands.add_parser(
        "journal", help="list, verify or re-anchor the journal"
    )
    addFilters(journal)
    journal.set_defaults(handler=cmdJournal, deviceArgs=("device",))
    actions = journal.add_subparsers(dest="action", parser_class=type(journal))
    listing = actions.add_parser(
        "list", help="journal entries, oldest first (the default)"
    )
    addFilters(listing, keepEarlier=True)
    listing.set_defaults(handler=cmdJournal)
    verify = actions.add_parser("verify", help="check the hash chain")
    verify.set_defaults(handler=cmdVerify)
    reanchor = actions.add_parser(
        "reanchor", help="acknowledge a break in the chain (docs/operations.md)"
    )
    reanchor.add_argument(
        "--reason", required=True, help="why the break is acknowledged (journaled)"
    )
    reanchor.set_defaults(handler=cmdReanchor)


def _noFilters(args: argparse.Namespace) -> None:
    """A filter given with C{verify} or C{reanchor} is a usage mistake."""
    given = [f"--{name}" for name in FILTERS if getattr(args, name, None)]
    if given:
        raise CLIError(
            f"journal {args.action}: {', '.join(given)} goes with 'journal list'", 2
        )


def cmdVerify(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    _noFilters(args)
    result = AdminClient(settings).request("GET", "/v1/admin/journal/verify")
    if args.json:
        writeJSON(out, result)
    else:
        out.write(describeVerification(result) + "\n")
    return 0 if result["ok"] else 1


def cmdReanchor(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    _noFilters(args)
    done = AdminClient(settings).request(
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


def cmdJournal(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    """C{journal list} (and C{journal} without a sub-command)."""
    query = {}
    if args.device:
        query["device"] = args.device
    if args.run:
        query["run"] = args.run
    if args.since:
        query["since"] = str(args.since)
    result = AdminClient(settings).request("GET", "/v1/admin/journal", query)
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
