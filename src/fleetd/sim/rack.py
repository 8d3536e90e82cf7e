"""
What the nodes of a rack share (L{Rack}), and the vocabulary of a node's
path (L{fleetd.sim.node}): its steps and how one ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from twisted.internet.interfaces import IReactorTime

from fleetd.sim.daemon import Fleetd, Started
from fleetd.sim.pause import Pause
from fleetd.sim.tpm import SessionBus
from fleetd.testing.kube import FakeKube
from fleetd.testing.netbox import FakeNetBox
from fleetd.testing.tinkserver import Workflows


@dataclass(frozen=True)
class Step:
    """
    One step of a node's path: C{run} timed as C{phase} (L{None}: not
    timed as a whole, as the workflow, which times its own actions).
    """

    phase: str | None
    run: Callable[[], Awaitable[None]]


class Refused(Exception):
    """fleetd refused a step; C{reason} is its code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StepFailed(Exception):
    """A step failed for another reason than a refusal (one line)."""


@dataclass(frozen=True)
class Cluster:
    """The Kubernetes fake's TLS port and the CA its certificate is from;
    the fake itself, for what a kubelet holds without asking fleetd (its
    client certificate's identity) and for faults' checks of the fake."""

    port: int
    ca: Path
    fake: FakeKube | None = None


@dataclass
class Rack:
    """What every node of a rack shares."""

    fleetd: Fleetd
    work: Path
    bus: SessionBus
    tink: Workflows
    clock: IReactorTime
    timeScale: float
    started: Started
    cluster: Cluster | None
    changed: Callable[[], None]
    # Held by each node on its way (fleetd.sim.command); a spore reboot waits
    # until it is alone (fleetd.sim.faults.boot).
    pause: Pause = field(default_factory=Pause)
    fetch: str = "code"  # how Talos fetches its configuration: or "device-flow"
    netbox: FakeNetBox | None = None  # NetBox is the inventory (--inventory)
    # fleetd makes the Workflows ([tinkerbell]) in the cluster's fake.
    workflows: bool = False
    # STATE and EPHEMERAL encrypted with fleetd as the KMS (fleetd.sim.luks).
    diskEncryption: bool = False
