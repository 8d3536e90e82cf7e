"""
The machine-trust lookups attestation and the plan depend on.

C{fleetd.trust.bindings.approvedSerialFor} (approved EK bindings [T1]) and
C{fleetd.trust.disks.targetDiskFor} (the disk check's target [D1]) come
from the evidence/disk-identity work. Until that code is present, no
binding is approved (every attestation is refused with
C{ek-binding-not-approved}) and no target disk is known: the safe answers.
"""

from __future__ import annotations

import sqlite3

try:  # pragma: no cover - depends on which branches are merged
    from fleetd.trust.bindings import approvedSerialFor  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover

    def approvedSerialFor(db: sqlite3.Connection, ekSha256: str) -> str | None:
        """No evidence subsystem: nothing is approved."""
        return None


try:  # pragma: no cover
    from fleetd.trust.disks import targetDiskFor  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover

    def targetDiskFor(db: sqlite3.Connection, device: str) -> str | None:
        """No disk check: no target disk is known."""
        return None


__all__ = ["approvedSerialFor", "targetDiskFor"]
