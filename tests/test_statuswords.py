"""
L{fleetd.statuswords}: the words of C{fleetctl status}, shared with the
console's device page. The expected texts below are what fleetctl printed
before its wording moved there (byte for byte).
"""

from __future__ import annotations

import argparse
import io
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.cli import status
from fleetd.statuswords import (
    CLONE_STEP,
    Row,
    approvalLine,
    formatEntry,
    headline,
    retirementLines,
    statusLines,
    statusRows,
)

RICH: dict[str, Any] = {
    "device": {
        "name": "w1",
        "serial": "SN-1",
        "uuid": "4c4c4544-0042-3510-8050-b4c04f4d3232",
        "macs": ["aa:bb:cc:dd:ee:01"],
        "class": "worker",
        "cluster": "prod",
        "status": "planned",
        "desired_action": None,
    },
    "run": {
        "run": "r-abc",
        "device": "w1",
        "state": "ready",
        "created_at": 1700000000.0,
    },
    "state": "provisioned; waiting for the node to fetch its configuration",
    "ldevid": {
        "issuer": "spore-ldevid-1",
        "not_after": 1800000000.0,
        "how": "attested",
    },
    "alerts": ["FleetInstallConfigRefetched", "FleetNodeBootedHookOSAfterInstall"],
    "recovery": "fleetctl provision w1; the disk holds no STATE to preserve",
    "trust": {
        "binding": {
            "state": "approved",
            "problem": "evidence withdrawn",
            "ek_sha256": "ab" * 32,
            "evidence": 3,
            "approved_by": "owner:alice",
        },
        "evidence": [
            {
                "id": 3,
                "kind": "supplier-record",
                "ek_sha256": "ab" * 32,
                "ref": "PO-7",
                "independent": True,
                "withdrawn": None,
            },
            {
                "id": 12,
                "kind": "tofu",
                "ek_sha256": "cd" * 32,
                "ref": None,
                "independent": False,
                "withdrawn": None,
            },
            {
                "id": 4,
                "kind": "receiving-scan",
                "ek_sha256": "ef" * 32,
                "ref": "",
                "independent": True,
                "withdrawn": {"reason": "wrong box", "at": 1.0},
            },
        ],
    },
    "disks": {"verdict": "ok", "target": "S3Z9NX0K", "disks": [{}, {}]},
    "kubernetes": {
        "token": {
            "token_id": "abc123",
            "deleted_at": None,
            "expired": False,
            "expires_at": 1700003600.0,
            "delete_at": 1700000060.0,
        },
        "kubelet": {
            "first_approved_at": 1700000100.0,
            "last_approved_at": 1700000200.0,
            "not_after": 1731536100.0,
            "retired_at": 1700000300.0,
        },
        "note": "lost certificate note",
    },
    "journal": [
        {
            "seq": 7,
            "at": 1700000000.0,
            "event": "run.provisioned",
            "actor": "owner:alice",
            "device": "w1",
            "run": "r-abc",
            "fields": {"desired_action": None, "via": "console"},
        },
        {
            "seq": 8,
            "at": 1700000001.5,
            "event": "delivery.refused",
            "actor": "fleetd",
            "device": "w1",
            "run": None,
            "fields": {"count": 2, "reason": "x y"},
        },
    ],
}

SPARSE: dict[str, Any] = {
    "device": {
        "name": "w2",
        "serial": "SN-2",
        "uuid": "u2",
        "macs": [],
        "class": "worker-g2",
        "cluster": None,
        "status": "staged",
        "desired_action": None,
    },
    "run": None,
    "state": "never provisioned",
    "ldevid": None,
    "alerts": [],
    "recovery": None,
    "trust": {"binding": None, "evidence": []},
    "disks": None,
    "kubernetes": {
        "token": {
            "token_id": "t2",
            "deleted_at": 1700000000.0,
            "expired": True,
            "expires_at": None,
            "delete_at": None,
        },
        "kubelet": None,
        "note": None,
    },
    "journal": [],
}

RICH_TEXT = (
    "w1  planned  class worker  serial SN-1  uuid 4c4c4544-0042-3"
    "510-8050-b4c04f4d3232\n"
    "run:      r-abc  ready\n"
    "state:    provisioned; waiting for the node to fetch its configuration\n"
    "ldevid:   spore-ldevid-1  until 2027-01-15  (attested, curre"
    "nt issuer; legacy LDevIDs refused)\n"
    "alerts:   FleetInstallConfigRefetched, FleetNodeBootedHookOSAfterInstall\n"
    "recovery: fleetctl provision w1; the disk holds no STATE to preserve\n"
    "binding:  approved (evidence withdrawn): EK abababababababab"
    "abababababababababababababababababababababababab  on evidenc"
    "e 3  by owner:alice\n"
    "evidence:\n"
    "      3  supplier-record  EK abababababababababababababababa"
    "babababababababababababababababab  ref PO-7\n"
    "     12  tofu  EK cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
    "cdcdcdcdcdcdcdcdcdcdcd  (cannot approve)\n"
    "      4  receiving-scan  EK efefefefefefefefefefefefefefefef"
    "efefefefefefefefefefefefefefefef  (withdrawn: wrong box)\n"
    "disks:    2 reported; ok, target disk serial S3Z9NX0K\n"
    "token:    abc123  live  expires 2023-11-14T23:13:20Z  deleti"
    "on due 2023-11-14T22:14:20Z  deleted -\n"
    "kubelet:  approved 2023-11-14T22:15:00Z  last 2023-11-14T22:"
    "16:40Z  notAfter 2024-11-13T22:15:00Z  retired 2023-11-14T22"
    ":18:20Z\n"
    "note:     lost certificate note\n"
    "journal:\n"
    "       7  2023-11-14T22:13:20Z  run.provisioned  actor=owner"
    ":alice  device=w1  run=r-abc  via=console\n"
    "       8  2023-11-14T22:13:21Z  delivery.refused  actor=flee"
    "td  device=w1  count=2  reason=x y\n"
)

SPARSE_TEXT = (
    "w2  staged  class worker-g2  serial SN-2  uuid u2\n"
    "run:      none\n"
    "state:    never provisioned\n"
    "ldevid:   none from this fleetd (an LDevID from an older CA of"
    " the trust bundle is accepted until the node attests here)\n"
    "alerts:   none\n"
    "recovery: nothing to do\n"
    "binding:  none approved\n"
    "evidence: none\n"
    "disks:    not reported\n"
    "token:    t2  deleted  expires -  deletion due -  deleted 2023-11-14T22:13:20Z\n"
    "kubelet:  no certificate approved by fleetd\n"
)


class _Client:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def request(self, method: str, path: str) -> dict[str, Any]:
        return self.doc


class StatusWordsTests(SynchronousTestCase):
    def fleetctlStatus(self, doc: dict[str, Any]) -> str:
        """What C{fleetctl status} prints for C{doc} (its client faked)."""
        self.patch(status, "AdminClient", lambda settings: _Client(doc))
        out = io.StringIO()
        args = argparse.Namespace(name=doc["device"]["name"], json=False)
        self.assertEqual(status.cmdStatus(None, args, out), 0)  # type: ignore[arg-type]
        return out.getvalue()

    def test_fleetctlStatus_unchanged(self) -> None:
        self.assertEqual(self.fleetctlStatus(RICH), RICH_TEXT)
        self.assertEqual(self.fleetctlStatus(SPARSE), SPARSE_TEXT)

    def test_fleetctlStatus_refusedAttestation_newLinesOnly(self) -> None:
        """
        Issue 27: a standing refused attestation adds its line after the
        LDevID's, and its step back beneath it when the recovery is another
        step; every other line is as before, byte for byte.
        """
        refusal = {
            "reason": "serial-mismatch",
            "detail": "this EK is bound to another chassis than the one reported",
            "at": 1700000000.0,
            "seq": 9,
            "named_by": "reported-serial",
            "step": CLONE_STEP,
        }
        lines = RICH_TEXT.splitlines(keepends=True)
        added = [
            "attest:   refused 2023-11-14T22:13:20Z: serial-mismatch (its TPM's EK"
            " is bound to another chassis; named by the serial it reported)\n",
            "  step back: the TPM is a clone, or its evidence names two machines:"
            ' see docs/operations.md, "A refused attestation", before approving'
            " anything\n",
        ]
        expected = "".join(lines[:4] + added + lines[4:])
        self.assertEqual(
            self.fleetctlStatus({**RICH, "attest_refusal": refusal}), expected
        )
        # The step is the recovery already: not said twice.
        taken = {**SPARSE, "attest_refusal": refusal, "recovery": CLONE_STEP}
        printed = self.fleetctlStatus(taken).splitlines()
        self.assertEqual(printed[4], added[0].rstrip("\n"))
        self.assertEqual(printed[5:7], ["alerts:   none", f"recovery: {CLONE_STEP}"])

    def test_lines_areTheRows(self) -> None:
        """The headline, then each row's lines: what the page shows."""
        for doc, expected in [(RICH, RICH_TEXT), (SPARSE, SPARSE_TEXT)]:
            lines = [headline(doc)]
            for row in statusRows(doc):
                lines.extend(row.lines())
            self.assertEqual("".join(f"{line}\n" for line in lines), expected)
            self.assertEqual(statusLines(doc), lines)

    def test_rows_withoutJournal(self) -> None:
        labels = [row.label for row in statusRows(RICH, journal=False)]
        self.assertNotIn("journal", labels)
        self.assertEqual(labels[:5], ["run", "state", "ldevid", "alerts", "recovery"])

    def test_row_lines(self) -> None:
        self.assertEqual(Row("run", "none").lines(), ["run:      none"])
        self.assertEqual(Row("state", "").lines(), ["state:    "])
        self.assertEqual(
            Row("journal", "", ("a", "b")).lines(), ["journal:", "  a", "  b"]
        )

    def test_formatEntry_noNullFields(self) -> None:
        """
        A journal line leaves out fields without a value: no C{key=null}
        (issue 27, item 11); false, zero, empty and nested values stay.
        """
        entry = {
            "seq": 9,
            "at": 1700000000.0,
            "event": "run.provisioned",
            "actor": "owner:alice",
            "device": "w1",
            "run": None,
            "fields": {
                "desired_action": None,
                "forced": False,
                "count": 0,
                "reason": "",
                "differ": {"serial": None},
            },
        }
        self.assertEqual(
            formatEntry(entry),
            "     9  2023-11-14T22:13:20Z  run.provisioned  actor=owner:alice"
            '  device=w1  count=0  differ={"serial": null}  forced=false  reason=',
        )

    def test_retirementLines_asFleetctlPrintedThem(self) -> None:
        doc = {
            "device": "w1",
            "status": "decommissioning",
            "node_deleted": None,
            "tokens_deleted": [],
            "unrevocable": ["kubelet client certificate", "machine.token"],
        }
        self.assertEqual(
            retirementLines(doc),
            [
                "w1  decommissioning",
                "node:     no cluster configured",
                "tokens:   none live (deleted now, retried until done)",
                "cannot be revoked:",
                "  - kubelet client certificate",
                "  - machine.token",
                "wipe or power off the machine: a kubelet with a valid certificate"
                " registers its Node again when it restarts",
            ],
        )

    def test_retirementLines_diskKeys(self) -> None:
        """
        [E3] With C{[kms]} the answer's C{disk_keys} is a row: how many keys
        the retirement destroyed (or none sealed), and a line while their ids
        are not yet in the destruction record; without it, no row.
        """
        doc: dict[str, Any] = {
            "device": "w1",
            "status": "decommissioning",
            "node_deleted": None,
            "tokens_deleted": [],
            "unrevocable": [],
        }
        keys = {"state": "destroyed", "destroyed": ["a1", "b2"], "recorded": True}
        self.assertIn(
            "disk key: destroyed (2): no copy of its disk opens again",
            retirementLines({**doc, "disk_keys": keys}),
        )
        late = retirementLines({**doc, "disk_keys": {**keys, "recorded": False}})
        index = late.index("disk key: destroyed (2): no copy of its disk opens again")
        self.assertEqual(
            late[index + 1], "  - not yet in the destruction record (retried)"
        )
        none = retirementLines({**doc, "disk_keys": {"destroyed": []}})
        self.assertIn("disk key: none sealed", none)
        self.assertFalse(any("disk key" in line for line in retirementLines(doc)))

    def test_approvalLine(self) -> None:
        result = {"changed": True, "serial": "S", "device": "w1", "ek_sha256": "e"}
        self.assertEqual(
            approvalLine({**result, "evidence": 3}),
            "approved: serial S (device w1) <-> EK e on evidence 3",
        )
        self.assertEqual(
            approvalLine({**result, "changed": False}),
            "already approved: serial S <-> EK e",
        )
