"""
C{device add} and C{device import} refuse a class or a cluster the site
does not define (issue 19 item 4): classes from C{provision.classes},
clusters from the templates in C{provision.templates}. One line says
which, with a did-you-mean hint; nothing is stored or journaled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.config import ConfigError, loadSettings
from fleetd.inventory.defined import SiteDefinitions
from fleetd.inventory.model import InventoryError
from fleetd.runs.render import TemplateRenderer
from tests.daemonsupport import DaemonTestMixin
from tests.devicessupport import devicesTree
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.inventorysupport import SITE, device
from tests.ownersupport import CSV, W1
from tests.support import writeConfig

BASE = "https://admin.test/devices"


class SiteDefinitionsTests(SynchronousTestCase):
    """L{SiteDefinitions.check}: the one line and its hint."""

    def refusal(self, defined: SiteDefinitions, **fields: Any) -> str:
        error = self.assertRaises(InventoryError, defined.check, device(**fields))
        self.assertEqual(error.kind, "invalid")
        self.assertNotIn("\n", str(error))
        return str(error)

    def test_check_definedClassAndCluster_passes(self) -> None:
        """A defined class, with a cluster that has a template or none, passes."""
        SITE.check(device(device_class="worker-g3", cluster="folly"))
        SITE.check(device(device_class="control-plane", cluster=None))

    def test_check_classTypo_saysClassAndMeant(self) -> None:
        """A misspelt class: the line says class and names the likely one."""
        self.assertEqual(
            self.refusal(SITE, device_class="wroker-g3"),
            "class: wroker-g3 is not a class this site defines"
            " (did you mean worker-g3?)",
        )

    def test_check_classFarOff_listsDefined(self) -> None:
        """With nothing close, the line lists the classes there are."""
        self.assertIn(
            "(defined: control-plane, worker, worker-g1, worker-g2, worker-g3)",
            self.refusal(SITE, device_class="gpu"),
        )

    def test_check_noClassesDefined_namesTheKey(self) -> None:
        """A site with no classes configured refuses, naming the key to set."""
        bare = SiteDefinitions((), lambda: ["default"], "templates")
        self.assertIn("provision.classes", self.refusal(bare))

    def test_check_clusterTypo_saysClusterAndMeant(self) -> None:
        """A cluster without a template: the line says cluster, the file, the hint."""
        self.assertEqual(
            self.refusal(SITE, cluster="foly"),
            "cluster: foly is not a cluster this site defines"
            " (no template foly.yaml in templates) (did you mean folly?)",
        )

    def test_checkAll_namesTheDevice(self) -> None:
        """In an import the line names the device whose class is wrong."""
        error = self.assertRaises(
            InventoryError,
            SITE.checkAll,
            [device(), device("w2", device_class="wroker")],
        )
        self.assertTrue(str(error).startswith("w2: class: wroker "), str(error))

    def test_renderer_clustersAreTemplatesPresent(self) -> None:
        """Clusters are the C{<cluster>.yaml} files present, read each time."""
        directory = Path(self.mktemp())
        directory.mkdir()
        renderer = TemplateRenderer(directory)
        self.assertEqual(renderer.clusters(), [])
        (directory / "folly.yaml").write_text("version: v1alpha1\n")
        (directory / "notes.txt").write_text("")
        (directory / "Bad_Name.yaml").write_text("")
        self.assertEqual(renderer.clusters(), ["folly"])
        missing = TemplateRenderer(directory / "absent")
        self.assertEqual(missing.clusters(), [])


class ClassesSettingTests(SynchronousTestCase):
    """C{provision.classes} in the configuration."""

    def test_classes_readLowerCased(self) -> None:
        """The list is read, lower-cased; absent, it is empty."""
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory, {"provision": {"classes": ["Worker-G3"]}})
        self.assertEqual(loadSettings(config).provision.classes, ("worker-g3",))
        config = writeConfig(directory, {"provision": {"classes": None}})
        self.assertEqual(loadSettings(config).provision.classes, ())

    def test_classes_badValues_oneLineNamingKey(self) -> None:
        """Not a list, a bad name or a repeated one: refused, naming the key."""
        directory = Path(self.mktemp()).resolve()
        for value in ("worker", ["worker", "-x"], ["worker", "WORKER"], [""]):
            config = writeConfig(directory, {"provision": {"classes": value}})
            error = self.assertRaises(ConfigError, loadSettings, config)
            self.assertEqual(error.key, "provision.classes", value)


class ResourceTests(SynchronousTestCase):
    """C{POST /v1/admin/devices} and its import refuse undefined names."""

    def setUp(self) -> None:
        tree = devicesTree(self)
        self.stub, self.inventory, self.journal = (
            tree.stub,
            tree.inventory,
            tree.journal,
        )

    def call(self, url: str, body: bytes) -> tuple[int, bytes]:
        d = self.stub.request("POST", url, data=body)
        self.stub.flush()
        response = self.successResultOf(d)
        return response.code, self.successResultOf(response.content())

    def assertNothingStored(self) -> None:
        self.assertEqual(self.successResultOf(self.inventory.list()), [])
        self.assertEqual(self.successResultOf(self.journal.query()), [])

    def test_add_undefinedClass_400NothingStored(self) -> None:
        """An undefined class is a 400 line saying so; nothing is added."""
        code, body = self.call(BASE, json.dumps({**W1, "class": "wroker-g3"}).encode())
        self.assertEqual(
            (code, body),
            (
                400,
                b"class: wroker-g3 is not a class this site defines"
                b" (did you mean worker-g3?)\n",
            ),
        )
        self.assertNothingStored()

    def test_add_undefinedCluster_400NothingStored(self) -> None:
        """A cluster without a template is a 400 line saying so."""
        code, body = self.call(BASE, json.dumps({**W1, "cluster": "fooly"}).encode())
        self.assertEqual(code, 400)
        self.assertTrue(body.startswith(b"cluster: fooly is not a cluster"), body)
        self.assertIn(b"(did you mean folly?)", body)
        self.assertNothingStored()

    def test_import_undefinedClass_400NothingImported(self) -> None:
        """One undefined class in a CSV refuses the whole import, naming the row."""
        bad = CSV.replace("worker-g3,folly", "worker-g4,folly", 1)
        self.assertNotEqual(bad, CSV)
        code, body = self.call(BASE + "/import", bad.encode())
        self.assertEqual(code, 400)
        self.assertTrue(body.startswith(b"w2: class: worker-g4 "), body)
        self.assertNothingStored()


class CommandTests(DaemonTestMixin, TestCase):
    """fleetctl device add against the daemon: the server's one line."""

    async def test_deviceAdd_typos_oneLineExit1(self) -> None:
        """
        fleetctl device add with a misspelt class or cluster exits 1 with
        one line naming which and the likely one; the right names work.
        """
        self.makeSettings()
        service = self.startDaemon()
        config = ownerConfig(self.directory, self.port(service, "admin"))
        uuid = "4c4c4544-0042-3510-8050-b4c04f4d3232"
        add = ("device", "add", "w1", "--serial", "SN-1", "--uuid", uuid)
        code, out, err = await fleetctlAgainst(
            config, *add, "--class", "wroker", "--cluster", "folly"
        )
        self.assertEqual((code, out, err.count("\n")), (1, "", 1))
        self.assertIn("class: wroker is not a class this site defines", err)
        self.assertIn("(did you mean worker?)", err)
        code, out, err = await fleetctlAgainst(
            config, *add, "--class", "worker", "--cluster", "folyl"
        )
        self.assertEqual((code, out, err.count("\n")), (1, "", 1))
        self.assertIn("cluster: folyl is not a cluster this site defines", err)
        self.assertIn("(did you mean folly?)", err)
        code, out, err = await fleetctlAgainst(
            config, *add, "--class", "worker", "--cluster", "folly"
        )
        self.assertEqual((code, err), (0, ""))
