"""
The site topology file [A1]: spore's addresses, the enrollment name and the
anchors whose CoreDNS answer it. Every problem is one L{ConfigError} naming
the key.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A configuration or topology value is missing or invalid."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class Anchor:
    """One anchor system whose CoreDNS answers the enrollment name."""

    name: str
    dns: str


@dataclass(frozen=True)
class Topology:
    """The site topology file [A1]."""

    spore_ip: str
    spore_bootstrap_ip: str
    enrollment_name: str
    anchors: tuple[Anchor, ...]
    spore_bootstrap_ipv6: str | None = None


def parseAddress(key: str, value: Any, version: int | None = None) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, "missing or not a string")
    try:
        address = ipaddress.ip_address(value)
    except ValueError as e:
        raise ConfigError(key, f"not an IP address: {value!r}") from e
    if version is not None and address.version != version:
        raise ConfigError(key, f"not an IPv{version} address: {value!r}")
    if address.is_unspecified or address.is_multicast:
        raise ConfigError(key, f"not a usable host address: {value!r}")
    return str(address)


def _dnsName(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "missing or not a string")
    name = value.rstrip(".").lower()
    labels = name.split(".")
    if len(name) > 253 or len(labels) < 2:
        raise ConfigError(key, f"not a fully qualified DNS name: {value!r}")
    for label in labels:
        if not (
            0 < len(label) <= 63
            and label[0] != "-"
            and label[-1] != "-"
            and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
        ):
            raise ConfigError(key, f"not a valid DNS name: {value!r}")
    return name


def parseTopology(data: bytes, where: str = "topology") -> Topology:
    """
    Parse the site topology JSON [A1].

    @param where: the name used in error messages for the file.
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(where, f"not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(where, "must be a JSON object")
    spore = parseAddress(f"{where}.SPORE_IP", doc.get("SPORE_IP"), 4)
    bootstrap = parseAddress(
        f"{where}.SPORE_BOOTSTRAP_IP", doc.get("SPORE_BOOTSTRAP_IP"), 4
    )
    v6 = doc.get("SPORE_BOOTSTRAP_IPV6")
    bootstrap6 = (
        None if v6 is None else parseAddress(f"{where}.SPORE_BOOTSTRAP_IPV6", v6, 6)
    )
    name = _dnsName(f"{where}.enrollment_name", doc.get("enrollment_name"))
    rawAnchors = doc.get("anchors", [])
    if not isinstance(rawAnchors, list):
        raise ConfigError(f"{where}.anchors", "must be a list")
    anchors = []
    for i, a in enumerate(rawAnchors):
        key = f"{where}.anchors[{i}]"
        if not isinstance(a, dict):
            raise ConfigError(key, "must be an object")
        anchorName = a.get("name")
        if not isinstance(anchorName, str) or not anchorName:
            raise ConfigError(f"{key}.name", "missing or not a string")
        anchors.append(Anchor(anchorName, parseAddress(f"{key}.dns", a.get("dns"))))
    return Topology(spore, bootstrap, name, tuple(anchors), bootstrap6)


def loadTopology(path: Path) -> Topology:
    """Read and parse the topology file at C{path}."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError("site.topology", f"cannot read {path}: {e.strerror}") from e
    return parseTopology(data, "site.topology")
