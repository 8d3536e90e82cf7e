"""
C{fleetd_kube_csr_decisions_total{decision, reason}}: the kubelet client
CSRs fleetd approved or left pending [K2] [K5] [R1].

C{approved} is counted once per CSR, when its record commits with its
journal entry [J1] (on time or late), with the reason the entry names:
C{first} (C{kube.csr-approved}), C{cluster-token}
(C{kube.csr-approved-cluster-token}), C{renewal}
(C{kube.csr-renewal-approved}), and C{first-after-retirement} or
C{renewal-after-retirement} (C{kube.csr-approved-after-retirement}).
C{left-pending} is counted with each C{kube.csr-left-pending} entry (once
per CSR and reason per hour, L{fleetd.kube.pending}), with its reason:
the verdict's (L{fleetd.kube.verdicts}), the shape's
(L{fleetd.kube.csr.shapeRefusal}) or the approver's own. Every reason is
a fixed word of fleetd's (a renewal's names a device status), never a
CSR's, node's or requester's name.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

APPROVED = "approved"
LEFT_PENDING = "left-pending"

FIRST = "first"
GRANTED = "cluster-token"
RENEWAL = "renewal"
FIRST_AFTER_RETIREMENT = "first-after-retirement"
RENEWAL_AFTER_RETIREMENT = "renewal-after-retirement"
APPROVALS = (
    FIRST,
    GRANTED,
    RENEWAL,
    FIRST_AFTER_RETIREMENT,
    RENEWAL_AFTER_RETIREMENT,
)


class CSRDecisions:
    """The counter of CSR decisions; every approval reason created at 0."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._counter = Counter(
            "fleetd_kube_csr_decisions_total",
            "Kubelet client CSRs approved (counted when recorded) or left"
            " pending (counted when journaled), by reason.",
            ["decision", "reason"],
            registry=registry,
        )
        for reason in APPROVALS:
            self._counter.labels(APPROVED, reason)

    def approved(self, reason: str) -> None:
        self._counter.labels(APPROVED, reason).inc()

    def leftPending(self, reason: str) -> None:
        self._counter.labels(LEFT_PENDING, reason).inc()
