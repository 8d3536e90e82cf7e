"""
Alert series for lost and consumed configurations [V4] [C2].

"While requests continue": a device's series is 1 while its last such
request is younger than C{hold} seconds (on the injected clock), then 0.
A new provision of the device removes its series [V5] [C3].
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from twisted.internet.interfaces import IReactorTime

MISSING = "missing"
REFETCHED = "refetched"

_HELP = {
    MISSING: (
        "fleetd_install_config_missing",
        "1 while a node keeps asking for a configuration fleetd issued but lost.",
    ),
    REFETCHED: (
        "fleetd_install_config_refetched",
        "1 while a node keeps asking for a configuration already delivered.",
    ),
}


class AlertTracker(Collector):
    """Remember the last request of each kind per device; expose gauges."""

    def __init__(self, clock: IReactorTime, hold: float = 900.0) -> None:
        self._clock = clock
        self.hold = hold
        self._last: dict[str, dict[str, float]] = {kind: {} for kind in _HELP}

    def note(self, kind: str, device: str) -> None:
        self._last[kind][device] = self._clock.seconds()

    def clear(self, device: str) -> None:
        for last in self._last.values():
            last.pop(device, None)

    def active(self, kind: str, device: str) -> bool:
        at = self._last[kind].get(device)
        return at is not None and self._clock.seconds() - at < self.hold

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for kind, (name, text) in _HELP.items():
            family = GaugeMetricFamily(name, text, labels=["device"])
            for device in sorted(self._last[kind]):
                family.add_metric([device], 1.0 if self.active(kind, device) else 0.0)
            yield family

    def register(self, registry: CollectorRegistry) -> AlertTracker:
        registry.register(self)
        return self
