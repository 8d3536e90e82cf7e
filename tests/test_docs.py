"""
The repository stands alone (issue 19, item 6): its documents link only
to files it holds, and every rule tag the code and tests cite (C{[C1]},
C{[V4]}, ...) is defined in C{docs/design.md}.
"""

from __future__ import annotations

import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests.support import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TAG = re.compile(r"\[([ABCDFJKORTV][0-9])\]")
DEFINED = re.compile(r"^- \*\*\[([A-Z][0-9])\]\*\*", re.MULTILINE)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


class StandAloneTests(SynchronousTestCase):
    def test_links_stayInTheRepository(self) -> None:
        """Every relative link in the README and docs/ names a file of the clone."""
        broken = []
        for doc in documents():
            for target in LINK.findall(doc.read_text()):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue  # a URL or an anchor in the same page
                path = (doc.parent / target.split("#")[0]).resolve()
                if not path.is_relative_to(REPO) or not path.exists():
                    broken.append(f"{doc.relative_to(REPO)}: {target}")
        self.assertEqual(broken, [])

    def test_noPathOutsideTheClone(self) -> None:
        """No document sends its reader to files beside the clone (../shared)."""
        found = [
            str(doc.relative_to(REPO))
            for doc in documents()
            if re.search(r"(\.\./|\b)shared/", doc.read_text())
        ]
        self.assertEqual(found, [])

    def test_noCitationOfADesignFileTheCloneLacks(self) -> None:
        """Code and tests cite docs/design.md, not the DESIGN.md a clone lacks."""
        citing = [
            str(source.relative_to(REPO))
            for tree in ("src/fleetd", "tests")
            for source in (REPO / tree).rglob("*.py")
            if source.name != "test_docs.py" and "DESIGN" in source.read_text()
        ]
        self.assertEqual(citing, [])

    def test_everyCitedRuleIsDefined(self) -> None:
        """Each rule tag in fleetd/ and tests/ has its sentence in docs/design.md."""
        defined = set(DEFINED.findall((REPO / "docs" / "design.md").read_text()))
        cited: set[str] = set()
        for tree in ("src/fleetd", "tests"):
            for source in (REPO / tree).rglob("*.py"):
                cited.update(TAG.findall(source.read_text()))
        self.assertTrue(cited)
        self.assertEqual(sorted(cited - defined), [])
