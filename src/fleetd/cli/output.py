"""
What fleetctl prints: lines for people, or with C{--json} one JSON document
(L{fleetd.clitools.writeJSON}); tables, times and journal entries are
formatted the same way by every subcommand (times and journal entries
in L{fleetd.statuswords}, which the owner console shares).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import IO, Any

from fleetd.clitools import writeJSON
from fleetd.statuswords import formatEntry as formatEntry
from fleetd.statuswords import when as when


def emit(
    out: IO[str], args: argparse.Namespace, document: Any, lines: list[str]
) -> None:
    """C{document} with C{--json}, else C{lines}."""
    if args.json:
        writeJSON(out, document)
    else:
        out.write("".join(line + "\n" for line in lines))


def alignedTable(header: list[str], rows: list[list[str]]) -> list[str]:
    """Rows under a header, each column padded to its widest cell."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


@dataclass(frozen=True)
class Console:
    """Where a command asks a person: answers on C{stdin}, questions on C{err}."""

    stdin: IO[str]
    err: IO[str]

    def interactive(self) -> bool:
        """Whether a person is there to answer (C{stdin} is a terminal)."""
        try:
            return self.stdin.isatty()
        except ValueError:  # closed
            return False

    def ask(self, question: str) -> str:
        """C{question} on C{err}; the line typed, without its end ("" at EOF)."""
        self.err.write(question)
        self.err.flush()
        return self.stdin.readline().strip()
