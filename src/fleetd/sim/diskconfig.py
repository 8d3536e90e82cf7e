"""
What a node's delivered configuration says of its disks, as Talos reads
it (L{fleetd.sim.luks} acts on it): C{machine.systemDiskEncryption}'s
C{state} and C{ephemeral} each name a KMS key whose C{endpoint} fleetd
writes as C{https://<enrollment name>:<kms port>} for a class that opts
in (L{fleetd.runs.diskencryption}). A configuration without the section
encrypts nothing (L{UNENCRYPTED}).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

import yaml

VOLUMES = ("STATE", "EPHEMERAL")
UNENCRYPTED = "configuration carries no disk encryption"


class ConfigProblem(Exception):
    """A section fleetd should not have written (one line)."""


@dataclass(frozen=True)
class Endpoint:
    """A volume's KMS key's C{endpoint}, and the name and port in it."""

    url: str
    host: str
    port: int


def kmsEndpoints(config: bytes, enrollment: str) -> dict[str, Endpoint] | None:
    """
    Where Talos reaches the KMS for each volume, from its delivered
    configuration: C{machine.systemDiskEncryption.<state|ephemeral>
    .keys[].kms.endpoint}, which must be C{https://ENROLLMENT:PORT}.
    L{None}: the configuration has no C{systemDiskEncryption}.

    @raise ConfigProblem: a section without a KMS key for a volume, or an
        endpoint not of that form (one line).
    """
    try:
        docs = list(yaml.safe_load_all(config))
    except yaml.YAMLError as e:
        raise ConfigProblem(f"configuration: not YAML: {e}") from None
    machine = next(
        (d.get("machine") for d in docs
         if isinstance(d, dict) and d.get("version") == "v1alpha1"),
        None,
    )  # fmt: skip
    section = machine.get("systemDiskEncryption") if isinstance(machine, dict) else None
    if section is None:
        return None
    found = {}
    for name in VOLUMES:
        where = f"machine.systemDiskEncryption.{name.lower()}"
        part = section.get(name.lower()) if isinstance(section, dict) else None
        keys = part.get("keys") if isinstance(part, dict) else None
        urls = [
            k["kms"].get("endpoint")
            for k in (keys if isinstance(keys, list) else [])
            if isinstance(k, dict) and isinstance(k.get("kms"), dict)
        ]
        if not urls:
            raise ConfigProblem(f"{name}: {where} has no kms key")
        found[name] = endpointOf(f"{name}: {where}", str(urls[0]), enrollment)
    return found


def endpointOf(where: str, url: str, enrollment: str) -> Endpoint:
    """C{url} as C{https://ENROLLMENT:PORT}, or L{ConfigProblem}."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme != "https"
        or parts.hostname != enrollment
        or port is None
        or parts.path not in ("", "/")
    ):
        raise ConfigProblem(f"{where}: {url!r} is not https://{enrollment}:PORT")
    return Endpoint(url, enrollment, port)
