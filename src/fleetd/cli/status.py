"""
C{fleetctl status NAME}: the device's record, its latest run and that
run's state, open alerts, the last journal entries, and the recovery step.
"""

from __future__ import annotations

import argparse
import urllib.parse
from datetime import UTC, datetime
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.cli.output import formatEntry, when
from fleetd.clitools import writeJSON
from fleetd.config import Settings


def addCommands(commands: Any) -> None:
    status = commands.add_parser(
        "status", help="what state a device is in, and what to do about it"
    )
    status.add_argument("name", metavar="NAME")
    status.set_defaults(handler=cmdStatus)


def cmdStatus(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    name = urllib.parse.quote(args.name, safe="")
    doc = AdminClient(settings).request("GET", f"/v1/admin/status/{name}")
    if args.json:
        writeJSON(out, doc, sortKeys=True)
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
            " until the node attests through spore)\n"
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
    for line in trustLines(doc.get("trust")) + diskLines(doc.get("disks")):
        out.write(line + "\n")
    _credentials(doc.get("kubernetes"), out)
    if doc["journal"]:
        out.write("journal:\n")
        for entry in doc["journal"]:
            out.write(f"  {formatEntry(entry)}\n")
    return 0


def trustLines(trust: dict[str, Any] | None) -> list[str]:
    """The binding and the evidence behind it, as C{fleetctl status} shows them."""
    if trust is None:
        return []
    binding = trust["binding"]
    if binding is None:
        lines = ["binding:  none approved"]
    else:
        state = binding["state"]
        if binding["problem"]:
            state += f" ({binding['problem']})"
        lines = [
            f"binding:  {state}: EK {binding['ek_sha256']}"
            f"  on evidence {binding['evidence']}  by {binding['approved_by']}"
        ]
    records = trust["evidence"]
    if not records:
        lines.append("evidence: none")
    else:
        lines.append("evidence:")
        for r in records:
            note = "" if r["independent"] else "  (cannot approve)"
            if r["withdrawn"]:
                note = f"  (withdrawn: {r['withdrawn']['reason']})"
            ref = f"  ref {r['ref']}" if r["ref"] else ""
            lines.append(f"  {r['id']:>5}  {r['kind']}  EK {r['ek_sha256']}{ref}{note}")
    return lines


def diskLines(disks: dict[str, Any] | None) -> list[str]:
    """The device's last disk report [D1]."""
    if disks is None:
        return ["disks:    not reported"]
    verdict = disks["verdict"]
    if verdict == "ok":
        verdict = f"ok, target disk serial {disks['target']}"
    return [f"disks:    {len(disks['disks'])} reported; {verdict}"]


def _credentials(kube: dict[str, Any] | None, out: IO[str]) -> None:
    """[K7] The per-node token and the kubelet certificate."""
    if kube is None:
        return
    token = kube.get("token")
    if token is None:
        out.write("token:    none issued\n")
    else:
        state = (
            "deleted"
            if token["deleted_at"]
            else ("expired" if token["expired"] else "live")
        )
        out.write(
            f"token:    {token['token_id']}  {state}"
            f"  expires {when(token['expires_at'])}"
            f"  deletion due {when(token['delete_at'])}"
            f"  deleted {when(token['deleted_at'])}\n"
        )
    cert = kube.get("kubelet")
    if cert is None:
        out.write("kubelet:  no certificate approved by fleetd\n")
    else:
        out.write(
            f"kubelet:  approved {when(cert['first_approved_at'])}"
            f"  last {when(cert['last_approved_at'])}"
            f"  notAfter {when(cert['not_after'])}"
            + (f"  retired {when(cert['retired_at'])}" if cert["retired_at"] else "")
            + "\n"
        )
    if kube.get("note"):
        out.write(f"note:     {kube['note']}\n")
