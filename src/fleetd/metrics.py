"""
fleetd's own Prometheus registry (the admin listener serves it).

Nothing is registered on prometheus_client's global registry, so tests can
build as many daemons as they like in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Info
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector


def makeRegistry(version: str, site: str) -> CollectorRegistry:
    """A registry with process, platform and GC metrics and fleetd's info."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Info("fleetd", "fleetd build and site", registry=registry).info(
        {"version": version, "site": site}
    )
    return registry


def listenerGauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge]:
    """Open connections per listener (read when scraped) and their limits."""
    return (
        Gauge(
            "fleetd_listener_open_connections",
            "Open connections per listener.",
            ["listener"],
            registry=registry,
        ),
        Gauge(
            "fleetd_listener_max_connections",
            "Connection limit per listener (limits.max_connections).",
            ["listener"],
            registry=registry,
        ),
    )
