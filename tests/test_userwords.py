"""
What fleetd and fleetctl say to people carries no rule tags (C{[C2]}) and
no words of the reference site (C{spore}, C{capsule}) (issue 27, item 11):
a site that is not the reference one reads about its own fleetd.

Rule tags and site words stay where they belong: docstrings, comments,
log event texts and metric help, which people read as code or reference.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from fleetd.cli import fleetctl
from fleetd.statuswords import statusLines
from tests.support import REPO
from tests.test_statuswords import RICH, SPARSE

FORBIDDEN = re.compile(r"\[[A-Z]\d+\]|\bspore\b|\bcapsule\b", re.IGNORECASE)

SOURCE = REPO / "src" / "fleetd"

# Not scanned: the fakes of remote servers, the simulator (its fault names,
# e.g. spore-reboot, are the design's vocabulary) and fleetd-pki with the
# dev PKI (the reference site's CA file names; its own command line).
SKIPPED = ("testing", "sim", "pki")

# Calls whose string arguments are for logs or metrics, not for people.
LOG_METHODS = {"debug", "info", "warn", "warning", "error", "critical", "failure"}
METRICS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


def _called(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _notForPeople(tree: ast.AST) -> set[int]:
    """The ids of string constants that are docstrings, log texts or metric help."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skipped.add(id(node.value))  # a docstring, here or of an attribute
        elif isinstance(node, ast.Call):
            called = _called(node)
            if called in LOG_METHODS or called in METRICS:
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    skipped.update(id(n) for n in ast.walk(arg))
    return skipped


def userStrings(path: Path) -> Iterator[tuple[int, str]]:
    """Every string constant of C{path} that may reach a person, with its line."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _notForPeople(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skipped
        ):
            yield node.lineno, node.value


def sources() -> list[Path]:
    return [
        path
        for path in sorted(SOURCE.rglob("*.py"))
        if path.relative_to(SOURCE).parts[0] not in SKIPPED
    ]


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """C{parser} and every subcommand parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


class UserWordsTests(SynchronousTestCase):
    def test_scanner_findsWhatItLooksFor(self) -> None:
        """The scan finds a tag or a site word in a refusal, not in a docstring."""
        sample = Path(self.mktemp())
        sample.write_text(
            '"""Refusals [C2] from spore."""\n'
            "log.info('served [C1] on spore {x}', x=1)\n"
            "LINES = {'a': 'the node keeps asking [C2]', 'b': 'spore rebooted'}\n"
            "raise Refused('lost', f'{x}: the capsule CA')\n"
        )
        found = sorted(
            line for line, text in userStrings(sample) if FORBIDDEN.search(text)
        )
        self.assertEqual(found, [3, 3, 4])

    def test_sourceStrings_noRuleTagsNorSiteWords(self) -> None:
        """
        No string fleetd's code may show a person (refusal texts, string
        tables, state and recovery lines, the words of fleetctl and of the
        console) holds a rule tag or C{spore}/C{capsule}.
        """
        found = [
            f"{path.relative_to(REPO)}:{line}: {text!r}"
            for path in sources()
            for line, text in userStrings(path)
            if FORBIDDEN.search(text)
        ]
        self.assertEqual(found, [])

    def test_templates_noRuleTagsNorSiteWords(self) -> None:
        """The console's page templates say none of them either."""
        templates = sorted((SOURCE / "admin" / "console" / "templates").glob("*"))
        self.assertTrue(templates)
        found = [
            f"{path.name}: {match.group(0)}"
            for path in templates
            for match in FORBIDDEN.finditer(path.read_text())
        ]
        self.assertEqual(found, [])

    def test_fleetctlHelp_noRuleTagsNorSiteWords(self) -> None:
        """C{fleetctl --help} and every subcommand's C{--help}."""
        found = [
            f"{parser.prog}: {match.group(0)}"
            for parser in parsers(fleetctl.buildParser())
            for match in FORBIDDEN.finditer(parser.format_help())
        ]
        self.assertEqual(found, [])

    def test_statusLines_noRuleTagsNorSiteWords(self) -> None:
        """C{fleetctl status}'s words for a rich and a sparse report."""
        for doc in (RICH, SPARSE):
            text = "\n".join(statusLines(doc))
            # The issuer's name is the site's data, not fleetd's words.
            text = text.replace(doc["ldevid"]["issuer"] if doc["ldevid"] else "", "")
            self.assertEqual(FORBIDDEN.findall(text), [])
