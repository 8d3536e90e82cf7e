"""
The shipped configurations (issue 27, item 6): C{conf/fleetd.toml} and
C{conf/prometheus/fleetd.yml} are generic, the site's values left as
C{REPLACE-WITH-...} placeholders that docs/install.md fills from its step
0; the reference site's filled-in copies are an example apart, in
C{conf/examples/folly/}.
"""

from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, loadSettings
from tests.support import REPO, _toml, writeConfig

GUIDE = REPO / "docs" / "install.md"
EXAMPLE = REPO / "conf" / "examples" / "folly"
SITE_WORDS = re.compile(r"\b(folly|lolwtf|spore|capsule|forge|terraform)\b")
FILL = re.compile(r"s#(REPLACE-WITH-[A-Z-]+)#\$([A-Z_]+)#")
PLACEHOLDER = re.compile(r"REPLACE-WITH-[A-Z][A-Z-]*[A-Z]")


def shellBlocks(text: str) -> list[str]:
    """The guide's C{sh} blocks, each as one text."""
    return re.findall(r"(?ms)^```sh\n(.*?)^```", text)


def variables(block: str) -> dict[str, str]:
    """C{NAME=VALUE} lines of a block (step 0), comments dropped."""
    found = {}
    for line in block.splitlines():
        if match := re.match(r"([A-Z_]+)=(\S+)", line):
            found[match.group(1)] = match.group(2)
    return found


def stepZero() -> dict[str, str]:
    return variables(shellBlocks(GUIDE.read_text())[0])


def guideFills(source: str) -> dict[str, str]:
    """The placeholders the guide's C{sed} of C{source} fills, to variables."""
    for block in shellBlocks(GUIDE.read_text()):
        command = block.replace("\\\n", " ")
        for line in command.splitlines():
            if line.startswith("sed ") and source in line:
                return dict(FILL.findall(line))
    raise AssertionError(f"no sed of {source} in the guide")


def filled(source: str, values: dict[str, str]) -> str:
    """C{source} (under the repository) as the guide's C{sed} writes it."""
    text = (REPO / source).read_text()
    for placeholder, name in guideFills(source).items():
        text = text.replace(placeholder, values[name])
    return text


def keys(document: dict[str, Any], prefix: str = "") -> set[str]:
    found = set()
    for name, value in document.items():
        if isinstance(value, dict):
            found |= keys(value, f"{prefix}{name}.")
        else:
            found.add(f"{prefix}{name}")
    return found


def reroot(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """C{config} with every absolute path moved under C{root}."""

    def move(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(("/etc/", "/var/", "/run/")):
            return str(root) + value
        return value

    return {t: {k: move(v) for k, v in keys.items()} for t, keys in config.items()}


def writeTOML(path: Path, config: dict[str, Any]) -> None:
    lines = []
    for table, keys in config.items():
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in keys.items())
        lines.append("")
    path.write_text("\n".join(lines))


def installed(root: Path) -> dict[str, Any]:
    """conf/fleetd.toml as docs/install.md's step 5 fills it, under C{root}."""
    return reroot(tomllib.loads(filled("conf/fleetd.toml", stepZero())), root)


class GenericTests(SynchronousTestCase):
    def test_shipped_placeholdersAreWhatTheGuideFills(self) -> None:
        """
        Every placeholder of conf/fleetd.toml and conf/prometheus/fleetd.yml
        is filled by the guide's sed from a step 0 variable, and no site
        word is left in them or in the guide.
        """
        zero = stepZero()
        for source in ("conf/fleetd.toml", "conf/prometheus/fleetd.yml"):
            text = (REPO / source).read_text()
            fills = guideFills(source)
            self.assertEqual(set(PLACEHOLDER.findall(text)), set(fills), source)
            self.assertLessEqual(set(fills.values()), set(zero), source)
            self.assertEqual(SITE_WORDS.findall(text.replace("examples/folly", "")), [])
        guide = GUIDE.read_text().replace("conf/examples/folly/", "")
        self.assertEqual(SITE_WORDS.findall(guide), [])

    def test_shipped_asIs_refusedOnItsFirstPlaceholder(self) -> None:
        """Installed without step 5's sed, fleetd stops on site.name."""
        e = self.assertRaises(ConfigError, loadSettings, REPO / "conf" / "fleetd.toml")
        self.assertEqual(e.key, "site.name")

    def test_filledIn_loadsWithOptionalBlocksOn(self) -> None:
        """
        §3: filled in with step 0's values, its topology written as the
        guide writes it, and the [kubernetes], [tinkerbell] and [netbox]
        blocks switched on, conf/fleetd.toml loads with no unknown key; so
        does the dev config.
        """
        loadSettings(REPO / "conf" / "fleetd.dev.toml")
        zero = stepZero()
        directory = Path(self.mktemp()).resolve()
        directory.mkdir()
        heredoc = re.search(r"(?ms)<<EOF\n(.*?)^EOF", GUIDE.read_text())
        assert heredoc is not None
        topology = directory / "topology.json"
        topology.write_text(string.Template(heredoc.group(1)).substitute(zero))
        text = filled("conf/fleetd.toml", zero).replace(
            "/etc/fleetd/topology.json", str(topology)
        )
        lines = [
            line[2:] if line.startswith(("# [", "# api", "# ca", "# token", "# url",
                                         "# namespace", "# template", "# image",
                                         "# toggle_allow_netboot"))
            else line
            for line in text.splitlines()
        ]  # fmt: skip
        path = directory / "fleetd.toml"
        path.write_text("\n".join(lines))
        s = loadSettings(path)
        assert s.kubernetes is not None and s.netbox is not None
        assert s.tinkerbell is not None
        self.assertEqual(list(s.tinkerbell.classes), ["worker"])
        self.assertEqual(s.kubernetes.api, zero["KUBE_API"])
        self.assertEqual(s.netbox.url, "https://netbox.example")
        self.assertEqual(
            (s.site_name, s.provision.default_cluster, s.topology.enrollment_name),
            (zero["SITE"], zero["CLUSTER"], zero["ENROLLMENT_NAME"]),
        )
        self.assertEqual(s.owner.client_cert, Path("/etc/fleetd/operators/root.pem"))


class ExampleTests(SynchronousTestCase):
    """conf/examples/folly: the reference site, filled in."""

    def test_example_loadsWithTheGenericKeys(self) -> None:
        """
        The reference site's fleetd.toml loads with its topology, and sets
        the same keys as the generic one: an example that cannot drift.
        """
        text = (EXAMPLE / "fleetd.toml").read_text()
        text = text.replace(
            "/etc/fleetd/clusters/folly/config/anchor-topology.json",
            str(EXAMPLE / "anchor-topology.json"),
        )
        path = Path(self.mktemp())
        path.write_text(text)
        s = loadSettings(path)
        self.assertEqual(
            (s.site_name, s.topology.enrollment_name), ("folly", "enroll.lolwtf.ca")
        )
        generic = tomllib.loads((REPO / "conf" / "fleetd.toml").read_text())
        self.assertEqual(keys(tomllib.loads(text)), keys(generic))

    def test_example_isTheGuideFilledIn(self) -> None:
        """
        The example's step 0 names the guide's variables, and its
        Prometheus job is conf/prometheus/fleetd.yml as step 11's sed
        fills it with them.
        """
        readme = (EXAMPLE / "README.md").read_text()
        block = re.search(r"(?ms)^## Step 0.*?```text\n(.*?)^```", readme)
        assert block is not None
        folly = variables(block.group(1))
        self.assertEqual(set(folly), set(stepZero()))
        generic = filled("conf/prometheus/fleetd.yml", folly)
        example = (EXAMPLE / "prometheus.yml").read_text()
        body = re.compile(r"(?ms)^rule_files:.*")
        self.assertEqual(
            [
                re.sub(r"\s+#.*", "", line)
                for line in body.findall(generic)[0].splitlines()
            ],
            [
                re.sub(r"\s+#.*", "", line)
                for line in body.findall(example)[0].splitlines()
            ],
        )


class TinkLoopLineTests(SynchronousTestCase):
    def test_guide_quotesTheLineFleetdPrints(self) -> None:
        """
        The guide's "tink-server on the same host" quotes the one line
        fleetd prints for an upstream that is its own listener.
        """
        path = writeConfig(
            Path(self.mktemp()),
            {
                "listen": {"tink": "tcp:42113"},
                "tink": {"upstream": "tcp:127.0.0.1:42113"},
            },
        )
        e = self.assertRaises(ConfigError, loadSettings, path)
        self.assertIn(f"\nfleetd: configuration error: {e}\n", GUIDE.read_text())
