"""
Counters for the DNS responder, with label children resolved ahead of time.

C{fleetd_dns_queries_total{qtype,rcode,transport}} counts replies sent;
C{fleetd_dns_malformed_total{transport}} counts packets that were not
well-formed queries (shorter than a header, a response, or FORMERR).
C{fleetd_dns_rate_limited_total{action,kind}} counts UDP responses that
response-rate limiting dropped or slipped (sent truncated), by kind (the
enrollment name's C{answer}, or C{other}); C{fleetd_dns_tcp_refused_total{reason}}
counts TCP connections refused at the per-source or the total cap.
Label values are bounded: qtype by L{fleetd.dns.responder.QTYPE_LABELS}.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from fleetd.dns.ratelimit import DROP, SLIP
from fleetd.dns.wire import Reply


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
        self.rateLimited = Counter(
            "fleetd_dns_rate_limited",
            "DNS responses over UDP that rate limiting dropped or sent truncated.",
            ["action", "kind"],
            registry=registry,
        )
        self.tcpRefused = Counter(
            "fleetd_dns_tcp_refused",
            "DNS TCP connections refused at a cap (per source or in total).",
            ["reason"],
            registry=registry,
        )
        self.limited = {
            (verdict, answer): self.rateLimited.labels(
                action=action, kind="answer" if answer else "other"
            )
            for verdict, action in ((DROP, "dropped"), (SLIP, "slipped"))
            for answer in (True, False)
        }

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

    def countLimited(self, verdict: int, answer: bool) -> None:
        """Count a response that rate limiting dropped or slipped."""
        self._metrics.limited[verdict, answer].inc()

    def countRefused(self, reason: str) -> None:
        """Count a TCP connection refused at the C{source} or C{total} cap."""
        self._metrics.tcpRefused.labels(reason=reason).inc()

    def countMalformed(self) -> None:
        """Count a packet that got no reply because it was malformed."""
        self._malformed.inc()

    def count(self, reply: Reply) -> None:
        """Count C{reply} from the general path."""
        if reply.malformed:
            self._malformed.inc()
        if reply.wire is not None:
            self._child(reply.qtype, reply.rcode).inc()
