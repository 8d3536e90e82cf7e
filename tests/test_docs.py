"""
The repository stands alone (issue 19, item 6): its documents link only
to files it holds, and every rule tag the code and tests cite (C{[C1]},
C{[V4]}, ...) is defined in C{docs/design.md}.

The map tells the truth (issue 29, item 6): every path a document names
exists (or says where it is now), C{docs/architecture.md} names every
package and top-level module of C{src/fleetd}, and the subject index of
C{docs/decisions.md} links only to its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests.support import REPO
from tests.test_runbooks import sections

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TAG = re.compile(r"\[([ABCDEFJKORTV][0-9])\]")
DEFINED = re.compile(r"^- \*\*\[([A-Z][0-9])\]\*\*", re.MULTILINE)
# A path of the clone named in prose: src/..., fleetd/..., tests/..., ...
PATH = re.compile(r"(?<![\w./-])((?:src|fleetd|tests|bench|conf|docs)/[\w.*/-]*[\w*])")
# A path that moved, kept where the text is history: `old` (now `new`
NOW = re.compile(r"`?\s+\(now `(?P<path>[^`]+)`")
# Path-shaped words that are not paths of this clone.
# A numbered section of the design (docs/design.md §9, DESIGN 4): the
# numbers were the contract's, which the clone lacks; docs/design.md has
# headings only. Kept where the text is history: `... §9, now [...]`.
NUMBERED = re.compile(
    r"(?:design\.md|DESIGN)[\s,#]*(?:§|section\s+)?\d+(?![\s,]*\(?now\b)"
)
NOT_OURS = {
    # Tinkerbell's repository, cited in decisions.md and install.md.
    "docs/technical/TLS_TERMINATION.md",
    # "fleetd/nginx/minimal twisted.web": three servers compared.
    "fleetd/nginx/minimal",
}


DECISIONS = REPO / "docs" / "decisions.md"


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def packagesAndModules() -> list[str]:
    """
    Every package of C{src/fleetd} as C{name/} (a subpackage as
    C{parent/name/}) and every top-level module as C{name}.
    """
    root = REPO / "src" / "fleetd"
    names = [
        f"{init.parent.relative_to(root).as_posix()}/"
        for init in root.rglob("__init__.py")
        if init.parent != root
    ]
    names += [m.stem for m in root.glob("*.py") if m.name != "__init__.py"]
    return sorted(names)


def inClone(path: str) -> bool:
    """
    C{path} (a file, a folder, a module without C{.py} or a glob) names
    something in the clone; C{fleetd/...} is read as C{src/fleetd/...}.
    """
    if path.startswith("fleetd/"):
        path = "src/" + path
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path).exists() or (REPO / f"{path}.py").exists()


def citingTexts() -> list[Path]:
    """Every text of the clone that may cite the design: code, tests,
    benches, the build files and the documents."""
    sources = [
        source
        for tree in ("src/fleetd", "tests", "bench")
        for source in sorted((REPO / tree).rglob("*.py"))
        if source.name != "test_docs.py"
    ]
    return [*sources, REPO / "pyproject.toml", REPO / "Makefile", *documents()]


def stalePaths(text: str) -> list[str]:
    """
    Every path of the clone C{text} names that is not there, unless the
    text says where it is now, right after it: C{`old` (now `new`)}.
    """
    stale = []
    for match in PATH.finditer(text):
        path = match.group(1)
        if path in NOT_OURS or inClone(path):
            continue
        now = NOW.match(text, match.end())
        if now is not None and inClone(now.group("path")):
            continue
        stale.append(path)
    return stale


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

    def test_noNumberedSectionOfTheDesign(self) -> None:
        """
        Code, tests, benches, pyproject.toml, the Makefile and the
        documents cite docs/design.md by its headings ("The rack
        simulator's faults"), never by a section number it does not have.
        """
        citing = [
            f"{source.relative_to(REPO)}: {match.group(0)!r}"
            for source in citingTexts()
            for match in NUMBERED.finditer(source.read_text())
        ]
        self.assertEqual(citing, [])

    def test_numbered_seen(self) -> None:
        """The check finds a section number, across a line break too, and
        accepts a heading or history that says where it is now."""
        found = [
            m.group(0)
            for m in NUMBERED.finditer(
                "docs/design.md §9 | (DESIGN 4: ...) | docs/design.md\n# section 9"
            )
        ]
        self.assertEqual(found, ["design.md §9", "DESIGN 4", "design.md\n# section 9"])
        self.assertIsNone(
            NUMBERED.search(
                "docs/design.md, the rack simulator's faults; design.md [F1];"
                " docs/design.md §9, now\n  [the rack simulator's faults]"
            )
        )

    def test_everyCitedRuleIsDefined(self) -> None:
        """Each rule tag in fleetd/ and tests/ has its sentence in docs/design.md."""
        defined = set(DEFINED.findall((REPO / "docs" / "design.md").read_text()))
        cited: set[str] = set()
        for tree in ("src/fleetd", "tests"):
            for source in (REPO / tree).rglob("*.py"):
                cited.update(TAG.findall(source.read_text()))
        self.assertTrue(cited)
        self.assertEqual(sorted(cited - defined), [])

    def test_pathsExist(self) -> None:
        """
        Every C{src/...}, C{fleetd/...}, C{tests/...}, C{bench/...},
        C{conf/...} and C{docs/...} path in the README and docs/ exists,
        or is followed by C{(now `...`)} naming where it is now.
        """
        stale = [
            f"{doc.relative_to(REPO)}: {path}"
            for doc in documents()
            for path in stalePaths(doc.read_text())
        ]
        self.assertEqual(stale, [])

    def test_stalePaths_seen(self) -> None:
        """The check finds a path that is gone, and accepts one said moved."""
        self.assertEqual(
            stalePaths("see `src/fleetd/listen.py` and src/fleetd/listen/"),
            ["src/fleetd/listen.py"],
        )
        self.assertEqual(
            stalePaths("`src/fleetd/listen.py` (now `src/fleetd/listen/tls.py`)"), []
        )
        self.assertEqual(
            stalePaths("`fleetd/listen.py` (now `src/fleetd/nowhere.py`)"),
            ["fleetd/listen.py", "src/fleetd/nowhere.py"],
        )
        self.assertEqual(stalePaths("`tests/test_sim*.py`, fleetd/automata"), [])

    def test_architecture_namesEveryPackage(self) -> None:
        """
        docs/architecture.md names every package and top-level module of
        C{src/fleetd} (as C{`name/`} or C{`name`}): one added without its
        place on the map fails here.
        """
        architecture = (REPO / "docs" / "architecture.md").read_text()
        names = packagesAndModules()
        self.assertIn("admin/console/", names)
        self.assertIn("statuswords", names)
        self.assertEqual([n for n in names if f"`{n}`" not in architecture], [])

    def test_anchors_nameHeadings(self) -> None:
        """
        A link to a heading (C{#anchor}, in the same page or in another
        document of the clone) names a heading of that page, as GitHub
        makes its anchor.
        """
        broken = []
        for doc in documents():
            for target in LINK.findall(doc.read_text()):
                if re.match(r"[a-z]+:", target) or "#" not in target:
                    continue
                name, anchor = target.split("#", 1)
                page = (doc.parent / name).resolve() if name else doc
                if page.suffix != ".md" or not page.is_file():
                    continue  # a link to a missing file fails above
                if anchor not in sections(page.read_text()):
                    broken.append(f"{doc.relative_to(REPO)}: {target}")
        self.assertEqual(broken, [])

    def test_decisions_subjectIndex(self) -> None:
        """
        docs/decisions.md opens with its subject index, before the first
        issue's section; every link of it is a heading of decisions.md (or
        of the document it names), and "why the vault is tmpfs" is there.
        """
        found = sections(DECISIONS.read_text())
        anchors = list(found)
        self.assertEqual(
            anchors[:2],
            ["decisions-where-the-issues-and-the-design-are-silent", "subject-index"],
        )
        index = found["subject-index"].text
        links = LINK.findall(index)
        self.assertGreater(len(links), 50)
        missing = []
        for target in links:
            name, _, anchor = target.partition("#")
            page = DECISIONS.parent / name if name else DECISIONS
            if not page.is_file():
                missing.append(target)
            elif anchor and anchor not in sections(page.read_text()):
                missing.append(target)
        self.assertEqual(missing, [])
        vault = next(line for line in index.splitlines() if "The vault" in line)
        self.assertIn("why tmpfs", vault)


# The two fakes of remote servers (docs/architecture.md, testing/): each
# is one server's contract in one place, and they are not fleetd.
LONG_FAKES = {"testing/kube.py", "testing/netbox.py"}
MAX_LINES = 400


def longModules(root: Path) -> list[str]:
    """Modules under C{root} longer than L{MAX_LINES}, generated code aside."""
    return sorted(
        f"{path.relative_to(root)}: {lines}"
        for path in root.rglob("*.py")
        if not path.name.endswith("_pb2.py")
        and str(path.relative_to(root)) not in LONG_FAKES
        and (lines := len(path.read_text().splitlines())) > MAX_LINES
    )


class HousePlanTests(SynchronousTestCase):
    """The rooms stay small enough to read (issue 29)."""

    def test_noModuleOver400Lines(self) -> None:
        """No module of src/fleetd/ but the two fakes is over 400 lines."""
        self.assertEqual(longModules(REPO / "src" / "fleetd"), [])

    def test_longModule_seen(self) -> None:
        root = Path(self.mktemp())
        (root / "testing").mkdir(parents=True)
        (root / "big.py").write_text("x = 1\n" * 401)
        (root / "small.py").write_text("x = 1\n" * 400)
        (root / "testing" / "kube.py").write_text("x = 1\n" * 900)
        (root / "gen_pb2.py").write_text("x = 1\n" * 900)
        self.assertEqual(longModules(root), ["big.py: 401"])
