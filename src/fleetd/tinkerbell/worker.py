"""
The API calls the book's rows owe, one device at a time (L{Workers}).

A device's worker takes its next pending row (L{Book.pending}), runs its
step (L{fleetd.tinkerbell.work}) and commits what it came to [J1], until
none is left. A step the API or the database could not finish (the API
down or refusing fleetd, the journal refusing the entry) leaves the row
as it was: the worker waits (1 s, doubling to a minute) and tries again;
a restart tries again from the rows. Devices work side by side, at most
L{PARALLEL} at once. L{Workers.settled} lets a caller (the provision, the
retirement) wait for the first try of each of its devices, to tell the
owner what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredList,
    DeferredSemaphore,
)
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from fleetd.k8s.errors import KubeError
from fleetd.logs import ThrottledLog
from fleetd.store.fields import MAX_STRING
from fleetd.tinkerbell.api import TinkerbellAPI
from fleetd.tinkerbell.book import Book
from fleetd.tinkerbell.store import (
    APPLY,
    CREATE,
    DELETE,
    FAILED,
    REFUSED,
    HardwareRecord,
    WorkflowRecord,
    moved,
)
from fleetd.tinkerbell.work import (
    Step,
    applyHardware,
    createWorkflow,
    deleteWorkflow,
    turnNetbootOff,
)

FIRST_RETRY = 1.0
MAX_RETRY = 60.0
PARALLEL = 8
SETTLE = 30.0  # seconds an owner's answer waits for the first try at most
_log = Logger()


class Workers:
    """Per device: one loop over its pending rows, retried with backoff."""

    def __init__(
        self,
        clock: IReactorTime,
        api: TinkerbellAPI,
        book: Book,
        failures: Counter,
    ) -> None:
        self.clock = clock
        self.api = api
        self.book = book
        self.failures = failures
        self.log = ThrottledLog(clock, burst=3, window=60.0)
        self.problems: dict[str, str] = {}  # device -> why its last try failed
        self._running: dict[str, Deferred[None]] = {}
        self._again: set[str] = set()
        self._retries: dict[str, IDelayedCall] = {}
        self._delay: dict[str, float] = {}
        self._waiting: dict[str, list[Deferred[None]]] = {}
        self._gate = DeferredSemaphore(PARALLEL)
        self._stopped = False

    def kick(self, devices: Iterable[str]) -> None:
        """Work on C{devices}' pending rows now (a change committed)."""
        for device in devices:
            if self._stopped:
                return
            retry = self._retries.pop(device, None)
            if retry is not None and retry.active():
                retry.cancel()
            if device in self._running:
                self._again.add(device)
                continue
            d = self._gate.run(self._work, device)
            self._running[device] = d
            d.addBoth(self._ended, device)

    def settled(self, devices: Iterable[str]) -> Deferred[None]:
        """Fires once each of C{devices} has had its first try (done, or
        waiting for a retry), or after L{SETTLE} seconds (an API that
        hangs: the answer then says the calls wait)."""
        waits: list[Deferred[Any]] = []
        for device in devices:
            if device in self._running:
                d: Deferred[None] = Deferred()
                self._waiting.setdefault(device, []).append(d)
                waits.append(d)
        done: Deferred[None] = Deferred()
        if not waits:
            done.callback(None)
            return done

        def ended(_: object = None) -> None:
            if timer.active():
                timer.cancel()
            if not done.called:
                done.callback(None)

        timer = self.clock.callLater(SETTLE, ended)
        DeferredList(waits, consumeErrors=True).addCallback(ended)
        return done

    def stop(self) -> Deferred[Any]:
        """Cancel every wait and call in flight; nothing is left armed."""
        self._stopped = True
        for retry in self._retries.values():
            if retry.active():
                retry.cancel()
        self._retries.clear()
        running = list(self._running.values())
        for d in running:
            d.cancel()
        for device in list(self._waiting):
            self._release(device)
        return DeferredList(running, consumeErrors=True)

    def _ended(self, result: object, device: str) -> None:
        self._running.pop(device, None)
        self._release(device)
        if self._stopped:
            return
        if device in self._again:
            self._again.discard(device)
            self.kick([device])

    def _release(self, device: str) -> None:
        for d in self._waiting.pop(device, []):
            d.callback(None)

    def _work(self, device: str) -> Deferred[None]:
        return Deferred.fromCoroutine(self._loop(device))

    async def _loop(self, device: str) -> None:
        while not self._stopped:
            row = self.book.pending(device)
            if row is None:
                self.problems.pop(device, None)
                self._delay.pop(device, None)
                return
            try:
                step = await self._step(row)
                await self._commit(device, step)
            except CancelledError:
                return
            except Exception as e:
                self._failed(device, row, e)
                return
            self._delay.pop(device, None)
            self.problems.pop(device, None)

    async def _step(self, row: WorkflowRecord | HardwareRecord) -> Step:
        now: Callable[[], float] = self.clock.seconds
        if isinstance(row, HardwareRecord):
            if row.state == APPLY:
                return await applyHardware(self.api, row, now)
            return await turnNetbootOff(self.api, row, now)
        if row.state == DELETE:
            return await deleteWorkflow(self.api, row, now)
        assert row.state == CREATE
        return await createWorkflow(self.api, row, now)

    async def _commit(self, device: str, step: Step) -> None:
        """The step's row and entry; a Hardware that cannot be applied
        ends the device's Workflows still to be made, with it."""
        workflows = [] if step.workflow is None else [step.workflow]
        hardware = step.hardware
        if hardware is not None and hardware.state in (REFUSED, FAILED):
            why = f"its Hardware {hardware.path} was not applied: {hardware.problem}"
            for record in self.book.workflowsOf(device):
                if record.state == CREATE:
                    workflows.append(
                        moved(
                            record,
                            REFUSED,
                            self.clock.seconds(),
                            problem=why[:MAX_STRING],
                        )
                    )
        await self.book.commit(
            workflows, [] if hardware is None else [hardware], [step.entry]
        )

    def _failed(
        self, device: str, row: WorkflowRecord | HardwareRecord, error: Exception
    ) -> None:
        reason = "kubernetes" if isinstance(error, KubeError) else "store"
        self.failures.labels(reason).inc()
        self.problems[device] = str(error)[:MAX_STRING]
        delay = self._delay.get(device, FIRST_RETRY)
        self._delay[device] = min(delay * 2, MAX_RETRY)
        if isinstance(error, KubeError):
            self.log.warn(
                "tinkerbell.call-failed {device}: {reason}; retrying in {delay}s",
                device=device,
                reason=str(error),
                delay=delay,
            )
        else:
            _log.failure(
                "tinkerbell.record-failed {device}; retrying in {delay}s",
                device=device,
                delay=delay,
            )
        if not self._stopped:
            self._retries[device] = self.clock.callLater(delay, self._retry, device)

    def _retry(self, device: str) -> None:
        self._retries.pop(device, None)
        self.kick([device])
