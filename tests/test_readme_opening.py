"""
The README's first screen says what fleetd is (issue 27, item 10): for
whom, what it does and where it stops, then a comparison in which every
fact about another project cites that project, then the two commands.
"""

from __future__ import annotations

import re

from twisted.trial.unittest import SynchronousTestCase

from tests.support import REPO

COMPARED = ["fleetd", "Tinkerbell", "Matchbox", "Sidero Metal", "Omni", "MAAS"]
NOTE = re.compile(r"\[\^([a-z0-9-]+)\]")
DEFINITION = re.compile(r"^\[\^([a-z0-9-]+)\]: (.*)$", re.M)


class OpeningTests(SynchronousTestCase):
    def setUp(self) -> None:
        text = (REPO / "README.md").read_text()
        self.head, _, rest = text.partition("\n```sh\n")
        self.commands = rest.split("\n```", 1)[0]
        self.rows = [
            [cell.strip() for cell in line.strip("|").split("|")]
            for line in self.head.splitlines()
            if line.startswith("|") and not line.startswith("|---")
        ][1:]  # the header row

    def test_whatItIs_firstParagraphs(self) -> None:
        """Under the title, before any command: whom it is for and what it
        does (Talos, Tinkerbell, the one-time configuration), then where
        it stops."""
        paragraphs = self.head.split("\n\n")
        self.assertEqual(paragraphs[0], "# fleetd")
        first = " ".join(paragraphs[1].split())
        for words in ("is for", "Talos", "Tinkerbell", "once", "TPM", "journal"):
            self.assertIn(words, first)
        self.assertTrue(paragraphs[2].startswith("Where it stops:"), paragraphs[2])

    def test_comparison_everyOtherFactCited(self) -> None:
        """One row for fleetd and for each tool it is compared with; each
        cell about another project cites a footnote, and every footnote is
        a link to that project's documentation, each used."""
        self.assertEqual(
            [next(n for n in COMPARED if n in row[0]) for row in self.rows], COMPARED
        )
        used: set[str] = set()
        for row in self.rows[1:]:
            for cell in row[1:]:
                notes = NOTE.findall(cell)
                self.assertTrue(notes, f"{row[0]}: an uncited fact: {cell}")
                used.update(notes)
        defined = dict(DEFINITION.findall(self.head))
        self.assertEqual(set(defined), used)
        for name, source in defined.items():
            self.assertRegex(source, r"<https://[^>\s]+>\.$", name)

    def test_twoCommandsFollow(self) -> None:
        """The first command block, after the comparison: make run, then
        make test (make demo may follow)."""
        names = [line.split("#")[0].strip() for line in self.commands.splitlines()]
        self.assertEqual(names[:2], ["make run", "make test"])
