"""Evidence manifests (fleetctl evidence import): CSV and JSON [T1]."""

from __future__ import annotations

import csv
import hashlib
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from fleetd.trust.manifest import parseManifest
from fleetd.trust.model import EvidenceKind, TrustError

EK1 = hashlib.sha256(b"ek-one").hexdigest()
EK2 = hashlib.sha256(b"ek-two").hexdigest()


class CSVManifestTests(SynchronousTestCase):
    def test_columns_anyOrder_defaultsApply(self) -> None:
        """Columns in any order; kind and ref default; the digest is lowercased."""
        text = (
            "\ufeffRef,EK-SHA256,serial,kind\n"
            f",{EK1.upper()},SER1,\n"
            "\n"
            f"r2,{EK2},SER2,receiving-scan\n"
        )
        claims = parseManifest(text, kind=EvidenceKind.SUPPLIER_RECORD, ref="file.csv")
        self.assertEqual(
            [(c.serial, c.ek_sha256, c.kind.value, c.ref) for c in claims],
            [
                ("SER1", EK1, "supplier-record", "file.csv"),
                ("SER2", EK2, "receiving-scan", "r2"),
            ],
        )

    def test_badRow_namesItsPhysicalLine(self) -> None:
        """[T1] A bad row rejects the file with its physical line (blanks count)."""
        text = f'serial,ek_sha256,ref\nSER1,{EK1},"po 7, dock 2"\n\nSER2,{EK2[:10]},\n'
        with self.assertRaises(TrustError) as raised:
            parseManifest(text)
        self.assertTrue(str(raised.exception).startswith("line 4: ek_sha256:"))
        text = f'serial,ek_sha256,ref\nSER1,{EK1},"two\nlines"\n'
        with self.assertRaises(TrustError) as raised:
            parseManifest(text)
        self.assertTrue(str(raised.exception).startswith("line 2: ref:"))

    def test_headerProblems(self) -> None:
        """Unknown, repeated or missing columns, and no header, name line 1."""
        for text, words in [
            ("serial,ek_sha256,colour\n", "unknown column 'colour'"),
            ("serial,serial,ek_sha256\n", "appears twice"),
            ("serial,kind\n", "missing column 'ek_sha256'"),
            ("\n\n", "no header row"),
        ]:
            with self.assertRaises(TrustError, msg=text) as raised:
                parseManifest(text)
            self.assertIn(words, str(raised.exception))

    def test_sameClaimTwice_refused(self) -> None:
        """The same claim twice in one file is a bad row naming the first."""
        text = f"serial,ek_sha256\nSER1,{EK1}\nser1,{EK1.upper()}\n"
        with self.assertRaises(TrustError) as raised:
            parseManifest(text)
        self.assertEqual(str(raised.exception), "line 3: the same claim as line 2")

    def test_wrongFieldCount(self) -> None:
        """A row with too many fields names its line."""
        with self.assertRaises(TrustError) as raised:
            parseManifest(f"serial,ek_sha256\nSER1,{EK1},extra\n")
        self.assertIn("line 2: expected 2 fields, got 3", str(raised.exception))

    @settings(max_examples=200, deadline=None)  # no wall-time limit on a loaded CI
    @given(
        st.lists(
            st.tuples(
                st.text(
                    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.", min_size=1, max_size=20
                ),
                st.binary(min_size=1, max_size=8),
                st.sampled_from([k.value for k in EvidenceKind]),
            ),
            max_size=20,
            unique_by=lambda row: row[0].lower(),
        )
    )
    def test_roundTrip(self, rows: list[tuple[str, bytes, str]]) -> None:
        """Any valid claims written by csv.writer parse back the same."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["serial", "ek_sha256", "kind"])
        for serial, key, kind in rows:
            writer.writerow([serial, hashlib.sha256(key).hexdigest(), kind])
        claims = parseManifest(out.getvalue())
        self.assertEqual(
            [(c.serial, c.ek_sha256, c.kind.value) for c in claims],
            [(s, hashlib.sha256(k).hexdigest(), kind) for s, k, kind in rows],
        )


class JSONManifestTests(SynchronousTestCase):
    def test_array_ofObjects(self) -> None:
        """A JSON manifest is an array of objects; kind and ref may be left out."""
        text = json.dumps(
            [
                {"serial": "SER1", "ek_sha256": EK1},
                {"serial": "SER2", "ek_sha256": EK2, "kind": "console", "ref": "x"},
            ],
            indent=1,
        )
        claims = parseManifest(text, ref="m.json")
        self.assertEqual(
            [(c.kind.value, c.ref) for c in claims],
            [("supplier-record", "m.json"), ("console", "x")],
        )

    def test_badEntry_namesItsLine(self) -> None:
        """[T1] A bad entry rejects the file with the line it starts on."""
        good = json.dumps({"serial": "SER1", "ek_sha256": EK1})
        cases = [
            (f"[\n {good},\n {{\"serial\": \"SER2\"}}\n]", "line 3: ek_sha256"),
            (f'[\n{good},\n\n{{"serial": "S", "serial": "T"}}]', "line 4: not JSON"),
            (f'[{good},\n{{"serial": "S", "ek_sha256": "{EK2}", "x": 1}}]',
             "line 2: unknown key 'x'"),
            (f"[{good},\n 5]", "line 2: each entry must be a JSON object"),
            (f"[{good}\n {good}]", "line 2: expected ','"),
            (f"[{good}]\n[]", "line 2: text after the array"),
            ('{"evidence": []}', "line 1: a JSON manifest is an array"),
            (f'[{{"serial": "S", "ek_sha256": "{EK1}", "kind": 3}}]', "kind: must be"),
            ("[NaN]", "line 1: not JSON"),
        ]  # fmt: skip
        for text, words in cases:
            with self.assertRaises(TrustError, msg=text) as raised:
                parseManifest(text)
            self.assertIn(words, str(raised.exception), text)

    def test_emptyArray_noClaims(self) -> None:
        """An empty manifest is no claims, not an error."""
        self.assertEqual(parseManifest(" [ ] \n"), [])
