"""
Counters for the DNS responder, kept as plain integers and read by
Prometheus at scrape time.

C{fleetd_dns_queries_total{qtype,rcode,transport}} counts replies sent;
C{fleetd_dns_malformed_total{transport}} counts packets that were not
well-formed queries (shorter than a header, a response, or FORMERR).
C{fleetd_dns_rate_limited_total{action,kind}} counts UDP responses that
response-rate limiting dropped or slipped (sent truncated), by kind (the
enrollment name's C{answer}, or C{other});
C{fleetd_dns_tcp_refused_total{reason}} counts TCP connections refused at
the per-source (C{source}) or the total (C{total}) cap.
Label values are bounded: qtype by L{fleetd.dns.wire.QTYPE_LABELS}.

A flood makes these the hottest counters in fleetd, so they are not
prometheus_client children (a lock and a method chain per increment, about
0.8 µs) but integers in dicts, bumped on the reactor thread and turned into
metric families by L{DNSMetrics.collect} when scraped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from fleetd.dns.ratelimit import DROP, SLIP
from fleetd.dns.wire import Reply

_ACTIONS = {DROP: "dropped", SLIP: "slipped"}
K = TypeVar("K")


class Tally:
    """One counter value: C{inc()} adds one."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


def tally(family: dict[K, Tally], key: K) -> Tally:
    """The counter of C{family} for C{key}, created at zero when new."""
    found = family.get(key)
    if found is None:
        found = family[key] = Tally()
    return found


class DNSMetrics:
    """The responder's counters, collected by C{registry}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queries: dict[tuple[str, str, str], Tally] = {}
        self.malformed: dict[str, Tally] = {}
        self.limited: dict[tuple[str, str], Tally] = {}
        self.tcpRefused: dict[str, Tally] = {}
        registry.register(self)

    def forTransport(self, transport: str) -> TransportMetrics:
        """Counters bound to C{transport} (C{udp} or C{tcp})."""
        return TransportMetrics(self, transport)

    def describe(self) -> list[CounterMetricFamily]:
        return list(self._families(samples=False))

    def collect(self) -> Iterator[CounterMetricFamily]:
        return self._families(samples=True)

    def _families(self, samples: bool) -> Iterator[CounterMetricFamily]:
        queries = CounterMetricFamily(
            "fleetd_dns_queries",
            "DNS replies sent, by question type, response code and transport.",
            labels=["qtype", "rcode", "transport"],
        )
        malformed = CounterMetricFamily(
            "fleetd_dns_malformed",
            "DNS packets that were not well-formed queries.",
            labels=["transport"],
        )
        limited = CounterMetricFamily(
            "fleetd_dns_rate_limited",
            "DNS responses over UDP that rate limiting dropped or sent truncated.",
            labels=["action", "kind"],
        )
        refused = CounterMetricFamily(
            "fleetd_dns_tcp_refused",
            "DNS TCP connections refused at a cap (per source or in total).",
            labels=["reason"],
        )
        if samples:
            for (qtype, rcode, transport), n in sorted(self.queries.items()):
                queries.add_metric([qtype, rcode, transport], n.value)
            for transport, n in sorted(self.malformed.items()):
                malformed.add_metric([transport], n.value)
            for (action, kind), n in sorted(self.limited.items()):
                limited.add_metric([action, kind], n.value)
            for reason, n in sorted(self.tcpRefused.items()):
                refused.add_metric([reason], n.value)
        yield from (queries, malformed, limited, refused)


class TransportMetrics:
    """
    The counters of one transport.

    C{fastAnswer} is the fast path's counter (an A query answered NOERROR).
    """

    def __init__(self, metrics: DNSMetrics, transport: str) -> None:
        self._metrics = metrics
        self._transport = transport
        self._queries: dict[tuple[str, str], Tally] = {}
        self.fastAnswer = self._child("A", "NOERROR")
        self._malformed = tally(metrics.malformed, transport)

    def _child(self, qtype: str, rcode: str) -> Tally:
        found = tally(self._metrics.queries, (qtype, rcode, self._transport))
        self._queries[qtype, rcode] = found
        return found

    def countLimited(self, verdict: int, answer: bool) -> None:
        """Count a response that rate limiting dropped or slipped."""
        key = (_ACTIONS[verdict], "answer" if answer else "other")
        tally(self._metrics.limited, key).value += 1

    def countRefused(self, reason: str) -> None:
        """Count a TCP connection refused at the C{source} or C{total} cap."""
        tally(self._metrics.tcpRefused, reason).value += 1

    def countMalformed(self) -> None:
        """Count a packet that got no reply because it was malformed."""
        self._malformed.value += 1

    def count(self, reply: Reply) -> None:
        """Count C{reply} from the general or the cheap path."""
        wire, qtype, rcode, malformed = reply
        if malformed:
            self._malformed.value += 1
        if wire is not None:
            found = self._queries.get((qtype, rcode))
            if found is None:
                found = self._child(qtype, rcode)
            found.value += 1
