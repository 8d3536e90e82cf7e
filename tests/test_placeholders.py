"""
Placeholder templates never reach a node (issue 27, item 3).

A template holding an unfilled C{REPLACE-WITH-...} placeholder
(L{fleetd.runs.placeholders}) is refused when the configuration loads,
with one line naming the file, the line and the placeholder; the
production start (twistd) refuses it; a provision with such a template
(changed on disk after the start) is refused the same way and makes no
run: no run entry in the journal, no vault file, no bootstrap token. The
dev configuration fills the placeholders with values of its own.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd.admin.provision import ProvisionResource
from fleetd.config import ConfigError, loadSettings
from fleetd.prepare import prepare
from fleetd.runs.placeholders import PLACEHOLDER, DevValues, findPlaceholder
from fleetd.runs.render import NodeFacts, RenderError, TemplateRenderer
from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import fleetctlAgainst
from tests.fleetsupport import Fleet, device
from tests.support import REPO, filledTemplate, writeConfig
from tests.test_config_shipped import installed, writeTOML
from tests.test_twistd import spawn

EXAMPLE = REPO / "conf" / "templates" / "default.yaml"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
FIRST = "line 11: unfilled placeholder REPLACE-WITH-TRUSTD-TOKEN (and 5 more)"


def find(text: str) -> Any:
    return findPlaceholder(text, Path("t.yaml"), LOADER)


class DefinitionTests(SynchronousTestCase):
    """What a placeholder is, and where it is looked for."""

    def test_example_everyPlaceholderFound(self) -> None:
        """
        The shipped example's placeholders are all of the one form, and
        the first is named with its line and the count of the rest.
        """
        text = EXAMPLE.read_text()
        self.assertEqual(
            sorted(set(PLACEHOLDER.findall(text))),
            [
                "REPLACE-WITH-BOOTSTRAP-TOKEN",
                "REPLACE-WITH-CLUSTER-CA-CRT",
                "REPLACE-WITH-CLUSTER-ID",
                "REPLACE-WITH-CLUSTER-SECRET",
                "REPLACE-WITH-MACHINE-CA-CRT",
                "REPLACE-WITH-TRUSTD-TOKEN",
            ],
        )
        self.assertEqual(text.count("REPLACE-WITH"), 6)  # install.md's grep
        found = findPlaceholder(text, EXAMPLE, LOADER)
        assert found is not None
        self.assertEqual(
            (found.line, found.text, found.count), (11, "REPLACE-WITH-TRUSTD-TOKEN", 6)
        )
        line = str(found)
        self.assertEqual(line.count("\n"), 0)
        self.assertTrue(line.startswith(f"{EXAMPLE} {FIRST};"), line)

    def test_form(self) -> None:
        """
        C{REPLACE-WITH-} and capital words joined by single hyphens,
        anywhere in a value or a key; nothing else.
        """
        cases = {
            "a: REPLACE-WITH-X\n": "REPLACE-WITH-X",
            "a: https://REPLACE-WITH-HOST2:6443/\n": "REPLACE-WITH-HOST2",
            "REPLACE-WITH-KEY: 1\n": "REPLACE-WITH-KEY",
            "a: [x, 'REPLACE-WITH-A-B-']\n": "REPLACE-WITH-A-B",
            "a: x\n---\nb: REPLACE-WITH-LATER\n": "REPLACE-WITH-LATER",
        }
        for text, name in cases.items():
            found = find(text)
            self.assertEqual(None if found is None else found.text, name, text)
        for text in [
            "a: replace-with-x\n",
            "a: REPLACE-WITH-\n",
            "a: REPLACE-WITH-lower\n",
            "a: REPLACE_WITH_X\n",
            "# REPLACE-WITH-X in a comment never reaches a node\na: 1\n",
        ]:
            self.assertIsNone(find(text), text)

    def test_line_isWhereItIsWritten(self) -> None:
        """A placeholder inside a block scalar is named by its own line."""
        text = "a: 1\nfiles:\n  - content: |\n      x\n      y REPLACE-WITH-Z\n"
        self.assertEqual(find(text).line, 5)
        self.assertEqual(find('a: 1\nb: "\\u00e9 REPLACE-WITH-Q"\n').line, 2)


class RenderTests(SynchronousTestCase):
    """The renderer refuses a placeholder; with dev values it fills them."""

    def setUp(self) -> None:
        self.directory = Path(self.mktemp())
        self.directory.mkdir()
        self.template = self.directory / "default.yaml"
        shutil.copy(EXAMPLE, self.template)
        self.node = NodeFacts("w1", "worker", run="r1")

    def test_render_example_refusedOneLine(self) -> None:
        renderer = TemplateRenderer(self.directory)
        error = self.assertRaises(RenderError, renderer.render, None, self.node)
        self.assertEqual(str(error), str(findPlaceholder(
            EXAMPLE.read_text(), self.template, LOADER
        )))  # fmt: skip
        self.assertIn(f"{self.template} {FIRST}", str(error))
        self.assertRaises(RenderError, renderer.check, None)
        self.assertRaises(RenderError, renderer.checkAll)

    def test_filledTemplate_rendered(self) -> None:
        """A template without placeholders renders as before."""
        self.template.write_text(filledTemplate())
        renderer = TemplateRenderer(self.directory)
        renderer.checkAll()
        body = renderer.render(None, self.node)
        self.assertNotIn(b"REPLACE-WITH", body)

    def test_changedOnDisk_refusedAtTheNextRender(self) -> None:
        """A template that gains a placeholder after it was read is refused."""
        self.template.write_text(filledTemplate())
        renderer = TemplateRenderer(self.directory)
        renderer.render(None, self.node)
        self.template.write_text(filledTemplate() + "extra: REPLACE-WITH-MORE\n")
        error = self.assertRaises(RenderError, renderer.render, None, self.node)
        line = len(filledTemplate().splitlines()) + 1
        expected = f"line {line}: unfilled placeholder REPLACE-WITH-MORE;"
        self.assertIn(expected, str(error))

    def test_devValues_filledTheSameEachTime(self) -> None:
        """
        Dev values: every placeholder filled, in the form of its kind, the
        same for one key and different for another.
        """
        body = TemplateRenderer(self.directory, values=DevValues(b"a" * 32)).render(
            None, self.node
        )
        again = TemplateRenderer(self.directory, values=DevValues(b"a" * 32)).render(
            None, self.node
        )
        other = TemplateRenderer(self.directory, values=DevValues(b"b" * 32)).render(
            None, self.node
        )
        self.assertNotIn(b"REPLACE-WITH", body)
        self.assertEqual(body, again)
        self.assertNotEqual(body, other)
        machine = next(yaml.safe_load_all(body))
        self.assertRegex(machine["machine"]["token"], r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
        self.assertRegex(machine["cluster"]["token"], r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
        self.assertRegex(machine["cluster"]["secret"], r"^[A-Za-z0-9+/]{43}=$")


def productionConfig(root: Path, template: str) -> Path:
    """
    conf/fleetd.toml as docs/install.md fills it, moved under C{root},
    with a topology and C{template} as its default cluster's template
    (L{clusterTemplate}); nothing else of /etc/fleetd exists.
    """
    conf = REPO / "conf"
    config = installed(root)
    topology = Path(config["site"]["topology"])
    topology.parent.mkdir(parents=True)
    shutil.copy(conf / "anchor-topology.example.json", topology)
    clusterTemplate(root).parent.mkdir(parents=True)
    clusterTemplate(root).write_text(template)
    path = root / "etc" / "fleetd" / "fleetd.toml"
    writeTOML(path, config)
    return path


def clusterTemplate(root: Path) -> Path:
    """The default cluster's template in L{productionConfig}'s C{root}."""
    provision = installed(root)["provision"]
    return Path(provision["templates"]) / f"{provision['default_cluster']}.yaml"


class StartTests(TestCase):
    """The production start refuses the example template."""

    timeout = 120

    def test_loader_productionConfig_exampleRefused(self) -> None:
        """
        The production config with the example as its template: loading
        it (settings, then every file) stops at the template, with one line
        naming the key, the file, the line and the placeholder.
        """
        root = Path(self.mktemp()).resolve()
        config = productionConfig(root, EXAMPLE.read_text())
        error = self.assertRaises(ConfigError, prepare, loadSettings(config))
        folly = clusterTemplate(root)
        self.assertEqual(error.key, "provision.templates")
        self.assertTrue(str(error).startswith(f"provision.templates: {folly} {FIRST};"))
        self.assertEqual(str(error).count("\n"), 0)

    async def test_twistd_productionConfig_exampleRefused(self) -> None:
        """
        twistd -n fleetd with the production config and the example
        template exits 2 with that one line on stderr; nothing listens.
        """
        root = Path(self.mktemp()).resolve()
        proto = spawn(self, productionConfig(root, EXAMPLE.read_text()))
        self.assertEqual(await proto.ended, 2)
        lines = proto.err.decode().strip().splitlines()
        folly = clusterTemplate(root)
        self.assertEqual(lines, [
            f"fleetd: configuration error: provision.templates: {folly} {FIRST};"
            ' fill the template as docs/install.md, "The Talos template", says'
        ])  # fmt: skip
        self.assertNotIn(b"listen.started", proto.out)

    def test_devConfig_generatesValues(self) -> None:
        """
        The dev configuration ([dev] generate_values, as conf/fleetd.dev.toml
        sets it) starts with the example template; without that key the
        same configuration is refused.
        """
        self.assertTrue(loadSettings(REPO / "conf" / "fleetd.dev.toml").dev_values)
        directory = Path(self.mktemp()).resolve()
        settings = loadSettings(writeConfig(directory))
        self.assertTrue(settings.dev_values)
        prepared = prepare(settings)
        prepared.database.close()
        prepared.vault.close()
        refused = writeConfig(
            Path(self.mktemp()).resolve(), {"dev": {"generate_values": False}}
        )
        error = self.assertRaises(ConfigError, prepare, loadSettings(refused))
        self.assertIn(f"default.yaml {FIRST};", str(error))


class Credentials:
    """An L{ICredentials} that records whether a token was ever made."""

    def __init__(self) -> None:
        self.issued: list[str] = []

    async def issue(self, device: str, run: str) -> Any:
        self.issued.append(device)
        raise AssertionError("no token may be made for a refused template")

    def recordIn(self, *args: Any) -> None:
        raise AssertionError("nothing to record")

    async def discard(self, issued: list[Any]) -> None:
        pass

    def committed(self, issued: list[Any]) -> None:
        pass


class ProvisionTests(SynchronousTestCase):
    """A provision with a placeholder template makes no run."""

    def setUp(self) -> None:
        self.templates = Path(self.mktemp())
        self.templates.mkdir()
        (self.templates / "default.yaml").write_text(filledTemplate())
        shutil.copy(EXAMPLE, self.templates / "folly.yaml")
        self.fleet = Fleet(self)
        self.credentials = Credentials()

    def provision(self, *names: str) -> tuple[int, str]:
        resource = ProvisionResource(
            self.fleet.registry,
            self.fleet.inventory,
            TemplateRenderer(self.templates),
            self.fleet.journal,
            ownerName=lambda request: "jane",
            credentials=self.credentials,
        )
        request: Any = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(json.dumps({"devices": list(names)}).encode())
        resource.render(request)
        return request.responseCode, b"".join(request.written).decode()

    def test_placeholder_refusedNoRunNoToken(self) -> None:
        """
        A rack with one device on the example template: 409, one line
        naming the device, its cluster, the file, the line and the
        placeholder; journaled as provision.refused (reason template);
        no run entry, no vault file, no bootstrap token, for either device.
        """
        self.fleet.add(device("w1", "SER1"))
        self.fleet.add(replace(device("w2", "SER2"), cluster="folly"))
        code, body = self.provision("w1", "w2")
        self.assertEqual(code, 409)
        where = self.templates / "folly.yaml"
        self.assertEqual(body.count("\n"), 1, body)
        self.assertTrue(
            body.startswith(f"template: w2 (cluster folly): {where} {FIRST};"), body
        )
        self.assertIn("nothing was provisioned", body)
        self.assertEqual(self.fleet.events(), ["provision.refused"])
        (entry,) = self.fleet.test.successResultOf(self.fleet.journal.query())
        self.assertEqual((entry.device, entry.fields["reason"]), ("w2", "template"))
        self.assertIn("REPLACE-WITH-TRUSTD-TOKEN", str(entry.fields["problem"]))
        self.assertEqual(self.credentials.issued, [])
        self.assertEqual(self.fleet.vault.names(), [])
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertIsNone(self.fleet.registry.readyRun("w2"))


class CommandTests(DaemonTestMixin, TestCase):
    """fleetctl provision against a production-mode daemon."""

    async def test_templateGainsPlaceholder_refusedNoRun(self) -> None:
        """
        Started with a filled template (no dev values), the template then
        replaced on disk by the example: fleetctl provision exits 1 with
        one line naming the file, the line and the placeholder; the
        journal holds the refusal and no run; the vault stays empty.
        """
        self.makeSettings({"dev": {"generate_values": False}})
        folly = self.directory / "templates" / "folly.yaml"
        for name in ("default.yaml", "folly.yaml"):
            (self.directory / "templates" / name).write_text(filledTemplate())
        _, fleetctl = await self.startWithDevice(cluster="folly")
        config = fleetctl.config
        shutil.copy(EXAMPLE, folly)
        code, out, err = await fleetctlAgainst(config, "provision", "w1")
        self.assertEqual((code, out, err.count("\n")), (1, "", 1))
        self.assertIn(f"template: w1 (cluster folly): {folly} {FIRST};", err)
        code, out, err = await fleetctlAgainst(
            config, "--json", "journal", "--device", "w1"
        )
        self.assertEqual(code, 0, err)
        events = [(e["event"], e["fields"].get("reason")) for e in json.loads(out)]
        self.assertEqual(
            events, [("device.added", None), ("provision.refused", "template")]
        )
        self.assertEqual(list((self.directory / "vault").iterdir()), [])
