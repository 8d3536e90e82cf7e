"""
Tinkerbell's objects kept in step with the inventory (issue 28;
docs/design.md, "Tinkerbell's objects"), started and stopped with the
daemon when C{[tinkerbell]} is set.

  - a provision first asks L{TinkerbellService.preflight} (before any
    run is made): a device of a configured class without a MAC, a
    Hardware of its name that fleetd did not make, or a Workflow fleetd
    did not make that would run on it and has not ended, refuses the
    whole provision naming it; the API not answering refuses it too
    (nothing is made while fleetd cannot tell);
  - the provision's transaction records the intents
    (L{recordProvision}); after its commit (L{committed}) the workers
    make the calls, and the provision waits for their first try
    (L{settled}) to tell the owner; what failed is retried, from the
    rows after a restart;
  - a retirement records its intents the same way
    (L{recordRetirement});
  - the Workflow watch (L{fleetd.tink.wfstate}) tells L{reports} what
    happened to the Workflows: their state, and what someone else did;
  - L{view} is a device's objects for C{fleetctl status}.

At start the rows are loaded (retried with backoff while the database
fails) and the pending ones worked on; at stop every wait, retry and call
is cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.config.tinkerbell import TinkerbellSettings
from fleetd.inventory.model import Device
from fleetd.k8s.client import KubeClient, KubeError
from fleetd.periodic import BackedOffStart
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner
from fleetd.tinkerbell import objects
from fleetd.tinkerbell.api import TinkerbellAPI
from fleetd.tinkerbell.book import Book, Recorded, viewOf
from fleetd.tinkerbell.store import loadRows
from fleetd.tinkerbell.watching import Reports, ended
from fleetd.tinkerbell.worker import Workers

HOWS = ("deleted", "changed", "disowned", "removed")


class Refusal(Exception):
    """
    A provision cannot make its devices' objects; nothing was
    provisioned. C{busy}: try again later (the API, or the load);
    otherwise C{reason} is the refusal's code and C{device} its device.
    """

    def __init__(
        self, line: str, reason: str, device: str | None = None, busy: bool = False
    ) -> None:
        super().__init__(line)
        self.reason = reason
        self.device = device
        self.busy = busy


class TinkerbellService(Service):
    """The book, its workers and the watch's reports."""

    log = Logger()
    # A part of each retirement (fleetd.fleet.retire.IRetirementPart):
    # its view is the retirement answer's "tinkerbell".
    answerKey = "tinkerbell"

    def __init__(
        self,
        *,
        clock: IReactorTime,
        client: KubeClient,
        settings: TinkerbellSettings,
        journal: AsyncJournal,
        runner: IRunner,
        readyRun: Callable[[str], str | None],
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings
        self.runner = runner
        self.api = TinkerbellAPI(client, settings.namespace)
        self.book = Book(settings, journal)
        failures = Counter(
            "fleetd_tinkerbell_call_failures_total",
            "Tinkerbell object calls that failed and wait for a retry:"
            " kubernetes (the API down or refusing fleetd), store (the"
            " journal or database).",
            ["reason"],
            registry=metrics,
        )
        for reason in ("kubernetes", "store"):
            failures.labels(reason)
        lost = Counter(
            "fleetd_tinkerbell_workflows_lost_total",
            "Workflows fleetd made that someone else deleted (before their"
            " end), changed or took its labels off; removed: deleted after"
            " their end. fleetd never makes them again.",
            ["how"],
            registry=metrics,
        )
        for how in HOWS:
            lost.labels(how)
        if metrics is not None:
            metrics.register(_Missing(self.book, readyRun))
        Gauge(
            "fleetd_tinkerbell_calls_pending",
            "Hardware and Workflow calls fleetd owes (recorded, not yet done).",
            registry=metrics,
        ).set_function(self.book.pendingCount)
        self.workers = Workers(clock, self.api, self.book, failures)
        self.reports = Reports(clock, self.api, self.book, lost)
        self._starting = BackedOffStart(clock, self._load, self._loadFailed)

    # The service

    def startService(self) -> None:
        super().startService()
        self._starting.begin()

    async def _load(self) -> None:
        loaded = await self.runner.run(loadRows)
        if not self.running:
            return
        self.book.load(loaded)
        pending = self.book.devicesPending()
        self.log.info(
            "tinkerbell.loaded {rows} rows, {devices} devices with calls owed",
            rows=len(loaded.workflows) + len(loaded.hardware),
            devices=len(pending),
        )
        self.workers.kick(pending)

    def _loadFailed(self, f: Failure, delay: float) -> None:
        self.log.failure("tinkerbell.load.failed, retrying in {delay}s", f, delay=delay)

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        starting = self._starting.stop()
        self.reports.stop()
        pending: list[Deferred[Any]] = [self.workers.stop()]
        if starting is not None:
            pending.append(starting)
        return DeferredList(pending, consumeErrors=True)

    # The provision (fleetd.admin.provision, fleetd.runs.provision.IRunObjects)

    async def preflight(self, devices: Sequence[Device]) -> None:
        """
        @raise Refusal: (C{busy}) still loading, or the API does not
            answer; (not busy) a device's objects cannot be fleetd's.
        """
        if not self.book.loaded:
            raise Refusal(
                "busy: fleetd is still loading its Tinkerbell objects", "busy",
                busy=True,
            )  # fmt: skip
        ours = [d for d in devices if self.settings.forClass(d.device_class)]
        if not ours:
            return
        for device in ours:
            if not device.macs:
                raise Refusal(
                    f"tinkerbell-no-mac: {device.name} has no MAC in the inventory;"
                    " its Hardware and Workflow need one (fleetctl device add"
                    " --mac, or the inventory's interfaces)",
                    "tinkerbell-no-mac",
                    device.name,
                )
        try:
            await self._checkForeign(ours)
        except KubeError as e:
            raise Refusal(f"kubernetes: {e}", "busy", busy=True) from e

    async def _checkForeign(self, devices: Sequence[Device]) -> None:
        for device in devices:
            found = await self.api.get("hardware", device.name)
            if found is not None and not objects.owned(found, device.name):
                path = f"{self.settings.namespace}/{device.name}"
                raise Refusal(
                    f"tinkerbell-not-fleetds: Hardware {path} exists and fleetd did"
                    f" not make it (no {objects.MANAGED_BY}={objects.FLEETD} and"
                    f" {objects.DEVICE_LABEL}={device.name} labels); fleetd never"
                    " changes it: delete it, or leave [tinkerbell] out",
                    "tinkerbell-not-fleetds",
                    device.name,
                )
        workflows = await self.api.list("workflows")
        for device in devices:
            for obj in workflows:
                if objects.owned(obj, device.name) or _over(obj):
                    continue
                if objects.namesDevice(obj, device.name, device.macs):
                    name = obj["metadata"]["name"]
                    path = f"{self.settings.namespace}/{name}"
                    raise Refusal(
                        f"tinkerbell-not-fleetds: Workflow {path}, which fleetd did"
                        f" not make, would run on {device.name}: delete it (or"
                        " leave [tinkerbell] out); fleetd never changes it",
                        "tinkerbell-not-fleetds",
                        device.name,
                    )

    def recordProvision(
        self,
        db: Database,
        journal: Recorder,
        started: Sequence[tuple[Device, str]],
        actor: str,
        at: float,
    ) -> Recorded:
        """In the provision's transaction: see L{Book.recordProvision}."""
        return self.book.recordProvision(db, journal, started, actor, at)

    def recordRetirement(
        self, db: Database, journal: Recorder, device: str, actor: str, at: float
    ) -> Recorded:
        """In the retirement's transaction: see L{Book.recordRetirement}."""
        return self.book.recordRetirement(db, journal, device, actor, at)

    def committed(self, recorded: Recorded) -> None:
        """The change committed: memory follows, the calls start."""
        self.book.apply(recorded)
        self.workers.kick(recorded.devices)

    def settled(self, devices: Sequence[str]) -> Deferred[None]:
        """Fires once each of C{devices} had its first try (30 s at most)."""
        return self.workers.settled(devices)

    # Status

    def view(self, device: str) -> dict[str, Any] | None:
        """C{device}'s Hardware and current Workflow, and why a call waits."""
        found = viewOf(self.book, device)
        problem = self.workers.problems.get(device)
        if found is not None and problem is not None:
            found["waiting"] = problem
        return found


class _Missing:
    """C{fleetd_tinkerbell_workflows_missing{device}}, counted at each scrape."""

    def __init__(self, book: Book, readyRun: Callable[[str], str | None]) -> None:
        self.book = book
        self.readyRun = readyRun

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "fleetd_tinkerbell_workflows_missing",
            "1 for each device whose run waits for its node and whose Workflow"
            " someone else deleted or changed before its end: fleetd does not"
            " make it again (FleetTinkerbellWorkflowLost).",
            labels=["device"],
        )
        for device in self.book.lost(self.readyRun):
            family.add_metric([device], 1.0)
        yield family


def _over(obj: dict[str, Any]) -> bool:
    """Whether a Workflow can no longer run: ended, failed or timed out."""
    state = objects.stateOf(obj)
    return ended(state) or (
        state is not None
        and state.upper().removeprefix("STATE_") in ("FAILED", "TIMEOUT")
    )
