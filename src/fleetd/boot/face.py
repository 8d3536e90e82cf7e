"""
The boot listener's face, assembled: C{GET /config} behind the failure
limiter [B2] and the device flow's code and token endpoints [F1].
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import Resource

from fleetd.boot.config import ConfigResource
from fleetd.boot.deviceflow_resource import deviceCodeResource, tokenResource
from fleetd.boot.resource import bootRoot
from fleetd.config import BootLimits
from fleetd.deviceflow.flow import DeviceFlow
from fleetd.ratelimit import RateLimiter
from fleetd.runs.registry import RunRegistry


@dataclass(frozen=True)
class BootFace:
    """The boot listener's tree and the C{/config} resource, whose
    hand-overs in flight stop with the listener."""

    root: Resource
    config: ConfigResource


def bootFace(
    runs: RunRegistry,
    flow: DeviceFlow,
    *,
    clock: IReactorTime,
    metrics: CollectorRegistry,
    limits: BootLimits,
) -> BootFace:
    """The boot listener's face from C{[boot_limits]}."""
    limiter = RateLimiter(
        clock,
        rate=limits.failure_rate,
        burst=limits.failure_burst,
        globalRate=limits.global_failure_rate,
        globalBurst=limits.global_failure_burst,
    )
    config = ConfigResource(
        runs, clock=clock, metrics=metrics, limiter=limiter, grants=flow
    )
    root = bootRoot(
        config=config,
        deviceCode=deviceCodeResource(flow),
        token=tokenResource(flow),
    )
    return BootFace(root, config)
