"""
A run's files in the vault, and the served mark's contents.

Each run keeps three files, named after its id: the configuration
(C{.yaml}), the code handed to the node (C{.code}) and, once a delivery
began, the served mark (C{.served}) [C1].
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring_ascii as _string

from fleetd.inventory.model import ServedRecord
from fleetd.vault import IVault

RUN_FILE = re.compile(r"^(r-[0-9a-f]{16})\.(yaml|served|code)$")


def configName(run: str) -> str:
    return f"{run}.yaml"


def servedName(run: str) -> str:
    return f"{run}.served"


def codeName(run: str) -> str:
    """The run's code, kept beside its configuration for the install plan."""
    return f"{run}.code"


def servedJSON(served: ServedRecord) -> bytes:
    """
    The served mark's contents: C{json.dumps} of run, device, served_at and
    peer, written out directly (this runs once per delivery, on the
    reactor thread). C{served_at} comes from the clock: a finite float,
    which JSON writes as C{repr} does.
    """
    return (
        f'{{"run": {_string(served.run)}, "device": {_string(served.device)}, '
        f'"served_at": {served.served_at!r}, "peer": {_string(served.peer)}}}'
    ).encode("ascii")


def readServed(vault: IVault, run: str) -> ServedRecord | None:
    """The served record a mark in the vault holds, if it is readable."""
    raw = vault.get(servedName(run))
    try:
        doc = json.loads(raw) if raw else None
        if not isinstance(doc, dict):
            return None
        return ServedRecord(
            run=run,
            device=str(doc["device"]),
            served_at=float(doc["served_at"]),
            peer=str(doc.get("peer", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None
