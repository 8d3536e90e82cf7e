"""The README's configuration reference against the declared settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import Settings
from fleetd.config.reader import declaredDefaults

README = Path(__file__).resolve().parent.parent / "README.md"


def _shown(value: Any) -> str:
    """A default as the README writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def referenceDefaults() -> dict[str, str]:
    """The README reference's rows, dotted key -> default as written
    (C{`a.b`, `.c`} names C{a.c} too)."""
    text = README.read_text()
    section = text.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    found: dict[str, str] = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 4:
            continue
        keys = re.findall(r"`([^`]+)`", cells[1])
        values = re.findall(r"`([^`]+)`", cells[2])
        for i, key in enumerate(keys):
            if key.startswith(".") and i:
                key = keys[i - 1].rsplit(".", 1)[0] + key
                keys[i] = key
        if len(keys) == len(values):
            found.update(zip(keys, values, strict=True))
    return found


class ReferenceTests(SynchronousTestCase):
    def test_readme_namesEveryDefault(self) -> None:
        """Every key declared with a default is in the README's
        configuration reference, with that default."""
        reference = referenceDefaults()
        declared = dict(declaredDefaults(Settings))
        self.assertIn("limits.max_connections", declared)
        self.assertIn("dns.rate_limit.ipv6_prefix", declared)
        shown = {key: _shown(value) for key, value in declared.items()}
        self.assertEqual(
            shown, {key: reference.get(key, "(not in README)") for key in shown}
        )
