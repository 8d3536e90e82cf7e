"""
C{fleetctl cluster-token request --node NAME --reason TEXT},
C{fleetctl cluster-token approve REQ}, C{fleetctl cluster-token rotate}
[K5][K6] and C{fleetctl retire NAME [--yes]} [R1].

Retiring cannot be undone, so C{retire} asks first: at a terminal the
owner types the device's name; elsewhere (a script) only C{--yes} retires.

The token printed by C{approve} and C{rotate} appears in that output and
nowhere else fleetd writes.
"""

from __future__ import annotations

import argparse
import urllib.parse
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.cli.output import Console, when
from fleetd.clitools import CLIError, writeJSON
from fleetd.config import Settings
from fleetd.statuswords import retirementLines


def addCommands(commands: Any) -> None:
    token = commands.add_parser(
        "cluster-token", help="request, approve or rotate the cluster-wide token"
    )
    actions = token.add_subparsers(
        dest="action", required=True, parser_class=token.__class__
    )
    request = actions.add_parser("request", help="ask to join a node with it")
    request.add_argument("--node", required=True, metavar="NAME")
    request.add_argument("--reason", required=True, metavar="TEXT")
    request.set_defaults(handler=cmdRequest)
    approve = actions.add_parser("approve", help="approve a request; prints the token")
    approve.add_argument("request", metavar="REQ")
    approve.set_defaults(handler=cmdApprove)
    rotate = actions.add_parser("rotate", help="replace the cluster-wide token")
    rotate.set_defaults(handler=cmdRotate)
    pending = actions.add_parser("list", help="pending requests")
    pending.set_defaults(handler=cmdList)

    retire = commands.add_parser(
        "retire", help="delete the Node and tokens, mark decommissioning"
    )
    retire.add_argument("name", metavar="NAME")
    retire.add_argument(
        "--yes",
        action="store_true",
        help="do not ask: retiring cannot be undone (without --yes, type NAME)",
    )
    retire.set_defaults(handler=cmdRetire, deviceArgs=("name",))


def _post(settings: Settings, path: str, body: dict[str, Any]) -> Any:
    return AdminClient(settings).request("POST", path, body=body)


def cmdRequest(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    doc = _post(
        settings,
        "/v1/admin/cluster-token/request",
        {"node": args.node, "reason": args.reason},
    )
    if args.json:
        writeJSON(out, doc, sortKeys=True)
    else:
        out.write(
            f"request {doc['request']}  node {doc['node']}  pending:"
            f" an owner runs 'fleetctl cluster-token approve {doc['request']}'\n"
        )
    return 0


def cmdApprove(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    doc = _post(settings, "/v1/admin/cluster-token/approve", {"request": args.request})
    if args.json:
        writeJSON(out, doc, sortKeys=True)
    else:
        out.write(
            f"request {doc['request']}  node {doc['node']}  approved\n"
            f"cluster.token: {doc['token']}\n"
            "shown once: put it in that node's Talos configuration (cluster.token);"
            " fleetd approves its first kubelet certificate\n"
        )
    return 0


def cmdRotate(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    doc = _post(settings, "/v1/admin/cluster-token/rotate", {})
    if args.json:
        writeJSON(out, doc, sortKeys=True)
        return 0
    out.write(f"new cluster.token: {doc['token']}  (id {doc['token_id']})\n")
    if doc["old_token_id"]:
        out.write(
            f"old token {doc['old_token_id']} is deleted at"
            f" {when(doc['old_deleted_at'])}\n"
        )
    out.write("what must change in the cluster's Talos configurations:\n")
    for n, step in enumerate(doc["steps"], 1):
        out.write(f"  {n}. {step}\n")
    return 0


def cmdList(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    doc = AdminClient(settings).request("GET", "/v1/admin/cluster-token")
    if args.json:
        writeJSON(out, doc["pending"], sortKeys=True)
        return 0
    for r in doc["pending"]:
        out.write(
            f"{r['request']}  node {r['node']}  by {r['requested_by']}"
            f"  at {when(r['requested_at'])}  reason: {r['reason']}\n"
        )
    return 0


def confirmRetire(record: dict[str, Any], console: Console) -> None:
    """
    Ask a person at the terminal to type the device's name; without a
    terminal, or when something else is typed, refuse: nothing changed.
    """
    name = record["name"]
    if not console.interactive():
        raise CLIError(
            f"retire: retiring {name} cannot be undone: pass --yes"
            " (or run at a terminal and type its name)",
            2,
        )
    typed = console.ask(
        f"retire {name} (serial {record['serial']}, {record['status']}): its"
        " Node and tokens are deleted and it can never be provisioned again;"
        " this cannot be undone (a new device record brings the machine back)."
        f"\nType {name} to retire it: "
    )
    if typed.lower() != name:
        raise CLIError(
            f"retire: not confirmed ({typed or 'nothing'} typed, not {name});"
            " nothing changed"
        )


def cmdRetire(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    client = AdminClient(settings)
    path = "/v1/admin/devices/" + urllib.parse.quote(args.name, safe="")
    record = client.request("GET", path)  # an unknown name: refused, not asked
    if not args.yes:
        confirmRetire(record, args.console)
    doc = client.request("POST", "/v1/admin/retire", body={"device": args.name})
    if args.json:
        writeJSON(out, doc, sortKeys=True)
        return 0
    out.write("".join(line + "\n" for line in retirementLines(doc)))
    return 0
