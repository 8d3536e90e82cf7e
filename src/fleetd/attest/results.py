"""
C{fleetd_attest_results_total{result}}: every outcome of the device
listener's attestation side [T3] [T4].

C{accepted}: an LDevID issued on a TPM attestation; C{renewed}: one
issued on a renewal; else the refusal's reason code (L{fleetd.nodes}),
counted for every refusal, the ones the throttled journal leaves out
(C{not_journaled}, L{fleetd.attest.throttle}) included. The label values
are that closed set (a code outside it counts as C{other}), never a
device, serial or anything a caller sends.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from fleetd.nodes import REASONS

ACCEPTED = "accepted"
RENEWED = "renewed"
OTHER = "other"


class AttestResults:
    """The counter of attestation outcomes, every label value created at 0."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        counter = Counter(
            "fleetd_attest_results_total",
            "Attestation outcomes: accepted, renewed, or the refusal's reason"
            " code (every refusal, journaled or not).",
            ["result"],
            registry=registry,
        )
        self._children = {
            result: counter.labels(result)
            for result in sorted(REASONS | {ACCEPTED, RENEWED, OTHER})
        }

    def accepted(self) -> None:
        self._children[ACCEPTED].inc()

    def renewed(self) -> None:
        self._children[RENEWED].inc()

    def refused(self, reason: str) -> None:
        self._children.get(reason, self._children[OTHER]).inc()
