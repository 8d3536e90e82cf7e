"""
Release served-config records to the inventory, retrying until it works.

Right after a delivery the record exists only in the vault. Releasing it
makes it durable in the inventory (and moves the device to C{staged}); if
the inventory is unavailable, the release is retried with exponential
backoff. Timers are cancelled on stop; the vault still holds the record,
so the next start releases it again.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import (
    DeviceStatus,
    IInventory,
    InventoryError,
    ServedRecord,
)
from fleetd.store.journal import AsyncJournal

FIRST_DELAY = 1.0
MAX_DELAY = 60.0


class Releaser:
    log = Logger()

    def __init__(
        self, clock: IReactorTime, inventory: IInventory, journal: AsyncJournal
    ) -> None:
        self._clock = clock
        self._inventory = inventory
        self._journal = journal
        self._pending: dict[str, ServedRecord] = {}
        self._timers: dict[str, IDelayedCall] = {}
        self._inflight: set[Deferred[None]] = set()
        self._stopped = False

    def pending(self) -> int:
        return len(self._pending)

    def release(self, record: ServedRecord) -> None:
        if self._stopped or record.run in self._pending:
            return
        self._pending[record.run] = record
        self._attempt(record.run, FIRST_DELAY)

    def cancel(self, run: str) -> None:
        """Stop trying to release C{run} (it was superseded)."""
        self._pending.pop(run, None)
        timer = self._timers.pop(run, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _attempt(self, run: str, delay: float) -> None:
        self._timers.pop(run, None)
        record = self._pending.get(run)
        if record is None or self._stopped:
            return
        d = Deferred.fromCoroutine(self._release(record))
        d.addErrback(self._failed, run, delay)
        if not d.called:
            self._inflight.add(d)
            d.addBoth(self._settled, d)

    def _settled(self, result: object, d: Deferred[None]) -> object:
        self._inflight.discard(d)
        return result

    async def _release(self, record: ServedRecord) -> None:
        await self._inventory.release(record)  # also moves the device to staged
        self._pending.pop(record.run, None)
        await self._journal.append(
            "run.released",
            actor="fleetd",
            device=record.device,
            run=record.run,
            fields={"status": DeviceStatus.STAGED.value},
        )

    def _failed(self, f: Failure, run: str, delay: float) -> None:
        if self._stopped:  # the vault keeps the record; the next start retries
            return
        if run not in self._pending:  # released; only the journal failed
            self.log.failure("runs.release.journal-failed", failure=f)
            return
        error = f.value
        if isinstance(error, InventoryError) and error.kind != "unavailable":
            # Retrying cannot help (device deleted, run claimed elsewhere).
            self._pending.pop(run, None)
            self.log.error(
                "runs.release.refused {run}: {reason}", run=run, reason=str(error)
            )
            return
        self.log.warn(
            "runs.release.retry {run} in {delay}s: {reason}",
            run=run,
            delay=delay,
            reason=f.getErrorMessage(),
        )
        if not self._stopped:
            self._timers[run] = self._clock.callLater(
                delay, self._attempt, run, min(delay * 2, MAX_DELAY)
            )

    def stop(self) -> Deferred[None]:
        """Cancel retries; fire once the attempts in flight have settled."""
        self._stopped = True
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()
        inflight = list(self._inflight)
        return DeferredList(inflight, consumeErrors=True).addCallback(lambda _: None)
