"""
The dev configuration (C{conf/fleetd.dev.toml}, what C{make run} starts)
as a new user meets it (issue 27, item 10): two checkouts on one machine
keep apart everything but the loopback ports.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import ConfigError, Settings, loadSettings
from fleetd.config.table import configDirId
from fleetd.vault.mounts import VOLATILE_FILESYSTEMS, filesystemType
from tests.support import REPO

DEV_CONFIG = Path("conf") / "fleetd.dev.toml"


def checkout(root: Path) -> Path:
    """A checkout's C{conf/} at C{root}: its dev config's path."""
    shutil.copytree(REPO / "conf", root / "conf")
    return root / DEV_CONFIG


def paths(value: Any) -> list[Path]:
    """Every path a settings object holds, in its sub-tables too."""
    if isinstance(value, Path):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        found: list[Path] = []
        for f in dataclasses.fields(value):
            found += paths(getattr(value, f.name))
        return found
    return []


class CheckoutsApartTests(SynchronousTestCase):
    """Two checkouts' dev configs share no file, directory or vault."""

    def setUp(self) -> None:
        base = Path(self.mktemp()).resolve()
        self.roots = [base / "one", base / "two"]
        self.settings: list[Settings] = [
            loadSettings(checkout(root)) for root in self.roots
        ]

    def test_vault_perCheckoutOnTmpfs(self) -> None:
        """Each checkout's dev vault is its own directory under /dev/shm
        (tmpfs, [V1]), named by its config directory's digest."""
        vaults = [s.vault for s in self.settings]
        self.assertNotEqual(vaults[0], vaults[1])
        for root, vault in zip(self.roots, vaults, strict=True):
            self.assertEqual(
                vault,
                Path(f"/dev/shm/fleetd-dev-{configDirId(root / 'conf')}/configs"),
            )
            self.assertIn(filesystemType(Path("/dev/shm")), VOLATILE_FILESYSTEMS)
        self.assertFalse(any(s.vault_allow_any_fs for s in self.settings))

    def test_everyPath_ownedByItsCheckout(self) -> None:
        """Every path of the dev config (state, PKI, templates, topology)
        lies in its checkout, but the vault, which is per checkout on
        tmpfs: nothing is shared between two checkouts."""
        one, two = ({p for p in paths(s) if p != s.vault} for s in self.settings)
        self.assertTrue(one)
        for root, found in zip(self.roots, (one, two), strict=True):
            outside = [p for p in found if not p.is_relative_to(root)]
            self.assertEqual(outside, [], f"shared by every checkout: {outside}")

    def test_placeholder_misspelt_refused(self) -> None:
        """A brace in C{paths.vault} that is not C{{config_dir_id}} stops
        the start naming the key (it must not become a directory name)."""
        config = self.roots[0] / DEV_CONFIG
        text = config.read_text()
        line = next(x for x in text.splitlines() if x.startswith("vault = "))
        config.write_text(text.replace(line, line.replace("_dir_id", "_id")))
        error = self.assertRaises(ConfigError, loadSettings, config)
        self.assertEqual(error.key, "paths.vault")
