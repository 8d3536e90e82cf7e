"""
The attestation side of the device listener, assembled [T1] [T4] [D1].

C{approvedSerialFor} and C{bindingRefusal} (approved EK bindings and why
one is missing) and C{serialsForEK} (the serials an EK's evidence names,
to name a refusal's device) come from L{fleetd.trust.bindings}; C{targetDiskFor} and
C{diskRefusal} (the disk check's target and why there is none) from
L{fleetd.trust.disks}. Imported directly: a missing function is an
import error at start, never a silent "nothing approved".
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from twisted.internet.interfaces import IReactorTime

from fleetd.attest.ekroots import EKRoots
from fleetd.attest.identity import LDevIDBook, LDevIDIdentifier
from fleetd.attest.lookup import LookupService, ReadyRuns
from fleetd.attest.naming import KnownDevices
from fleetd.attest.service import AttestationService
from fleetd.inventory.model import IInventory
from fleetd.pki.ldevid import Issuer, TrustBundle
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner
from fleetd.trust.bindings import approvedSerialFor, bindingRefusal, serialsForEK
from fleetd.trust.disks import diskRefusal, targetDiskFor
from fleetd.vault import IVault


@dataclass(frozen=True)
class Attestation:
    """What the device listener serves attestation, LDevIDs and lookups with."""

    ldevids: LDevIDBook
    service: AttestationService
    identify: LDevIDIdentifier
    lookups: LookupService


def buildAttestation(
    *,
    clock: IReactorTime,
    runner: IRunner,
    journal: AsyncJournal,
    database: Database,
    inventory: IInventory,
    runs: ReadyRuns,
    vault: IVault,
    ekRoots: EKRoots,
    issuer: Issuer,
    trustBundle: TrustBundle,
    challengeTTL: float,
    metrics: CollectorRegistry | None = None,
    known: KnownDevices | None = None,
) -> Attestation:
    """Attestation, LDevID issuance and the node lookups, from what
    L{fleetd.prepare.prepare} read; the LDevID book is loaded from
    C{database} here, before any listener answers. C{known}: the devices
    a refusal may be named after by the node's claim (the run registry)."""
    ldevids = LDevIDBook()
    ldevids.load(database)
    service = AttestationService(
        clock=clock,
        runner=runner,
        journal=journal,
        ekRoots=ekRoots,
        issuer=issuer,
        book=ldevids,
        approvedSerialFor=approvedSerialFor,
        deviceBySerial=inventory.bySerial,
        challengeTTL=challengeTTL,
        bindingRefusal=bindingRefusal,
        metrics=metrics,
        known=known,
        serialsForEK=serialsForEK,
    )
    lookups = LookupService(
        runner=runner,
        attestation=service,
        book=ldevids,
        getDevice=inventory.get,
        runs=runs,
        vault=vault,
        targetDiskFor=targetDiskFor,
        diskRefusal=diskRefusal,
    )
    identify = LDevIDIdentifier(trustBundle, ldevids)
    return Attestation(ldevids, service, identify, lookups)


__all__ = [
    "Attestation",
    "approvedSerialFor",
    "bindingRefusal",
    "buildAttestation",
    "diskRefusal",
    "serialsForEK",
    "targetDiskFor",
]
