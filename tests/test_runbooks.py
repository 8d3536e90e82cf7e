"""
Every alert of C{conf/alerts.yml} has a runbook (issue 27, item 8): its
C{annotations.runbook_url} is C{docs/operations.md#ANCHOR} (relative to
the repository: fleetd has no documentation site), the anchor is a
heading of docs/operations.md as GitHub makes it, and that section names
the alert. Generic over the file: an alert added without its runbook
fails here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from twisted.trial.unittest import SynchronousTestCase

from tests.support import REPO

ALERTS = REPO / "conf" / "alerts.yml"
OPERATIONS = REPO / "docs" / "operations.md"
RUNBOOK = re.compile(r"docs/operations\.md#(?P<anchor>[^#\s]+)")
HEADING = re.compile(r"^(?P<level>#{1,6})[ \t]+(?P<text>.*?)[ \t]*#*[ \t]*$")
FENCE = re.compile(r"^[ \t]{0,3}(```|~~~)")


def slug(heading: str) -> str:
    """
    The anchor GitHub gives a heading (github-slugger): the rendered text
    (a link keeps its text, code spans their content) in lower case,
    every character that is not a letter, digit, C{_}, C{-} or space
    dropped, and spaces made C{-}.
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@dataclass(frozen=True)
class Section:
    """A heading of a Markdown page and its text, up to the next heading of
    its level or above."""

    anchor: str
    heading: str
    text: str


def sections(markdown: str) -> dict[str, Section]:
    """
    Every section of C{markdown} by its anchor; a heading repeated gets
    C{-1}, C{-2}, ... as on GitHub. Lines in fenced code are not headings.
    """
    found: list[tuple[int, str, str, int]] = []  # level, anchor, heading, line
    seen: dict[str, int] = {}
    lines = markdown.splitlines()
    fenced = False
    for number, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        text = match.group("text")
        anchor = base = slug(text)
        while anchor in seen:
            seen[base] += 1
            anchor = f"{base}-{seen[base]}"
        seen[anchor] = 0
        found.append((len(match.group("level")), anchor, text, number))
    result = {}
    for index, (level, anchor, text, start) in enumerate(found):
        end = next(
            (line for lvl, _, _, line in found[index + 1 :] if lvl <= level),
            len(lines),
        )
        result[anchor] = Section(anchor, text, "\n".join(lines[start:end]))
    return result


def alertRules(path: Path = ALERTS) -> list[dict[str, object]]:
    """Every alerting rule of the file, in order."""
    document = yaml.safe_load(path.read_text())
    return [
        rule
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def runbookProblems(rules: list[dict[str, object]], page: str) -> list[str]:
    """What is wrong with each rule's runbook_url, one line each."""
    known = sections(page)
    problems = []
    for rule in rules:
        name = str(rule["alert"])
        annotations = rule.get("annotations") or {}
        assert isinstance(annotations, dict)
        url = annotations.get("runbook_url")
        if url is None:
            problems.append(f"{name}: no annotations.runbook_url")
            continue
        match = RUNBOOK.fullmatch(str(url))
        if match is None:
            problems.append(
                f"{name}: runbook_url {url!r} is not docs/operations.md#ANCHOR"
            )
            continue
        section = known.get(match.group("anchor"))
        if section is None:
            problems.append(
                f"{name}: no heading of docs/operations.md has anchor {url!r}"
            )
        elif name not in section.text:
            problems.append(f"{name}: section {section.heading!r} does not name it")
    return problems


class SlugTests(SynchronousTestCase):
    """The anchors GitHub makes, as the runbook links need them."""

    def test_slug_likeGitHub(self) -> None:
        """Lower case, punctuation dropped, spaces to hyphens, code unwrapped."""
        cases = {
            "FleetdDown": "fleetddown",
            "Start-up and readiness: `/healthz`, `fleetd_ready`, `READY=1`":
                "start-up-and-readiness-healthz-fleetd_ready-ready1",
            "Kubernetes credentials [K1]\N{EN DASH}[K7]": "kubernetes-credentials-k1k7",
            "The code into META: `plan --write-meta`, `meta write`":
                "the-code-into-meta-plan---write-meta-meta-write",
            "A journal break (issue 19, item 5)": "a-journal-break-issue-19-item-5",
            "See [the vault](#the-vault) now": "see-the-vault-now",
        }  # fmt: skip
        for heading, anchor in cases.items():
            self.assertEqual(slug(heading), anchor, heading)

    def test_sections_repeatedHeadings_fencesAndEnds(self) -> None:
        """
        A repeated heading gets -1, -2; a heading in fenced code is not one;
        a section runs to the next heading of its level or above.
        """
        page = (
            "# Top\n## Alerts\nintro\n### FleetdDown\ndown text\n"
            "```\n# not a heading\n```\n### FleetdDown\nagain\n"
            "#### Detail\nmore\n## Next\nafter\n"
        )
        found = sections(page)
        self.assertEqual(
            list(found),
            ["top", "alerts", "fleetddown", "fleetddown-1", "detail", "next"],
        )
        self.assertIn("# not a heading", found["fleetddown"].text)
        self.assertNotIn("again", found["fleetddown"].text)
        self.assertIn("more", found["fleetddown-1"].text)
        self.assertNotIn("after", found["alerts"].text)
        self.assertIn("again", found["alerts"].text)

    def test_problems_named(self) -> None:
        """Each way a runbook link can be wrong is reported, naming the alert."""
        page = "## Alerts\n### FleetA\nFleetA means\n### Other\nnothing\n"
        rules: list[dict[str, object]] = [
            {
                "alert": "FleetA",
                "annotations": {"runbook_url": "docs/operations.md#fleeta"},
            },
            {"alert": "FleetB", "annotations": {"summary": "s"}},
            {"alert": "FleetC"},
            {"alert": "FleetD", "annotations": {"runbook_url": "https://x/#fleetd"}},
            {
                "alert": "FleetE",
                "annotations": {"runbook_url": "docs/operations.md#gone"},
            },
            {
                "alert": "FleetF",
                "annotations": {"runbook_url": "docs/operations.md#other"},
            },
        ]
        self.assertEqual(
            runbookProblems(rules, page),
            [
                "FleetB: no annotations.runbook_url",
                "FleetC: no annotations.runbook_url",
                "FleetD: runbook_url 'https://x/#fleetd' is not"
                " docs/operations.md#ANCHOR",
                "FleetE: no heading of docs/operations.md has anchor"
                " 'docs/operations.md#gone'",
                "FleetF: section 'Other' does not name it",
            ],
        )


class RunbookTests(SynchronousTestCase):
    """conf/alerts.yml against docs/operations.md, as they are."""

    def test_everyAlert_hasARunbookSectionNamingIt(self) -> None:
        """
        Every alert in conf/alerts.yml carries annotations.runbook_url to a
        section of docs/operations.md that exists and names the alert.
        """
        rules = alertRules()
        self.assertTrue(rules)
        self.assertEqual(runbookProblems(rules, OPERATIONS.read_text()), [])

    def test_linksToOperationsAnchors_resolve(self) -> None:
        """
        Every link into a section of docs/operations.md (from the page itself,
        the other docs and the README) names a heading it has.
        """
        known = sections(OPERATIONS.read_text())
        broken = []
        for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
            for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", doc.read_text()):
                path, _, anchor = target.partition("#")
                if path == "" and doc != OPERATIONS:
                    continue  # an anchor of its own page
                if path and (doc.parent / path).resolve() != OPERATIONS:
                    continue
                if anchor not in known:
                    broken.append(f"{doc.relative_to(REPO)}: {target}")
        self.assertEqual(broken, [])
