"""
Which device a refused attestation concerns, when no approved binding
says so (issue 27, item 4).

An approved binding names its device, and a refusal after it is journaled
under that device as it always was. Before that, what fleetd has is the
node's claim: the serial and uuid it reports, and the EK it presents,
whose evidence or binding (in whatever state) names serials. Where one of
them maps to a device fleetd knows (L{KnownDevices}: the inventory's
devices as the run registry indexes them, never a lookup of the inventory
per refusal, which would let anyone make fleetd ask NetBox), the refusal
names it, so that C{fleetctl journal --device}, C{fleetctl status}, the
device page and the fleet view show it. The entry then says how
(C{named_by}): a claim is not proof, anyone can send one.

In order: the reported serial when the EK's evidence names it too
(C{ek-evidence}); the reported serial alone (C{reported-serial}); the
reported uuid (C{reported-uuid}); the one serial the EK's evidence names
(C{ek-evidence}: a TPM presented under another serial).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Protocol

BY_EK = "ek-evidence"
BY_SERIAL = "reported-serial"
BY_UUID = "reported-uuid"
# A claim's values are the caller's text: looked up, never at any length.
CLAIM_MAX = 64


class KnownDevices(Protocol):
    """The devices fleetd knows, by serial and by uuid (the run registry)."""

    def deviceBySerial(self, serial: str) -> str | None:
        "The device whose chassis serial (any case) this is, if any."

    def deviceByUUID(self, uuid: str) -> str | None:
        "The device whose SMBIOS uuid (any case) this is, if any."


class SerialsForEK(Protocol):
    """The serials an EK digest's binding or evidence names (L{fleetd.trust})."""

    def __call__(self, db: sqlite3.Connection, ekSha256: str) -> list[str]: ...


def noSerials(db: sqlite3.Connection, ekSha256: str) -> list[str]:
    """When no evidence store is wired: no serial."""
    return []


def _text(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return value[:CLAIM_MAX]


@dataclass
class Claim:
    """
    What a node claimed in one request, filled in as the request is read:
    the serial and uuid it reports and the serials its EK's evidence names.
    """

    serial: str | None = None
    uuid: str | None = None
    ekSerials: list[str] = field(default_factory=list)

    def reported(self, serial: object, uuid: object) -> None:
        """The serial and uuid of a request body (any JSON value)."""
        self.serial, self.uuid = _text(serial), _text(uuid)

    def device(self, known: KnownDevices) -> tuple[str, str] | None:
        """The device this claim maps to and how (C{named_by}), if any."""
        serial = self.serial
        evidenced = {s.casefold(): s for s in self.ekSerials}
        if serial is not None and serial.casefold() in evidenced:
            found = known.deviceBySerial(serial)
            if found is not None:
                return found, BY_EK
        if serial is not None:
            found = known.deviceBySerial(serial)
            if found is not None:
                return found, BY_SERIAL
        if self.uuid is not None:
            found = known.deviceByUUID(self.uuid)
            if found is not None:
                return found, BY_UUID
        if len(evidenced) == 1:
            found = known.deviceBySerial(next(iter(evidenced.values())))
            if found is not None:
                return found, BY_EK
        return None
