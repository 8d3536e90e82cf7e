"""
Counters for the DNS responder, with label children resolved ahead of time.

C{fleetd_dns_queries_total{qtype,rcode,transport}} counts replies sent;
C{fleetd_dns_malformed_total{transport}} counts packets that were not
well-formed queries (shorter than a header, a response, or FORMERR).
Label values are bounded: qtype by L{fleetd.dns.responder.QTYPE_LABELS}.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from fleetd.dns.responder import Reply


class DNSMetrics:
    """The responder's counters on C{registry}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queries = Counter(
            "fleetd_dns_queries",
            "DNS replies sent, by question type, response code and transport.",
            ["qtype", "rcode", "transport"],
            registry=registry,
        )
        self.malformed = Counter(
            "fleetd_dns_malformed",
            "DNS packets that were not well-formed queries.",
            ["transport"],
            registry=registry,
        )

    def forTransport(self, transport: str) -> TransportMetrics:
        """Counters bound to C{transport} (C{udp} or C{tcp})."""
        return TransportMetrics(self, transport)


class TransportMetrics:
    """
    The counters of one transport.

    C{fastAnswer} is the pre-resolved child for the fast path's reply (an
    A query answered NOERROR); other children are resolved once and cached.
    """

    def __init__(self, metrics: DNSMetrics, transport: str) -> None:
        self._metrics = metrics
        self._transport = transport
        self._children: dict[tuple[str, str], Any] = {}
        self.fastAnswer = self._child("A", "NOERROR")
        self._malformed = metrics.malformed.labels(transport=transport)

    def _child(self, qtype: str, rcode: str) -> Any:
        child = self._children.get((qtype, rcode))
        if child is None:
            child = self._metrics.queries.labels(
                qtype=qtype, rcode=rcode, transport=self._transport
            )
            self._children[qtype, rcode] = child
        return child

    def countMalformed(self) -> None:
        """Count a packet that got no reply because it was malformed."""
        self._malformed.inc()

    def count(self, reply: Reply) -> None:
        """Count C{reply} from the general path."""
        if reply.malformed:
            self._malformed.inc()
        if reply.wire is not None:
            self._child(reply.qtype, reply.rcode).inc()
