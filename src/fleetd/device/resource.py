"""
The device listener's resource tree [A3].

C{/v1/attest/...}, C{/v1/ldevid/renew} and C{/v1/node/...} come from
L{fleetd.device.attest}; everything else is a one-line 404.
"""

from __future__ import annotations

from twisted.web.resource import Resource

from fleetd.attest.wiring import Attestation
from fleetd.device.attest import deviceAPI
from fleetd.device.disks import NodeDisksResource
from fleetd.device.identity import byLDevID
from fleetd.trust.disks import DiskService
from fleetd.web.resources import Router


def deviceRoot(v1: Resource | None = None) -> Router:
    root = Router()
    if v1 is not None:
        root.putChild(b"v1", v1)
    return root


def deviceFace(attestation: Attestation, disks: DiskService) -> Router:
    """
    The device listener's tree: attestation, LDevID renewal, the lookups
    and, under C{/v1/node/}, the disk report; who calls is decided by the
    LDevID identification [T4].
    """
    identify, lookups = attestation.identify, attestation.lookups
    node = {b"disks": NodeDisksResource(disks, byLDevID(identify), admit=lookups.admit)}
    return deviceRoot(deviceAPI(attestation.service, identify, lookups, node))
