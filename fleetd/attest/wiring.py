"""
The machine-trust lookups attestation and the plan depend on [T1] [D1].

C{approvedSerialFor} and C{bindingRefusal} (approved EK bindings and why
one is missing) come from L{fleetd.trust.bindings}; C{targetDiskFor} and
C{diskRefusal} (the disk check's target and why there is none) from
L{fleetd.trust.disks}. Imported directly: a missing function is an
import error at start, never a silent "nothing approved".
"""

from __future__ import annotations

from fleetd.trust.bindings import approvedSerialFor, bindingRefusal
from fleetd.trust.disks import diskRefusal, targetDiskFor

__all__ = ["approvedSerialFor", "bindingRefusal", "diskRefusal", "targetDiskFor"]
