"""
fleetctl's lists show an EK digest's first 16 hex digits, all 64 with
C{--wide} or C{--json} (issue 27, item 11).
"""

from __future__ import annotations

import io
import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.cli import fleetctl, trust

EK1 = "3f5a" * 16
EK2 = "c0de" * 16

EVIDENCE = {
    "evidence": [
        {
            "id": 1,
            "serial": "SER1",
            "ek_sha256": EK1,
            "kind": "receiving-scan",
            "ref": "dock-2",
            "recorded_at": 1700000000.0,
            "recorded_by": "owner:alice",
            "independent": True,
            "withdrawn": None,
        },
        {
            "id": 2,
            "serial": "SER2",
            "ek_sha256": EK2,
            "kind": "console",
            "ref": None,
            "recorded_at": 1700000001.0,
            "recorded_by": "owner:alice",
            "independent": False,
            "withdrawn": None,
        },
    ]
}

BINDINGS = {
    "bindings": [
        {
            "serial": "SER1",
            "device": "w1",
            "ek_sha256": EK1,
            "evidence": 1,
            "approved_at": 1700000002.0,
            "approved_by": "owner:alice",
            "state": "approved",
            "problem": None,
        }
    ]
}


class _Client:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def request(self, method: str, path: str, query: Any = None) -> Any:
        return self.answers[path]


class EKPrefixTests(SynchronousTestCase):
    def setUp(self) -> None:
        answers = {trust.EVIDENCE: EVIDENCE, trust.BINDINGS: BINDINGS}
        self.patch(trust, "AdminClient", lambda settings: _Client(answers))

    def fleetctl(self, *argv: str) -> str:
        """What C{fleetctl argv} prints, fleetd's answers faked."""
        args = fleetctl.buildParser().parse_args(argv)
        out = io.StringIO()
        self.assertEqual(args.handler(None, args, out), 0)
        return out.getvalue()

    def test_evidenceList_prefixUnlessWide(self) -> None:
        """
        C{evidence list} shows each EK digest's first 16 hex digits under
        EK-SHA256; C{--wide} the whole digest; C{--json} always all of it.
        """
        short = self.fleetctl("evidence", "list")
        self.assertNotIn(EK1, short)
        lines = short.splitlines()
        self.assertEqual(lines[1].split()[:3], ["1", "SER1", EK1[:16]])
        self.assertEqual(lines[2].split()[:3], ["2", "SER2", EK2[:16]])
        wide = self.fleetctl("evidence", "list", "--wide").splitlines()
        self.assertEqual(wide[1].split()[:3], ["1", "SER1", EK1])
        self.assertEqual(len(wide), 3)
        doc = json.loads(self.fleetctl("--json", "evidence", "list"))
        self.assertEqual([r["ek_sha256"] for r in doc], [EK1, EK2])

    def test_bindingList_prefixUnlessWide(self) -> None:
        """C{binding list}: the same."""
        short = self.fleetctl("binding", "list").splitlines()
        self.assertEqual(short[1].split()[:3], ["SER1", "w1", EK1[:16]])
        self.assertNotIn(EK1, "\n".join(short))
        wide = self.fleetctl("binding", "list", "--wide").splitlines()
        self.assertEqual(wide[1].split()[:3], ["SER1", "w1", EK1])
        doc = json.loads(self.fleetctl("binding", "list", "--json"))
        self.assertEqual(doc[0]["ek_sha256"], EK1)
