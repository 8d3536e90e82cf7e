"""
C{fleetctl approve USER-CODE --device NAME} (or C{--deny}): the owner's
decision on a device-flow request (RFC 8628).

Before approving, fleetctl shows what the node reported (uuid, serial,
mac, hostname, peer, whether it sent its one-time code) next to the
inventory's record of NAME, one line per field.  uuids compare in lower
case and serials without regard to case, as the server compares them; a
uuid or serial the node did not report counts as different.  When one
differs, fleetctl prints C{MISMATCH} and does not approve unless
C{--force} is given: a request from a machine the owner does not
recognise is RFC 8628 section 5.4's remote phishing.  C{--force} does not
switch the server's check off: it sends the fields the owner saw differ
(C{accept_mismatch}), the server approves only if exactly those differ,
and journals the approval with C{forced=true} and what differed.
With C{--json}, the request object is printed (plus C{inventory} and
C{mismatch} members when approving).
"""

from __future__ import annotations

import argparse
import urllib.parse
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.clitools import CLIError, writeJSON
from fleetd.config import Settings
from fleetd.deviceflow.model import COMPARED, normaliseUserCode, sameIdentity

BASE = "/v1/admin/device-flow"


def addCommands(commands: Any) -> None:
    """Register C{approve} on fleetctl's subcommand parsers."""
    approve = commands.add_parser(
        "approve", help="approve (or deny) a device-flow user code"
    )
    approve.add_argument("user_code", metavar="USER-CODE", help="e.g. BCDF-GHJK")
    approve.add_argument("--device", help="the inventory device the node is")
    approve.add_argument("--deny", action="store_true", help="deny the request")
    approve.add_argument(
        "--force",
        action="store_true",
        help="approve despite the uuid/serial MISMATCH shown (journaled as forced)",
    )
    approve.set_defaults(handler=cmdApprove, deviceArgs=("device",))


def _find(client: AdminClient, userCode: str) -> dict[str, Any] | None:
    """The pending request C{userCode} names, if it is listed."""
    letters = normaliseUserCode(userCode)
    for request in client.request("GET", BASE)["pending"]:
        if normaliseUserCode(str(request["user_code"])) == letters:
            found: dict[str, Any] = request
            return found
    return None


def _inventory(client: AdminClient, device: str) -> dict[str, Any] | None:
    """The inventory's record of C{device}, or L{None} if fleetd has none."""
    path = "/v1/admin/devices/" + urllib.parse.quote(device, safe="")
    try:
        record = client.request("GET", path)
    except CLIError:
        return None
    return record if isinstance(record, dict) else None


def mismatches(request: dict[str, Any], record: dict[str, Any] | None) -> list[str]:
    """The compared fields the node reported differently from C{record}."""
    if record is None:
        return []
    reported = request.get("reported") or {}
    found = []
    for name in COMPARED:
        mine, theirs = reported.get(name), record.get(name)
        if theirs is None:
            continue
        if mine is None or not sameIdentity(str(mine), str(theirs), name):
            found.append(name)
    return found


def comparison(request: dict[str, Any], record: dict[str, Any] | None) -> list[str]:
    """One line per field: reported value, inventory value, C{MISMATCH}."""
    reported = request.get("reported") or {}
    bad = mismatches(request, record)
    inventory: dict[str, str] = {}
    if record is not None:
        inventory = {
            "uuid": str(record.get("uuid") or "-"),
            "serial": str(record.get("serial") or "-"),
            "mac": ", ".join(record.get("macs") or []) or "-",
            "hostname": str(record.get("name") or "-"),
        }
    lines = []
    for name in ("uuid", "serial", "mac", "hostname"):
        line = f"{name:<9} {reported.get(name, '(not reported)'):<38}"
        if record is not None:
            line += f" inventory {inventory[name]}"
        if name in bad:
            line += "  MISMATCH"
        lines.append(line.rstrip())
    lines.append(f"{'peer':<9} {request.get('peer', '-')}")
    sent = "sent" if request.get("code_sent") else "not sent"
    lines.append(f"{'code':<9} {sent}")
    if record is None:
        lines.append("(no inventory record to compare with)")
    return lines


def cmdApprove(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    if args.deny == bool(args.device):
        raise CLIError("approve: give either --device NAME or --deny", 2)
    client = AdminClient(settings)
    if args.deny:
        result = client.request(
            "POST", f"{BASE}/deny", body={"user_code": args.user_code}
        )
        if args.json:
            writeJSON(out, result, sortKeys=True)
        else:
            out.write(f"denied {result['user_code']}\n")
            for line in comparison(result, None)[:-1]:
                out.write(line + "\n")
        return 0
    record = _inventory(client, args.device)
    listed = _find(client, args.user_code)
    bad = [] if listed is None else mismatches(listed, record)
    if bad and not args.force:
        for line in [] if args.json or listed is None else comparison(listed, record):
            out.write(line + "\n")
        raise CLIError(
            f"approve: MISMATCH in {', '.join(bad)} for {args.device}; "
            "not approved (check the machine, or pass --force)"
        )
    body: dict[str, object] = {"user_code": args.user_code, "device": args.device}
    if bad:  # the server compares again and approves only this difference
        body["accept_mismatch"] = bad
    result = client.request("POST", f"{BASE}/approve", body=body)
    if args.json:
        result = dict(result, inventory=record, mismatch=mismatches(result, record))
        writeJSON(out, result, sortKeys=True)
        return 0
    out.write(f"approved {result['user_code']} for {result['device']}")
    out.write(f" (forced: {', '.join(bad)} differ)\n" if bad else "\n")
    for line in comparison(result, record):
        out.write(line + "\n")
    return 0
