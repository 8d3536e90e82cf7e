"""
Labelled rows of text and the time in them: what C{fleetctl status} and the
console's device page print (L{fleetd.statuswords} fills them), on the
lowest row so that the words of a subsystem's own report may use them too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

LABEL_WIDTH = 10  # "recovery: " is the widest label


@dataclass(frozen=True)
class Row:
    """
    One labelled row: C{label} and its C{text} on one line, then C{items}
    (evidence records, journal entries), one per line beneath it.
    """

    label: str
    text: str
    items: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The row as fleetctl prints it: the label padded, items indented."""
        if self.items and not self.text:
            head = f"{self.label}:"
        else:
            head = f"{self.label + ':':<{LABEL_WIDTH}}{self.text}"
        return [head] + [f"  {item}" for item in self.items]


def when(at: float | None) -> str:
    """A POSIX time as UTC ISO 8601 to the second, or C{-} for none."""
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
