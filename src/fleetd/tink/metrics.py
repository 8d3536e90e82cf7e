"""The tink proxy's Prometheus metrics (issue 10, item 4): the
L{fleetd.h2.metrics.IProxyMetrics} of its HTTP/2 mechanics, and what the
observer counts.

Label values are bounded: methods outside the Tinkerbell services count as
C{other}, gRPC statuses are the 17 codes plus C{reset} (no status: the
stream was reset), so no client can grow the series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

KNOWN_METHODS = frozenset(
    {
        "/proto.WorkflowService/GetWorkflowContexts",
        "/proto.WorkflowService/GetWorkflowActions",
        "/proto.WorkflowService/ReportActionStatus",
        "/proto.WorkflowService/GetAction",
    }
)


ABUSE_KINDS = (
    "reset",
    "refused",
    "incomplete",
    "source",
    "stream-budget",
    "control-frames",
    "frame-budget",
    "header-block",
    "header-timeout",
    "window-held",
    "window-timeout",
    "unread",
    "paused",
    "penalty",
)


def methodLabel(path: str) -> str:
    """The C{method} label for a request path."""
    return path if path in KNOWN_METHODS else "other"


class TinkMetrics:
    """Counters and gauges of the proxy, on C{registry} (or none, in tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.rpcs = Counter(
            "fleetd_tink_rpcs_total",
            "Calls proxied to tink-server, by method and gRPC status.",
            ["method", "code"],
            registry=registry,
        )
        self.upstreamErrors = Counter(
            "fleetd_tink_upstream_errors_total",
            "Upstream connection problems: connect (unreachable), lost"
            " (with streams in flight), goaway, protocol.",
            ["reason"],
            registry=registry,
        )
        for reason in ("connect", "lost", "goaway", "protocol"):
            self.upstreamErrors.labels(reason)
        self.activeStreams = Gauge(
            "fleetd_tink_active_streams",
            "Proxied streams open now.",
            registry=registry,
        )
        # Counted in a plain int and read when scraped: a locked inc() and
        # dec() per call cost more than the gauge is worth.
        self.active = 0
        self.activeStreams.set_function(lambda: self.active)
        self.bytes = Counter(
            "fleetd_tink_bytes_total",
            "Message bytes forwarded: upstream (client to tink-server) and"
            " downstream (tink-server to client).",
            ["direction"],
            registry=registry,
        )
        # Children resolved once: labels() costs more than inc() per call.
        self.bytesUpstream = self.bytes.labels("upstream")
        self.bytesDownstream = self.bytes.labels("downstream")
        self._rpcChildren: dict[tuple[str, str], Any] = {}
        self.decodeFailures = Counter(
            "fleetd_tink_decode_failures_total",
            "Tinkerbell messages that could not be decoded (forwarded unchanged).",
            ["method"],
            registry=registry,
        )
        self.undecoded = Counter(
            "fleetd_tink_messages_undecoded_total",
            "Tinkerbell messages passed through without decoding: compressed,"
            " or larger than the observation limit.",
            ["reason"],
            registry=registry,
        )

        self.h2Abuse = Counter(
            "fleetd_tink_h2_abuse_total",
            "HTTP/2 client abuse on the tink listener: wasted streams (reset,"
            " refused, incomplete), streams over the source's rate (source),"
            " connections closed with ENHANCE_YOUR_CALM (stream-budget,"
            " control-frames, frame-budget, header-block, header-timeout,"
            " window-held, window-timeout) or for unread replies (unread),"
            " sources kept"
            " away after such a close (penalty), and reading paused while"
            " replies were unread (paused).",
            ["kind"],
            registry=registry,
        )
        for kind in ABUSE_KINDS:
            self.h2Abuse.labels(kind)
        self._abuseChildren = {k: self.h2Abuse.labels(k) for k in ABUSE_KINDS}

    methodLabel = staticmethod(methodLabel)

    def abuse(self, kind: str) -> None:
        """Count one L{ABUSE_KINDS} event."""
        self._abuseChildren[kind].inc()

    def rpcDone(self, method: str, code: str) -> None:
        """Count one call (both labels bounded, see the module docstring)."""
        child = self._rpcChildren.get((method, code))
        if child is None:
            child = self._rpcChildren[method, code] = self.rpcs.labels(method, code)
        child.inc()
