"""
CSV rows with the line each starts on, for imports that name a bad row by
its line (the device import and the evidence manifest).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator


class CSVLineError(Exception):
    """Malformed CSV at C{line}; each import turns it into its own error."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(f"line {line}: {what}")
        self.line = line
        self.what = what


def csvRows(text: str) -> Iterator[tuple[int, list[str]]]:
    """
    Each row of C{text} that is not blank, with the line it starts on (a
    quoted field may span lines).

    @raise CSVLineError: the CSV is malformed at that line.
    """
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    line = 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise CSVLineError(line, f"malformed CSV: {e}") from None
        if any(cell.strip() for cell in cells):
            yield line, cells
        line = reader.line_num + 1
