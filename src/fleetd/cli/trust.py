"""
C{fleetctl evidence ...} and C{fleetctl binding ...}: machine trust [T1].

  - C{evidence add --serial S --ek-sha256 H --kind KIND [--ref R]}
  - C{evidence import FILE [--kind KIND] [--ref R]}: a supplier's CSV or
    JSON manifest (L{fleetd.trust.manifest}); rows without a kind are
    C{supplier-record}, rows without a ref get the file's name
  - C{evidence list [--serial S] [--wide]}
  - C{evidence withdraw ID --reason TEXT}
  - C{binding approve SERIAL [--ek-sha256 H]}, C{binding list [--wide]}
  - C{disks forget NAME --reason TEXT}: drop a device's disk report [D1]

Input is checked locally first, so a bad digest or manifest line is
reported before anything is sent; fleetd checks it again. Lists show the
first L{EK_PREFIX} hex digits of an EK digest, all 64 with C{--wide} (and
always with C{--json}).
"""

from __future__ import annotations

import argparse
import urllib.parse
from pathlib import Path
from typing import IO, Any

from fleetd.cli.client import AdminClient, postText, readUpload
from fleetd.cli.output import alignedTable, emit, when
from fleetd.clitools import CLIError
from fleetd.config import Settings
from fleetd.statuswords import approvalLine
from fleetd.trust.manifest import parseManifest
from fleetd.trust.model import EvidenceKind, TrustError, evidence, validateKind

EVIDENCE = "/v1/admin/evidence"
BINDINGS = "/v1/admin/bindings"
MAX_MANIFEST_BYTES = 16 << 20
KINDS = [k.value for k in EvidenceKind]
EK_PREFIX = 16


def ekCell(digest: str, wide: bool) -> str:
    """An EK digest in a list: its first L{EK_PREFIX} hex digits, or all."""
    return digest if wide else digest[:EK_PREFIX]


def evidenceLines(records: list[dict[str, Any]], wide: bool = False) -> list[str]:
    """Evidence as a table: withdrawn rows say so in the NOTE column."""
    rows = []
    for r in records:
        withdrawn = r.get("withdrawn")
        note = "" if r["independent"] else "cannot approve"
        if withdrawn:
            note = f"withdrawn {when(withdrawn['at'])}: {withdrawn['reason']}"
        rows.append(
            [
                str(r["id"]),
                r["serial"],
                ekCell(r["ek_sha256"], wide),
                r["kind"],
                r["ref"] or "-",
                when(r["recorded_at"]),
                r["recorded_by"],
                note,
            ]
        )
    header = ["ID", "SERIAL", "EK-SHA256", "KIND", "REF", "RECORDED", "BY", "NOTE"]
    return alignedTable(header, rows)


def bindingLines(views: list[dict[str, Any]], wide: bool = False) -> list[str]:
    """Bindings as a table: a suspended one says why in the STATE column."""
    rows = [
        [
            v["serial"],
            v["device"],
            ekCell(v["ek_sha256"], wide),
            str(v["evidence"]),
            when(v["approved_at"]),
            v["approved_by"],
            v["state"] + (f": {v['problem']}" if v["problem"] else ""),
        ]
        for v in views
    ]
    header = ["SERIAL", "DEVICE", "EK-SHA256", "EVIDENCE", "APPROVED", "BY", "STATE"]
    return alignedTable(header, rows)


def _conflictLines(conflicts: list[str]) -> list[str]:
    return [f"CONFLICT (journaled; blocks approval): {c}" for c in conflicts]


def cmdEvidenceAdd(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    try:
        claim = evidence(
            serial=args.serial, ek_sha256=args.ek_sha256, kind=args.kind, ref=args.ref
        )
    except TrustError as e:
        raise CLIError(f"evidence add: {e}") from None
    body = {
        "serial": claim.serial,
        "ek_sha256": claim.ek_sha256,
        "kind": claim.kind.value,
        "ref": claim.ref,
    }
    result = AdminClient(settings).request("POST", EVIDENCE, body=body)
    if result["recorded"]:
        record = result["recorded"][0]
        lines = [f"recorded evidence {record['id']}: {claim.kind.value} {claim.serial}"]
        if not claim.kind.independent:
            lines.append(
                f"note: {claim.kind.value} evidence can never approve a binding"
            )
    else:
        lines = [f"already recorded as evidence {result['unchanged'][0]['id']}"]
    emit(out, args, result, lines + _conflictLines(result["conflicts"]))
    return 0


def cmdEvidenceImport(
    settings: Settings, args: argparse.Namespace, out: IO[str]
) -> int:
    path = Path(args.file)
    text = readUpload(path, MAX_MANIFEST_BYTES, "evidence import")
    ref = args.ref if args.ref is not None else path.name[:128]
    try:
        kind = validateKind(args.kind)
        claims = parseManifest(text, kind=kind, ref=ref)
    except TrustError as e:
        raise CLIError(f"evidence import: {path}: {e}") from None
    if not claims:
        emit(out, args, {"recorded": 0, "unchanged": 0, "conflicts": []},
              [f"{path} lists no evidence; nothing recorded"])  # fmt: skip
        return 0
    isJSON = text.lstrip("\ufeff \t\r\n").startswith(("[", "{"))
    contentType = "application/json" if isJSON else "text/csv; charset=utf-8"
    query = "?" + urllib.parse.urlencode({"kind": kind.value, "ref": ref})
    client = AdminClient(settings)
    result = postText(client, f"{EVIDENCE}/import{query}", text, contentType)
    lines = [
        f"recorded {result['recorded']} new evidence from {path}"
        f" ({result['unchanged']} already recorded)"
    ]
    emit(out, args, result, lines + _conflictLines(result["conflicts"]))
    return 0


def cmdEvidenceList(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    query = {} if args.serial is None else {"serial": args.serial}
    result = AdminClient(settings).request("GET", EVIDENCE, query)
    lines = evidenceLines(result["evidence"], args.wide)
    emit(out, args, result["evidence"], lines)
    return 0


def cmdEvidenceWithdraw(
    settings: Settings, args: argparse.Namespace, out: IO[str]
) -> int:
    body = {"reason": args.reason}
    path = f"{EVIDENCE}/{args.id}/withdraw"
    result = AdminClient(settings).request("POST", path, body=body)
    emit(out, args, result, [f"withdrew evidence {result['id']}"])
    return 0


def cmdBindingApprove(
    settings: Settings, args: argparse.Namespace, out: IO[str]
) -> int:
    body: dict[str, str] = {"serial": args.serial}
    if args.ek_sha256 is not None:
        body["ek_sha256"] = args.ek_sha256
    result = AdminClient(settings).request("POST", f"{BINDINGS}/approve", body=body)
    emit(out, args, result, [approvalLine(result)])
    return 0


def cmdBindingList(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    result = AdminClient(settings).request("GET", BINDINGS)
    lines = bindingLines(result["bindings"], args.wide)
    emit(out, args, result["bindings"], lines)
    return 0


def cmdDisksForget(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    name = urllib.parse.quote(args.name, safe="")
    path = f"/v1/admin/disks/{name}/forget"
    result = AdminClient(settings).request("POST", path, body={"reason": args.reason})
    emit(out, args, result, [f"forgot the disk report of {result['device']}"])
    return 0


def addWideOption(parser: argparse.ArgumentParser) -> None:
    """C{--wide}: whole EK digests in a list."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help=f"whole EK digests (by default their first {EK_PREFIX} hex digits)",
    )


def addCommands(commands: Any) -> None:
    """Register C{evidence} and C{binding} on fleetctl's subparsers."""
    ev = commands.add_parser("evidence", help="evidence tying serials to EK digests")
    actions = ev.add_subparsers(dest="action", required=True, parser_class=type(ev))
    add = actions.add_parser("add", help="record one piece of evidence")
    add.add_argument("--serial", required=True, help="chassis serial")
    add.add_argument(
        "--ek-sha256",
        required=True,
        help="SHA-256 of the EK's DER SubjectPublicKeyInfo",
    )
    add.add_argument("--kind", required=True, choices=KINDS)
    add.add_argument("--ref", help="scan id, order or manifest reference")
    add.set_defaults(handler=cmdEvidenceAdd)
    load = actions.add_parser("import", help="import a supplier's CSV or JSON manifest")
    load.add_argument("file")
    load.add_argument(
        "--kind", default=EvidenceKind.SUPPLIER_RECORD.value, choices=KINDS
    )
    load.add_argument(
        "--ref", help="reference for rows without one (default: file name)"
    )
    load.set_defaults(handler=cmdEvidenceImport)
    listing = actions.add_parser("list", help="list evidence")
    listing.add_argument("--serial", help="only evidence naming this serial")
    addWideOption(listing)
    listing.set_defaults(handler=cmdEvidenceList)
    withdraw = actions.add_parser("withdraw", help="withdraw wrong evidence")
    withdraw.add_argument("id", type=int)
    withdraw.add_argument("--reason", required=True)
    withdraw.set_defaults(handler=cmdEvidenceWithdraw)

    binding = commands.add_parser("binding", help="approved EK bindings")
    bactions = binding.add_subparsers(
        dest="action", required=True, parser_class=type(binding)
    )
    approve = bactions.add_parser("approve", help="approve a serial's EK binding")
    approve.add_argument("serial", metavar="SERIAL")
    approve.add_argument("--ek-sha256", help="approve only this EK digest")
    approve.set_defaults(handler=cmdBindingApprove)
    blist = bactions.add_parser("list", help="list bindings and their state")
    addWideOption(blist)
    blist.set_defaults(handler=cmdBindingList)
    disks = commands.add_parser("disks", help="disk reports of nodes")
    dactions = disks.add_subparsers(
        dest="action", required=True, parser_class=type(disks)
    )
    forget = dactions.add_parser(
        "forget", help="drop a device's disk report (its disks moved on)"
    )
    forget.add_argument("name", metavar="NAME")
    forget.add_argument("--reason", required=True)
    forget.set_defaults(handler=cmdDisksForget, deviceArgs=("name",))
