"""
Why the KMS refuses a Seal or Unseal [E1] [E2], and how it counts them.

Each refusal is a L{fleetd.refused.Refused} with one of the reason codes
below; the kms listener answers it with a gRPC status (L{STATUS}, the
code's name from grpc's C{doc/statuscodes.md}) whose message starts with
the code, never with bytes that look like a passphrase. The reasons are a
closed set, so C{fleetd_kms_refusals_total{reason}} has a bounded number
of series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetd.refused import BUSY, MALFORMED

STARTING = "starting"  # the start-up sweep of destroyed devices' keys runs
UNKNOWN_NODE = "unknown-node"  # no inventory device has this uuid
RETIRED = "retired"  # the device is decommissioning [R1]
WRONG_ADDRESS = "wrong-address"  # not from the node's own address
NO_ADDRESS = "no-address"  # no delivery and no inventory address to compare
NOT_APPROVED = "ek-binding-not-approved"  # [T1] no approved EK binding
UNKNOWN_KEY = "unknown-key"  # the blob names a key fleetd never made for it
KEY_DESTROYED = "key-destroyed"  # [E3] retired, superseded or swept
BLOB_REJECTED = "blob-rejected"  # [E2] the blob does not open: changed bytes

# The gRPC status of each reason (names of grpc's status codes).
STATUS: dict[str, str] = {
    MALFORMED: "INVALID_ARGUMENT",
    BUSY: "UNAVAILABLE",
    STARTING: "UNAVAILABLE",
    UNKNOWN_NODE: "NOT_FOUND",
    RETIRED: "PERMISSION_DENIED",
    WRONG_ADDRESS: "PERMISSION_DENIED",
    NO_ADDRESS: "FAILED_PRECONDITION",
    NOT_APPROVED: "FAILED_PRECONDITION",
    UNKNOWN_KEY: "NOT_FOUND",
    KEY_DESTROYED: "PERMISSION_DENIED",
    BLOB_REJECTED: "INVALID_ARGUMENT",
}
REASONS = tuple(STATUS)

SEAL, UNSEAL = "seal", "unseal"
# A device's disk key as fleetctl status says it (fleetd.kms.store.keyState).
NONE, SEALED, DESTROYED = "none", "sealed", "destroyed"


class KMSMetrics:
    """What C{/metrics} shows of the KMS (or nothing, without a registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.refusals = Counter(
            "fleetd_kms_refusals_total",
            "Seal and Unseal calls refused, by reason [E1].",
            ["reason"],
            registry=registry,
        )
        self.answered = Counter(
            "fleetd_kms_answered_total",
            "Seal and Unseal calls answered with data, by method.",
            ["method"],
            registry=registry,
        )
        self.unlock = Histogram(
            "fleetd_kms_unlock_seconds",
            "Seconds from an Unseal's request to its answer (answered or refused).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.destroyed = Counter(
            "fleetd_kms_keys_destroyed_total",
            "Disk keys destroyed, by why (retired, superseded, swept at start).",
            ["why"],
            registry=registry,
        )
        self.keys = Gauge(
            "fleetd_kms_keys",
            "Devices by the state of their disk key: sealed (a live key) or"
            " destroyed (keys, none live); a device never sealed is not counted.",
            ["state"],
            registry=registry,
        )
        self.unrecorded = Gauge(
            "fleetd_kms_destructions_unrecorded",
            "Disk keys destroyed in the database and not yet appended to the"
            " destruction record (kms.destroyed_keys) [E3].",
            registry=registry,
        )
        self.recordFailures = Counter(
            "fleetd_kms_destruction_record_failures_total",
            "Appends to the destruction record that failed (each is retried).",
            registry=registry,
        )
        for state in (SEALED, DESTROYED):
            self.keys.labels(state)
        for reason in REASONS:
            self.refusals.labels(reason)
        for method in (SEAL, UNSEAL):
            self.answered.labels(method)
