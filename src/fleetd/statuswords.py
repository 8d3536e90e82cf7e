"""
The words of C{fleetctl status NAME}, for fleetctl and the owner console.

A device's status report (L{fleetd.fleet.status.DeviceReport.toJSON})
becomes a headline and labelled L{Row}s here, once: fleetctl prints them
as lines, the console's device page as a definition list. Pure functions
over JSON (nothing of fleetd but L{fleetd.textrows}): client and daemon
may both use them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fleetd.textrows import LABEL_WIDTH as LABEL_WIDTH
from fleetd.textrows import Row as Row
from fleetd.textrows import when as when


def entryParts(entry: dict[str, Any]) -> list[str]:
    """
    One journal entry's words: seq (padded to 6), time, event, actor,
    subject, then its fields sorted by name; a field without a value
    (null) is left out, as an empty subject is.
    """
    parts = [f"{entry['seq']:>6}", when(entry["at"]), entry["event"]]
    parts.append(f"actor={entry['actor']}")
    for key in ("device", "run"):
        if entry.get(key):
            parts.append(f"{key}={entry[key]}")
    for key, value in sorted((entry.get("fields") or {}).items()):
        if value is None:
            continue
        parts.append(
            f"{key}={json.dumps(value) if not isinstance(value, str) else value}"
        )
    return parts


def formatEntry(entry: dict[str, Any]) -> str:
    """One journal entry on one line: seq, time, event, actor, subject, fields."""
    return "  ".join(entryParts(entry))


def headline(doc: dict[str, Any]) -> str:
    """
    The report's first line: the device's name, status, class, serial,
    uuid, and its address when it has one.
    """
    device = doc["device"]
    address = device.get("address")
    return (
        f"{device['name']}  {device['status']}  class {device['class']}"
        f"  serial {device['serial']}  uuid {device['uuid']}"
        + ("" if address is None else f"  address {address}")
    )


def statusRows(doc: dict[str, Any], journal: bool = True) -> list[Row]:
    """
    Everything after the headline: run, state, LDevID, the standing
    refused attestation (when there is one), alerts, recovery, binding and
    evidence, disks, token and kubelet certificate, Tinkerbell's objects
    and the disk key (with their tables), and (with C{journal}) the last
    journal entries.
    """
    run = doc["run"]
    rows = [
        Row("run", "none" if run is None else f"{run['run']}  {run['state']}"),
        Row("state", doc["state"]),
        Row("ldevid", _ldevid(doc.get("ldevid"))),
        *refusalRows(doc.get("attest_refusal"), doc["recovery"]),
        Row("alerts", ", ".join(doc["alerts"]) or "none"),
        Row("recovery", doc["recovery"] or "nothing to do"),
        *trustRows(doc.get("trust")),
        diskRow(doc.get("disks")),
        *credentialRows(doc.get("kubernetes")),
        *objectRows(doc.get("tinkerbell")),
        *diskKeyRows(doc.get("disk_key")),
    ]
    if journal and doc["journal"]:
        rows.append(Row("journal", "", tuple(formatEntry(e) for e in doc["journal"])))
    return rows


def statusLines(doc: dict[str, Any]) -> list[str]:
    """C{fleetctl status}'s lines: the headline, then every row's lines."""
    return [headline(doc)] + [line for row in statusRows(doc) for line in row.lines()]


def _ldevid(ldevid: dict[str, Any] | None) -> str:
    if ldevid is None:
        return (
            "none from this fleetd (an LDevID from an older CA of the trust"
            " bundle is accepted until the node attests here)"
        )
    until = datetime.fromtimestamp(ldevid["not_after"], UTC).strftime("%Y-%m-%d")
    return (
        f"{ldevid['issuer']}  until {until}  ({ldevid['how']},"
        " current issuer; legacy LDevIDs refused)"
    )


# A refused attestation (issue 27, item 4): each reason code in words.
REFUSAL_WORDS = {
    "ek-binding-not-approved": "its TPM's EK has no approved binding",
    "serial-mismatch": "its TPM's EK is bound to another chassis",
    "tpm12-unsupported": "it has a TPM 1.2, which cannot attest",
    "class-refused": "its class cannot attest or install",
    "ek-cert-untrusted": "its EK certificate does not chain to a TPM vendor root",
    "device-retired": "it is being decommissioned",
    "device-unknown": "no inventory device has its bound serial",
    "inventory-ambiguous": "the inventory holds its serial more than once",
    "busy": "the inventory could not be asked",
}
NAMED_BY = {
    "ek-evidence": "by the serial its EK's evidence names",
    "reported-serial": "by the serial it reported",
    "reported-uuid": "by the uuid it reported",
}
CLONE_STEP = (
    "the TPM is a clone, or its evidence names two machines: see"
    ' docs/operations.md, "A refused attestation", before approving anything'
)
_STEPS = {
    "tpm12-unsupported": "none through fleetd: a TPM 1.2 cannot attest",
    "class-refused": "none through fleetd: install this machine another way",
    "ek-cert-untrusted": (
        "add its TPM vendor's root and intermediates to attest.ek_roots"
        " (fleetd-pki ek-roots import), then run its workflow again"
    ),
    "device-retired": "none: it is retired",
    "busy": "none: the node retries once the inventory answers",
}


def refusalWords(refusal: dict[str, Any]) -> str:
    """A refused attestation in words: the reason, its meaning, how named."""
    reason = refusal["reason"]
    words = REFUSAL_WORDS.get(reason) or refusal.get("detail") or ""
    named = NAMED_BY.get(refusal.get("named_by") or "")
    how = f"; named {named}" if named else ""
    return f"{reason} ({words}{how})" if words else reason


def refusalStep(reason: str, name: str, serial: str, approval: str | None) -> str:
    """
    The step back from a refused attestation of device C{name}: by the
    reason and, for C{ek-binding-not-approved}, by what an approval of
    C{serial} would do now (C{approval}: the refused approval's code, or
    C{approvable}, or C{approved} when the binding holds since).
    """
    if reason == "serial-mismatch" or approval == "conflicting-evidence":
        return CLONE_STEP
    if reason == "ek-binding-not-approved":
        if approval in ("evidence-missing", "evidence-insufficient"):
            return (
                f"fleetctl evidence add --serial {serial} --ek-sha256 DIGEST"
                " --kind receiving-scan (DIGEST read off the machine itself,"
                f" never from this refusal), then fleetctl binding approve {serial}"
            )
        if approval == "approved":
            return f"its binding is approved now: run {name}'s workflow again"
        return f"fleetctl binding approve {serial}, then run its workflow again"
    return _STEPS.get(
        reason,
        f'see docs/operations.md, "Trust in the machine: attestation and'
        f' LDevIDs", for {reason}; then run its workflow again',
    )


def refusalRows(refusal: dict[str, Any] | None, recovery: str | None) -> list[Row]:
    """
    The standing refused attestation, when there is one, with its step
    back beneath it unless the report's recovery is that step already.
    """
    if refusal is None:
        return []
    text = f"refused {when(refusal['at'])}: {refusalWords(refusal)}"
    step = refusal.get("step")
    items = (f"step back: {step}",) if step and step != recovery else ()
    return [Row("attest", text, items)]


def trustRows(trust: dict[str, Any] | None) -> list[Row]:
    """The binding and the evidence behind it [T1]."""
    if trust is None:
        return []
    binding = trust["binding"]
    if binding is None:
        rows = [Row("binding", "none approved")]
    else:
        state = binding["state"]
        if binding["problem"]:
            state += f" ({binding['problem']})"
        rows = [
            Row(
                "binding",
                f"{state}: EK {binding['ek_sha256']}"
                f"  on evidence {binding['evidence']}  by {binding['approved_by']}",
            )
        ]
    records = trust["evidence"]
    if not records:
        rows.append(Row("evidence", "none"))
    else:
        rows.append(Row("evidence", "", tuple(_evidence(r) for r in records)))
    return rows


def _evidence(r: dict[str, Any]) -> str:
    note = "" if r["independent"] else "  (cannot approve)"
    if r["withdrawn"]:
        note = f"  (withdrawn: {r['withdrawn']['reason']})"
    ref = f"  ref {r['ref']}" if r["ref"] else ""
    return f"{r['id']:>5}  {r['kind']}  EK {r['ek_sha256']}{ref}{note}"


def diskRow(disks: dict[str, Any] | None) -> Row:
    """The device's last disk report [D1]."""
    if disks is None:
        return Row("disks", "not reported")
    verdict = disks["verdict"]
    if verdict == "ok":
        verdict = f"ok, target disk serial {disks['target']}"
    return Row("disks", f"{len(disks['disks'])} reported; {verdict}")


def credentialRows(kube: dict[str, Any] | None) -> list[Row]:
    """[K7] The per-node token (its id, never the token) and the kubelet's."""
    if kube is None:
        return []
    rows = []
    token = kube.get("token")
    if token is None:
        rows.append(Row("token", "none issued"))
    else:
        state = (
            "deleted"
            if token["deleted_at"]
            else ("expired" if token["expired"] else "live")
        )
        rows.append(
            Row(
                "token",
                f"{token['token_id']}  {state}"
                f"  expires {when(token['expires_at'])}"
                f"  deletion due {when(token['delete_at'])}"
                f"  deleted {when(token['deleted_at'])}",
            )
        )
    cert = kube.get("kubelet")
    if cert is None:
        rows.append(Row("kubelet", "no certificate approved by fleetd"))
    else:
        retired = f"  retired {when(cert['retired_at'])}" if cert["retired_at"] else ""
        rows.append(
            Row(
                "kubelet",
                f"approved {when(cert['first_approved_at'])}"
                f"  last {when(cert['last_approved_at'])}"
                f"  notAfter {when(cert['not_after'])}{retired}",
            )
        )
    if kube.get("note"):
        rows.append(Row("note", kube["note"]))
    return rows


def objectRows(objects: dict[str, Any] | None) -> list[Row]:
    """
    Its Tinkerbell objects ([tinkerbell], issue 28): the current run's
    Workflow with the state Tinkerbell gives it and what fleetd did with
    it, and the Hardware.
    """
    if objects is None:
        return []
    rows = []
    workflow = objects.get("workflow")
    if workflow is not None:
        state = workflow.get("state") or "no state from Tinkerbell yet"
        made = OBJECT_WORDS.get(workflow["made"], workflow["made"])
        text = f"{workflow['name']}  {state}  (fleetd: {made})"
        if workflow.get("problem"):
            text += f": {workflow['problem']}"
        rows.append(Row("workflow", text))
    hardware = objects.get("hardware")
    if hardware is not None:
        made = OBJECT_WORDS.get(hardware["made"], hardware["made"])
        text = f"{hardware['name']}  (fleetd: {made})"
        if hardware.get("problem"):
            text += f": {hardware['problem']}"
        rows.append(Row("hardware", text))
    if objects.get("waiting"):
        rows.append(Row("waiting", f"retrying: {objects['waiting']}"))
    return rows


def diskKeyRows(key: dict[str, Any] | None) -> list[Row]:
    """
    Its disk key, with C{[kms]} (issue 30, item 6): none, sealed or
    destroyed and since when (and why), its last unlock, and the Seal and
    Unseal calls refused since fleetd started.
    """
    if key is None:
        return []
    if key["state"] == "none":
        text = "none: its node has not sealed one"
    else:
        why = f" ({key['why']})" if key.get("why") else ""
        text = f"{key['state']} {when(key['at'])}{why}"
    if key.get("last_unlock") is not None:
        text += f"  last unlock {when(key['last_unlock'])}"
    elif key["state"] == "sealed":
        text += "  not unlocked since fleetd started"
    refused = key.get("refused")
    items: tuple[str, ...] = ()
    if refused:
        items = (
            f"refused {refused['count']} since fleetd started;"
            f" last {when(refused['at'])}: {refused['reason']}",
        )
    return [Row("disk key", text, items)]


# What fleetd did with a Tinkerbell object, in words (fleetd.tinkerbell.store).
OBJECT_WORDS = {
    "create": "to be made",
    "created": "made",
    "delete": "to be deleted",
    "deleted": "deleted",
    "absent": "not there",
    "lost": "deleted by someone else; not made again",
    "changed": "changed by someone else",
    "disowned": "its labels taken off; left alone",
    "removed": "deleted by someone else after its end",
    "refused": "refused",
    "failed": "refused by the API",
    "apply": "to be applied",
    "applied": "applied, network boot allowed",
    "off": "network boot to be turned off",
    "netboot-off": "network boot off",
}


def trustLines(trust: dict[str, Any] | None) -> list[str]:
    """The binding and evidence as C{fleetctl status} prints them."""
    return [line for row in trustRows(trust) for line in row.lines()]


def diskLines(disks: dict[str, Any] | None) -> list[str]:
    """The disk report as C{fleetctl status} prints it."""
    return diskRow(disks).lines()


def approvalLine(result: dict[str, Any]) -> str:
    """The outcome of C{binding approve} (the admin API's answer) [T1]."""
    if result["changed"]:
        return (
            f"approved: serial {result['serial']} (device {result['device']})"
            f" <-> EK {result['ek_sha256']} on evidence {result['evidence']}"
        )
    return f"already approved: serial {result['serial']} <-> EK {result['ek_sha256']}"


NODE_OUTCOME = {None: "no cluster configured", True: "deleted", False: "was not there"}
RETIRE_ADVICE = (
    "wipe or power off the machine: a kubelet with a valid certificate"
    " registers its Node again when it restarts"
)


def retirementRows(doc: dict[str, Any]) -> list[Row]:
    """The outcome of C{retire} (the admin API's answer) after its headline [R1]."""
    tokens = ", ".join(doc["tokens_deleted"]) or "none live"
    return [
        Row("node", NODE_OUTCOME[doc["node_deleted"]]),
        Row("tokens", f"{tokens} (deleted now, retried until done)"),
        *objectRows(doc.get("tinkerbell")),
        *retiredKeys(doc.get("disk_keys")),
        Row("cannot be revoked", "", tuple(f"- {i}" for i in doc["unrevocable"])),
    ]


def retiredKeys(keys: dict[str, Any] | None) -> list[Row]:
    """With C{[kms]}: what the retirement did to the node's disk keys [E3]."""
    n = len(keys.get("destroyed") or ()) if keys is not None else 0
    text = f"destroyed ({n}): no copy of its disk opens again" if n else "none sealed"
    late: tuple[str, ...] = ("- not yet in the destruction record (retried)",)
    late = late if keys is not None and keys.get("recorded") is False else ()
    return [] if keys is None else [Row("disk key", text, late)]


def retirementLines(doc: dict[str, Any]) -> list[str]:
    """C{fleetctl retire}'s lines."""
    rows = [line for row in retirementRows(doc) for line in row.lines()]
    return [f"{doc['device']}  {doc['status']}", *rows, RETIRE_ADVICE]
