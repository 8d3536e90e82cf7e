"""
The approver's transactions [J1]: each takes the database and the
journal's recorder, changes the state and writes its entry together.

The approvals re-check the device inside their own transaction [R1]: a
device retired since the token was issued (or, for a renewal, retired at
all) gets C{kube.csr-approved-after-retirement} (a warning, with the
certificate's notAfter when it is already issued) instead of the normal
entry, keeps C{retired_at} and keeps its status.
"""

from __future__ import annotations

from fleetd.inventory.model import DeviceStatus, IInventory, InventoryError
from fleetd.kube.csr import CSRFacts, notAfter
from fleetd.kube.decisions import (
    FIRST,
    FIRST_AFTER_RETIREMENT,
    RENEWAL,
    RENEWAL_AFTER_RETIREMENT,
)
from fleetd.kube.store import (
    TokenRecord,
    kubelet,
    markApproved,
    markIntent,
    noteKubeletApproved,
    noteKubeletFirst,
)
from fleetd.store.db import Database, StoreError
from fleetd.store.journal import Recorder

# The statuses a first kubelet certificate moves to active [K2]; never
# decommissioning [R1], nor a status an operator set.
TO_ACTIVE = frozenset({DeviceStatus.PLANNED, DeviceStatus.STAGED, DeviceStatus.ACTIVE})


def retiredAt(db: Database, device: str) -> float | None:
    record = kubelet(db, device)
    return None if record is None else record.retired_at


def intentIn(db: Database, journal: Recorder, record: TokenRecord, csr: str) -> None:
    """
    Bind the token to C{csr} before the API is asked to approve it [K2]:
    C{kube.csr-approving}, in a transaction of its own.
    """
    if not markIntent(db, record.id, csr):
        raise StoreError(f"token {record.id} is bound to another CSR")
    journal(
        "kube.csr-approving",
        actor="fleetd",
        device=record.device,
        run=record.run,
        fields={"csr": csr, "bootstrap_id": record.id},
    )


def firstApprovedIn(
    db: Database,
    journal: Recorder,
    *,
    inventory: IInventory,
    record: TokenRecord,
    facts: CSRFacts,
    late: bool,
    now: float,
    deadline: float,
) -> tuple[TokenRecord, str]:
    """
    A first certificate approved with the token C{record}: the token's
    approval and deletion C{deadline} [K4], the kubelet record and the
    move to C{active}, unless the device was retired after the token was
    issued. Returns the token's new record and the approval's reason
    (L{fleetd.kube.decisions}); the in-memory token book is the caller's
    to change, after the commit.
    """
    device = record.device
    assert device is not None
    approved = markApproved(db, record, now, facts.name, deadline)
    retired = retiredAt(db, device)
    if retired is not None and record.created_at <= retired:
        noteKubeletApproved(db, device, facts.name, now)
        afterRetirement(journal, facts, device, late, record.id)
        return approved, FIRST_AFTER_RETIREMENT
    noteKubeletFirst(db, device, facts.name, now)
    # Compare and set in this transaction: a retirement (or an operator's
    # status) committed since is never overwritten.
    try:
        inventory.transitionIn(db, device, TO_ACTIVE, DeviceStatus.ACTIVE)
    except InventoryError as e:
        if e.kind != "not-found":
            raise
    journal(
        "kube.csr-approved",
        actor="fleetd",
        device=device,
        run=record.run,
        fields={
            "csr": facts.name,
            "bootstrap_id": record.id,
            "delete_at": deadline,
            "late": late,
        },
    )
    return approved, FIRST


def renewalApprovedIn(
    db: Database, journal: Recorder, facts: CSRFacts, node: str, late: bool, now: float
) -> str:
    """
    A renewal approved for C{node}; never clears C{retired_at} [R1].
    Returns the approval's reason (L{fleetd.kube.decisions}).
    """
    noteKubeletApproved(db, node, facts.name, now)
    if retiredAt(db, node) is not None:
        afterRetirement(journal, facts, node, late, None)
        return RENEWAL_AFTER_RETIREMENT
    journal(
        "kube.csr-renewal-approved",
        actor="fleetd",
        device=node,
        fields={"csr": facts.name, "late": late},
    )
    return RENEWAL


def afterRetirement(
    journal: Recorder, facts: CSRFacts, device: str, late: bool, tokenId: str | None
) -> None:
    """The API approved C{facts} for a device retired meanwhile [R1]."""
    expiry = None if facts.certificate is None else notAfter(facts.certificate)
    journal(
        "kube.csr-approved-after-retirement",
        actor="fleetd",
        device=device,
        fields={
            "csr": facts.name,
            "kind": "renewal" if tokenId is None else "first",
            "bootstrap_id": tokenId,
            "not_after": expiry,
            "late": late,
            "note": "approved by the API while the device was retired;"
            " Kubernetes cannot revoke the certificate",
        },
    )
