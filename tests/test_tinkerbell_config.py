"""C{[tinkerbell]} (issue 28 item 1): read, or refused with one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, Settings, TinkerbellClass, loadSettings
from tests.support import writeConfig

KUBE = {"api": "https://kube.test", "token_file": "kube-token"}
CLASS = {
    "template": "fleetd-talos-install",
    "image": "https://images.example/talos/v1.9.0/metal-amd64.raw.zst",
    "toggle_allow_netboot": True,
}


def tables(
    classes: dict[str, dict[str, Any]] | None = None,
    namespace: str | None = "tink-system",
    kubernetes: dict[str, Any] | None = KUBE,
    **extra: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """writeConfig's overrides: [tinkerbell] and a table per class."""
    found: dict[str, dict[str, Any]] = {"tinkerbell": {"namespace": namespace}}
    if kubernetes is not None:
        found["kubernetes"] = dict(kubernetes)
    for name, values in (classes or {}).items():
        found[f"tinkerbell.classes.{name}"] = dict(values)
    found.update(extra)
    return found


class TinkerbellSettingsTests(SynchronousTestCase):
    def load(self, overrides: dict[str, dict[str, Any]]) -> Settings:
        return loadSettings(writeConfig(Path(self.mktemp()), overrides))

    def error(self, overrides: dict[str, dict[str, Any]]) -> ConfigError:
        path = writeConfig(Path(self.mktemp()), overrides)
        e: ConfigError = self.assertRaises(ConfigError, loadSettings, path)
        return e

    def test_absent_none(self) -> None:
        """Without [tinkerbell] fleetd writes no Tinkerbell object."""
        self.assertIsNone(self.load({}).tinkerbell)

    def test_classes_read(self) -> None:
        """The namespace and each class's template, image and boot options."""
        s = self.load(
            tables(
                {
                    "worker-g3": CLASS,
                    "worker": {**CLASS, "toggle_allow_netboot": False},
                    "control-plane": {**CLASS, "boot_mode": "netboot"},
                }
            )
        ).tinkerbell
        assert s is not None
        self.assertEqual(s.namespace, "tink-system")
        self.assertEqual(
            s.forClass("worker-g3"),
            TinkerbellClass(
                "fleetd-talos-install",
                "https://images.example/talos/v1.9.0/metal-amd64.raw.zst",
                True,
            ),
        )
        worker = s.forClass("worker")
        assert worker is not None
        self.assertFalse(worker.toggle_allow_netboot)
        self.assertEqual(s.classes["control-plane"].boot_mode, "netboot")
        self.assertIsNone(s.forClass("worker-g1"))

    def test_missingValues_oneLineNamingEach(self) -> None:
        """A class without its template, image or toggle stops start-up,
        naming the key."""
        for key in ("template", "image", "toggle_allow_netboot"):
            values = {k: v for k, v in CLASS.items() if k != key}
            e = self.error(tables({"worker-g3": values}))
            self.assertEqual(e.key, f"tinkerbell.classes.worker-g3.{key}")
            self.assertIn("missing", str(e))
            self.assertEqual(len(str(e).splitlines()), 1)
        e = self.error(tables({"worker-g3": CLASS}, namespace=None))
        self.assertEqual(e.key, "tinkerbell.namespace")

    def test_badValues_named(self) -> None:
        """A template that is no object name, an image that is no URL, a
        toggle that is no boolean, an unknown boot mode or key."""
        for key, value in (
            ("template", "Not A Name"),
            ("image", "metal-amd64.raw.zst"),
            ("toggle_allow_netboot", "yes"),
            ("boot_mode", "customboot"),
        ):
            e = self.error(tables({"worker-g3": {**CLASS, key: value}}))
            self.assertEqual(e.key, f"tinkerbell.classes.worker-g3.{key}")
        e = self.error(tables({"worker-g3": {**CLASS, "imgae": "x"}}))
        self.assertEqual(e.key, "tinkerbell.classes.worker-g3.imgae")
        e = self.error(tables(namespace="Tink_System"))
        self.assertEqual(e.key, "tinkerbell.namespace")

    def test_unknownClass_refusedWithHint(self) -> None:
        """A class not in provision.classes is refused, one line naming it."""
        e = self.error(tables({"worker-g3": CLASS, "worker-g4": CLASS}))
        self.assertEqual(e.key, "tinkerbell.classes.worker-g4")
        self.assertIn("did you mean", str(e))
        self.assertEqual(len(str(e).splitlines()), 1)

    def test_needsKubernetes(self) -> None:
        """[tinkerbell] writes through [kubernetes]: without it, refused."""
        e = self.error(tables({"worker-g3": CLASS}, kubernetes=None))
        self.assertEqual(e.key, "tinkerbell")
        self.assertIn("[kubernetes]", str(e))

    def test_workflowWatch_mustSeeTheNamespace(self) -> None:
        """One Workflow watch serves boot completion and [tinkerbell]: its
        namespace must be tinkerbell.namespace, or all of them."""
        tink = {
            "upstream": "tcp:127.0.0.1:1",
            "workflow_state": "kubernetes",
            "workflow_namespace": "other",
        }
        e = self.error(tables({"worker-g3": CLASS}, tink=tink))
        self.assertEqual(e.key, "tink.workflow_namespace")
        for namespace in ("tink-system", "*"):
            self.load(
                tables(
                    {"worker-g3": CLASS},
                    tink={**tink, "workflow_namespace": namespace},
                )
            )
