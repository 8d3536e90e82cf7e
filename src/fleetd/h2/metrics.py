"""
What the HTTP/2 proxy counts, declared here as it needs it.

The mechanics count through L{IProxyMetrics}; the listener that uses them
supplies the counters (and their names), with the bounded C{method} label
it knows its calls by.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import Counter


class IProxyMetrics(Protocol):
    """The proxy's counters.

    @ivar active: calls proxied now.
    @ivar bytesUpstream: counts message bytes sent on to the upstream.
    @ivar bytesDownstream: counts message bytes sent back to the client.
    @ivar upstreamErrors: upstream connection problems, by reason:
        C{connect}, C{lost}, C{goaway}, C{protocol}.
    """

    active: int
    bytesUpstream: Counter
    bytesDownstream: Counter
    upstreamErrors: Counter

    def methodLabel(self, path: str) -> str:
        """The bounded C{method} label of a request path."""

    def rpcDone(self, method: str, code: str) -> None:
        """One call ended with gRPC status C{code} (or C{reset})."""

    def abuse(self, kind: str) -> None:
        """Count one kind of client abuse (L{fleetd.h2.calm})."""
