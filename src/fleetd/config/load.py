"""
Load fleetd's TOML configuration (and, through L{fleetd.topology}, the
site topology) into frozen L{Settings}.

Every problem is reported as one L{ConfigError} whose message starts with the
dotted key it concerns, so start-up can print a single clear line.
Relative paths are resolved against the directory of the config file.
"""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetd.config.provision import kmsPort
from fleetd.config.reader import readSection
from fleetd.config.settings import KubernetesSettings, Settings
from fleetd.config.table import Table, checkUnknownKeys
from fleetd.config.tinkerbell import checkClasses
from fleetd.config.tinkloop import checkTinkLoop
from fleetd.topology import ConfigError, loadTopology


def _checkKubeCredentials(kube: KubernetesSettings | None) -> None:
    """One way to authenticate to the cluster: a token file or a client cert."""
    if kube is None:
        return
    cert = kube.client_cert is not None or kube.client_key is not None
    if kube.token_file is not None and cert:
        raise ConfigError(
            "kubernetes.token_file",
            "give token_file or client_cert and client_key, not both",
        )
    if kube.token_file is None and (
        kube.client_cert is None or kube.client_key is None
    ):
        raise ConfigError(
            "kubernetes.token_file",
            "missing: a bearer token file, or both client_cert and client_key",
        )


PLACEHOLDER = "REPLACE-WITH-"


def _checkPlaceholders(data: Mapping[str, Any], prefix: str = "") -> None:
    """
    A value the shipped C{conf/fleetd.toml} leaves for the site to fill in
    (C{REPLACE-WITH-...}, docs/install.md) stops start-up, naming its key:
    a placeholder never becomes a site's value by default.
    """
    for name, value in data.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            _checkPlaceholders(value, f"{key}.")
            continue
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, Mapping):
                _checkPlaceholders(item, f"{key}.")
            elif isinstance(item, str) and PLACEHOLDER in item:
                raise ConfigError(
                    key,
                    f"{item!r} is a placeholder: put the site's value here"
                    " (docs/install.md)",
                )


def parseSettings(data: Mapping[str, Any], source: Path) -> Settings:
    """Turn a parsed TOML document into L{Settings}."""
    _checkPlaceholders(data)
    root = Table(data, "", source.parent)
    topologyFile = root.section("site").path("topology")
    settings = readSection(
        Settings,
        root,
        source=source,
        topology_file=topologyFile,
        topology=loadTopology(topologyFile),
    )
    checkUnknownKeys(root)
    _checkKubeCredentials(settings.kubernetes)
    checkTinkLoop(
        settings.listen.tink,
        str(data["tink"]["upstream"]),
        settings.topology,
        socket.gethostname(),
    )
    if settings.tink.workflow_state == "kubernetes" and settings.kubernetes is None:
        raise ConfigError(
            "tink.workflow_state",
            '"kubernetes" reads Workflows through [kubernetes], which is absent',
        )
    _checkTinkerbell(settings)
    kmsPort(settings.provision, kmsListen(settings))
    return settings


def kmsListen(settings: Settings) -> str | None:
    """
    C{listen.kms} when the C{[kms]} table is present (fleetd is the site's
    KMS; C{tcp:4050} unless set), else L{None}.
    """
    return None if settings.kms is None else settings.listen.kms


def _checkTinkerbell(settings: Settings) -> None:
    """
    C{[tinkerbell]} writes through C{[kubernetes]}, for classes the site
    defines; its Workflows are watched by the one Workflow watch, so a
    C{tink.workflow_namespace} must include its namespace.
    """
    tinkerbell = settings.tinkerbell
    if tinkerbell is None:
        return
    if settings.kubernetes is None:
        raise ConfigError(
            "tinkerbell",
            "fleetd writes Hardware and Workflows through [kubernetes], which is"
            " absent",
        )
    checkClasses(tinkerbell, settings.provision.classes)
    watched = settings.tink.workflow_namespace
    if settings.tink.workflow_state == "kubernetes" and watched not in (
        None,
        tinkerbell.namespace,
    ):
        raise ConfigError(
            "tink.workflow_namespace",
            f"{watched!r} is not tinkerbell.namespace ({tinkerbell.namespace!r})"
            ' nor "*": one watch reads the Workflows of both',
        )


def loadSettings(path: Path) -> Settings:
    """Read the TOML file at C{path} and its topology file."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from e
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from e
    return parseSettings(data, path.resolve())
