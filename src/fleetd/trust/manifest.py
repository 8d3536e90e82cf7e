"""
Parse an evidence manifest (C{fleetctl evidence import FILE}).

Two forms, told apart by the first character that is not white space:

  - CSV: the first non-blank row is the header, naming columns from
    C{serial,ek_sha256,kind,ref} in any order (C{serial} and C{ek_sha256}
    required; C{ek-sha256} is accepted for the latter).
  - JSON: an array of objects with the keys C{serial}, C{ek_sha256} and
    optionally C{kind} and C{ref}; no other keys, none twice.

A row without C{kind} takes the import's default kind (C{supplier-record}
unless the owner says otherwise), one without C{ref} the default ref
(fleetctl sends the file's name). One bad row rejects the whole file,
with the physical line it starts on (line 1 is the file's first line);
the same claim twice in one file is a bad row.
"""

from __future__ import annotations

from typing import Any

from fleetd import jsonbody
from fleetd.csvrows import CSVLineError, csvRows
from fleetd.trust.model import (
    EvidenceInput,
    EvidenceKind,
    TrustError,
    evidence,
)

COLUMNS = ("serial", "ek_sha256", "kind", "ref")
REQUIRED = ("serial", "ek_sha256")
_ALIASES = {"ek-sha256": "ek_sha256"}
_BOM = "\ufeff"


def _lineError(line: int, what: str) -> TrustError:
    return TrustError(f"line {line}: {what}")


class _Rows:
    """Checks rows into claims, refusing repeats by line."""

    def __init__(self, kind: EvidenceKind, ref: str | None) -> None:
        self.kind = kind
        self.ref = ref
        self.claims: list[EvidenceInput] = []
        self._lines: dict[tuple[str, str, str, str | None], int] = {}

    def add(self, row: dict[str, Any], line: int) -> None:
        try:
            claim = evidence(
                serial=row.get("serial"),
                ek_sha256=row.get("ek_sha256"),
                kind=row.get("kind") or self.kind,
                ref=row.get("ref") or self.ref,
            )
        except TrustError as e:
            raise _lineError(line, str(e)) from None
        key = (claim.serial.lower(), claim.ek_sha256, claim.kind.value, claim.ref)
        first = self._lines.get(key)
        if first is not None:
            raise _lineError(line, f"the same claim as line {first}")
        self._lines[key] = line
        self.claims.append(claim)


def _header(cells: list[str], line: int) -> list[str]:
    columns = [cell.strip().lower() for cell in cells]
    columns = [_ALIASES.get(c, c) for c in columns]
    for index, column in enumerate(columns):
        if column not in COLUMNS:
            known = ", ".join(COLUMNS)
            raise _lineError(line, f"unknown column {column!r} (known: {known})")
        if column in columns[:index]:
            raise _lineError(line, f"column {column!r} appears twice")
    for column in REQUIRED:
        if column not in columns:
            raise _lineError(line, f"missing column {column!r}")
    return columns


def _parseCSV(text: str, rows: _Rows) -> None:
    columns: list[str] | None = None
    try:
        for line, cells in csvRows(text):
            if columns is None:
                columns = _header(cells, line)
            elif len(cells) != len(columns):
                raise _lineError(
                    line, f"expected {len(columns)} fields, got {len(cells)}"
                )
            else:
                values = (cell.strip() for cell in cells)
                rows.add(dict(zip(columns, values, strict=True)), line)
    except CSVLineError as e:
        raise _lineError(e.line, e.what) from None
    if columns is None:
        raise _lineError(1, "no header row (expected serial,ek_sha256[,kind][,ref])")


def _parseJSON(text: str, rows: _Rows) -> None:
    decoder = jsonbody.DECODER

    def lineAt(index: int) -> int:
        return text.count("\n", 0, index) + 1

    def skip(index: int) -> int:
        while index < len(text) and text[index] in " \t\r\n":
            index += 1
        return index

    index = skip(0)
    if text[index : index + 1] != "[":
        raise _lineError(lineAt(index), "a JSON manifest is an array of objects")
    index = skip(index + 1)
    first = True
    while True:
        if text[index : index + 1] == "]":
            break
        if not first:
            if text[index : index + 1] != ",":
                raise _lineError(lineAt(index), "expected ',' or ']'")
            index = skip(index + 1)
        first = False
        start = index
        try:
            value, index = decoder.raw_decode(text, index)
        except (ValueError, RecursionError) as e:
            raise _lineError(lineAt(start), f"not JSON ({e})") from None
        line = lineAt(start)
        if not isinstance(value, dict):
            raise _lineError(line, "each entry must be a JSON object")
        unknown = [key for key in value if key not in COLUMNS]
        if unknown:
            known = ", ".join(COLUMNS)
            raise _lineError(line, f"unknown key {unknown[0]!r} (known: {known})")
        for key in ("kind", "ref"):
            if value.get(key) is not None and not isinstance(value[key], str):
                raise _lineError(line, f"{key}: must be a string")
        rows.add(value, line)
        index = skip(index)
    if skip(index + 1) != len(text):
        raise _lineError(lineAt(skip(index + 1)), "text after the array")


def parseManifest(
    text: str,
    *,
    kind: EvidenceKind = EvidenceKind.SUPPLIER_RECORD,
    ref: str | None = None,
) -> list[EvidenceInput]:
    """
    Parse a whole CSV or JSON manifest into claims.

    @raise TrustError: C{"line N: <what>"} for the first bad row.
    """
    if text.startswith(_BOM):
        text = text[len(_BOM) :]
    rows = _Rows(kind, ref)
    if text.lstrip().startswith(("[", "{")):
        _parseJSON(text, rows)
    else:
        _parseCSV(text, rows)
    return rows.claims
