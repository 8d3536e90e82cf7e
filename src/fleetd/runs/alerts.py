"""
Alert series for lost and consumed configurations [V4] [C2] [V6].

"While requests continue": Talos's retry gaps grow to about 68 minutes, so
a device's series is 1 from its first such request until the owner's
recovery provision removes it [V5] [C3], or until no such request has come
for C{hold} seconds (C{provision.alert_hold}, default 7,200 s), then 0.

The times live in the database (C{alerts}, migration 4) so a restart
keeps the series: the registry writes them in the same transaction as the
journal entry of the first request [J1], and afterwards at most once per
L{PERSIST_EVERY} seconds per series (a node that retries every few seconds
costs no write per request; a restart can shorten a hold by that much).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from twisted.internet.interfaces import IReactorTime

from fleetd.config import ProvisionSettings
from fleetd.store.db import Database

MISSING = "missing"
REFETCHED = "refetched"
HOOKOS = "hookos-after-install"  # [B2], written by fleetd.tink.completion
KINDS = (MISSING, REFETCHED, HOOKOS)
DEFAULT_HOLD = ProvisionSettings.alert_hold
PERSIST_EVERY = 60.0

_HELP = {
    MISSING: (
        "fleetd_install_config_missing",
        "1 while a node keeps asking for a configuration fleetd issued but lost.",
    ),
    REFETCHED: (
        "fleetd_install_config_refetched",
        "1 while a node keeps asking for a configuration already delivered.",
    ),
    HOOKOS: (
        "fleetd_node_booted_hookos_after_install",
        "1 while a node whose workflow succeeded keeps coming back to HookOS"
        " with its configuration unread.",
    ),
}


ALERT_NAMES = {
    MISSING: "FleetInstallConfigMissing",
    REFETCHED: "FleetInstallConfigRefetched",
    HOOKOS: "FleetNodeBootedHookOSAfterInstall",
}

ATTESTATION_REFUSED = "FleetAttestationRefused"
# Raised per device from fleetd_tinkerbell_workflows_missing (issue 28).
WORKFLOW_LOST = "FleetTinkerbellWorkflowLost"

# What each alert means, in words, for people (the owner console): the
# summaries of conf/alerts.yml, with the step that resolves it.
ALERT_WORDS = {
    "FleetInstallConfigMissing": (
        "the node asks for a configuration fleetd no longer holds (fleetd's"
        " host rebooted before the node fetched it); provision it again and give"
        " the node the new code"
    ),
    "FleetInstallConfigRefetched": (
        "the node asks again for a configuration already delivered (it"
        " probably lost power before Talos wrote it to STATE); provision it"
        " again"
    ),
    "FleetNodeBootedHookOSAfterInstall": (
        "the node booted back into HookOS after its install instead of its"
        " disk; fix the boot order and power-cycle it"
    ),
    # Raised fleet-wide from fleetd_attest_results_total; the console shows
    # it on the devices whose refusal stands (issue 27, fleetd.fleet.view).
    "FleetAttestationRefused": "its attestation was refused",
    WORKFLOW_LOST: (
        "its Workflow was deleted or changed by someone else before it ran,"
        " and fleetd does not make it again; provision it again once whoever"
        " removed it agrees"
    ),
}


def alertWords(name: str) -> str:
    """The alert called C{name} in words (its name when fleetd has none)."""
    return ALERT_WORDS.get(name, name)


@dataclass
class _Series:
    first: float
    last: float
    stored: float  # the last_at the database holds


def storeAlert(db: Database, device: str, kind: str, at: float) -> None:
    """Record a request of C{kind} from C{device}'s node at C{at}."""
    db.execute(
        "INSERT INTO alerts (device, kind, first_at, last_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (device, kind) DO UPDATE SET last_at = excluded.last_at",
        (device, kind, at, at),
    )


def clearAlerts(db: Database, device: str) -> None:
    """Remove C{device}'s series (a recovery provision)."""
    db.execute("DELETE FROM alerts WHERE device = ?", (device,))


def clearAlert(db: Database, device: str, kind: str) -> None:
    """Remove one of C{device}'s series (its cause was resolved)."""
    db.execute("DELETE FROM alerts WHERE device = ? AND kind = ?", (device, kind))


def loadAlerts(db: Database) -> list[tuple[str, str, float, float]]:
    """Every stored series: (device, kind, first_at, last_at)."""
    rows = db.execute("SELECT device, kind, first_at, last_at FROM alerts").fetchall()
    return [(str(d), str(k), float(f), float(t)) for d, k, f, t in rows]


class AlertTracker(Collector):
    """The alert series in memory, as the database last confirmed them."""

    def __init__(self, clock: IReactorTime, hold: float = DEFAULT_HOLD) -> None:
        self._clock = clock
        self.hold = hold
        self._series: dict[str, dict[str, _Series]] = {kind: {} for kind in KINDS}

    def restore(self, device: str, kind: str, first: float, last: float) -> None:
        """A series read back from the database at start."""
        if kind in self._series:
            self._series[kind][device] = _Series(first, last, last)

    def needsWrite(self, kind: str, device: str) -> bool:
        """Whether a request now should be written to the database."""
        series = self._series[kind].get(device)
        return series is None or self._clock.seconds() - series.stored >= (
            PERSIST_EVERY
        )

    def note(self, kind: str, device: str, *, stored: bool) -> None:
        """A request of C{kind} came now; C{stored} if the database has it."""
        now = self._clock.seconds()
        series = self._series[kind].get(device)
        if series is None:
            self._series[kind][device] = _Series(now, now, now)
            return
        series.last = now
        if stored:
            series.stored = now

    def clear(self, device: str, kind: str | None = None) -> None:
        """Forget C{device}'s series (only C{kind}'s, if given)."""
        for name, series in self._series.items():
            if kind is None or name == kind:
                series.pop(device, None)

    def active(self, kind: str, device: str) -> bool:
        series = self._series[kind].get(device)
        return series is not None and self._clock.seconds() - series.last < self.hold

    def openFor(self, device: str) -> list[str]:
        """The names of the alerts C{device}'s series raise now."""
        return [ALERT_NAMES[k] for k in KINDS if self.active(k, device)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for kind, (name, text) in _HELP.items():
            family = GaugeMetricFamily(name, text, labels=["device"])
            for device in sorted(self._series[kind]):
                family.add_metric([device], 1.0 if self.active(kind, device) else 0.0)
            yield family

    def register(self, registry: CollectorRegistry) -> AlertTracker:
        registry.register(self)
        return self
