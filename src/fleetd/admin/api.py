"""
The owner API, C{/v1/admin/...}: one child per subsystem, all of them
behind the owner gate of L{fleetd.admin.resource.adminRoot}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.web.resource import Resource

from fleetd.admin.backup import BackupResource
from fleetd.admin.deviceflow import deviceFlowAdminResource
from fleetd.admin.devices import Offload, devicesResource
from fleetd.admin.kube import clusterTokenResource, retireResource
from fleetd.admin.provision import ProvisionEndpoint
from fleetd.admin.status import StatusResource
from fleetd.admin.trust import BindingsResource, DisksAdminResource, EvidenceResource
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.fleet.provision import Provisioner
from fleetd.fleet.retire import RetireService
from fleetd.fleet.status import StatusService
from fleetd.inventory.defined import SiteDefinitions
from fleetd.inventory.model import IInventory
from fleetd.kube.service import KubeService
from fleetd.store.journal import AsyncJournal
from fleetd.trust.disks import DiskService
from fleetd.trust.service import TrustService


def ownerAPI(
    *,
    inventory: IInventory,
    journal: AsyncJournal,
    offload: Offload[Any],
    defined: SiteDefinitions | None,
    provisioner: Provisioner,
    trust: TrustService,
    disks: DiskService,
    status: StatusService,
    deviceFlow: DeviceFlow,
    retire: RetireService,
    kube: KubeService | None,
    database: Path | None = None,
) -> dict[bytes, Resource]:
    """
    The children of C{/v1/admin/}. Without C{[kubernetes]} (C{kube} is
    L{None}) the cluster-token commands refuse (and C{provisioner}'s runs
    carry the template's own cluster token).

    @param offload: runs blocking work (CSV import, evidence, the
        backup's copy) in a thread.
    @param defined: what an added device may name (L{devicesResource}).
    @param database: the database file C{fleetctl backup} copies; L{None}:
        no C{backup} child.
    """
    children: dict[bytes, Resource] = {}
    if database is not None:
        children[b"backup"] = BackupResource(database, journal, offload)
    return children | {
        b"devices": devicesResource(
            inventory, journal, offload=offload, defined=defined
        ),
        b"cluster-token": clusterTokenResource(None if kube is None else kube.cluster),
        b"retire": retireResource(retire),
        b"provision": ProvisionEndpoint(provisioner),
        b"evidence": EvidenceResource(trust, offload),
        b"bindings": BindingsResource(trust),
        b"disks": DisksAdminResource(disks),
        b"status": StatusResource(status),
        b"device-flow": deviceFlowAdminResource(deviceFlow),
    }
