"""Shared test helpers: temporary dev configurations."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SkipTest

from fleetd.inventory.sqlite import SQLiteInventory
from fleetd.pki.dev import devConfigTables
from tests.inventorysupport import CLASSES

REPO = Path(__file__).resolve().parent.parent

# Metrics that exist only with their optional table ([netbox], [tinkerbell],
# [kms]): test_netbox_daemon, test_tinkerbell_wiring and test_kms_talos
# check those against the rules on a daemon that has the table.
OPTIONAL_METRICS = ("fleetd_netbox_", "fleetd_tinkerbell_", "fleetd_kms_")


def exposedMetrics(text: str) -> set[str]:
    """The metric families a C{/metrics} page (text format) names."""
    return set(re.findall(r"^# HELP (\w+)", text, re.MULTILINE))


def ruleMetrics(prefix: str = "fleetd_") -> set[str]:
    """The metrics starting with C{prefix} that conf/alerts.yml's rules use."""
    import yaml

    rules = yaml.safe_load((REPO / "conf" / "alerts.yml").read_text())
    return {
        name
        for group in rules["groups"]
        for rule in group["rules"]
        for name in re.findall(rf"\b{prefix}\w+", rule["expr"])
    }


TOPOLOGY = {
    "SPORE_IP": "10.20.0.5",
    "SPORE_BOOTSTRAP_IP": "10.20.0.6",
    "enrollment_name": "enroll.lolwtf.ca",
    "anchors": [
        {"name": "anchor-a", "dns": "127.0.0.2"},
        {"name": "anchor-b", "dns": "127.0.0.3"},
    ],
}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def writeConfig(
    directory: Path,
    overrides: dict[str, dict[str, Any]] | None = None,
    topology: dict[str, Any] | None = None,
    port: int = 0,
) -> Path:
    """
    Write a dev-style config (loopback, port 0 unless C{port}, dev PKI,
    vault on any filesystem) into C{directory}; return the file's path.

    C{overrides} maps table names to keys; a value of L{None} removes it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    templates = directory / "templates"
    templates.mkdir(exist_ok=True)
    template = REPO / "conf" / "templates" / "default.yaml"
    for cluster in ("default", "folly"):  # folly: the reference site's cluster
        (templates / f"{cluster}.yaml").write_bytes(template.read_bytes())
    (directory / "topology.json").write_text(json.dumps(topology or TOPOLOGY))
    listen = "tcp:{}:interface=127.0.0.1"
    tables: dict[str, dict[str, Any]] = {
        "site": {"name": "test", "topology": "topology.json"},
        "paths": {"state": "state", "vault": "vault", "vault_allow_any_fs": True},
        "listen": {
            "boot": listen.format(port),
            "device": listen.format(port),
            "admin": listen.format(port),
            "tink": listen.format(port),
            "dns": f"{port}:interface=127.0.0.1",
        },
        "limits": {"idle_timeout": 30, "max_connections": 64},
        **devConfigTables("https://localhost:8446"),
        "tink": {"upstream": "tcp:127.0.0.1:1"},
        "provision": {"classes": list(CLASSES)},
    }
    for table, keys in (overrides or {}).items():
        target = tables.setdefault(table, {})
        for key, value in keys.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    lines = []
    for table, keys in tables.items():
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in keys.items())
        lines.append("")
    path = directory / "fleetd.toml"
    path.write_text("\n".join(lines))
    return path


def filledTemplate() -> str:
    """
    The example template (C{conf/templates/default.yaml}) with every
    placeholder filled, as a site's generated template is: stand-in
    values of the right form (issue 27: fleetd refuses the example itself).
    """
    from fleetd.runs.placeholders import PLACEHOLDER, DevValues

    values = DevValues(b"t" * 32)
    example = (REPO / "conf" / "templates" / "default.yaml").read_text()
    return PLACEHOLDER.sub(lambda m: values.value(m.group()), example)


def inventoryOver(runner: Any) -> SQLiteInventory:
    """The SQLite inventory over C{runner}, journaling with a test key."""
    from twisted.internet.task import Clock

    from fleetd.store.journal import AsyncJournal, Journal

    return SQLiteInventory(runner, AsyncJournal(runner, Journal(b"k" * 32), Clock()))


def missingPeer(message: str) -> Exception:
    """
    A real peer the tests drive (swtpm, dig, a resource manager) is missing:
    a skip on a developer's machine, a failure under C{make test}, which
    installs every peer first and sets C{FLEETD_REQUIRE_PEERS}.
    """
    if os.environ.get("FLEETD_REQUIRE_PEERS"):
        return AssertionError(f"{message}; make test installs it")
    return SkipTest(message)
