"""
Release served-config records to the inventory, retrying until it works.

Right after a delivery the record exists only in the vault. Releasing it
makes it durable in the inventory (and moves the device to C{staged}); if
the inventory is unavailable, the release is retried with exponential
backoff. Timers are cancelled on stop; the vault still holds the record,
so the next start releases it again.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import DeviceStatus, IInventory, ServedRecord
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
        self._stopped = False

    def pending(self) -> int:
        return len(self._pending)

    def release(self, record: ServedRecord) -> None:
        if self._stopped or record.run in self._pending:
            return
        self._pending[record.run] = record
        self._attempt(record.run, FIRST_DELAY)

    def _attempt(self, run: str, delay: float) -> None:
        self._timers.pop(run, None)
        record = self._pending.get(run)
        if record is None or self._stopped:
            return
        d = Deferred.fromCoroutine(self._release(record))
        d.addErrback(self._failed, run, delay)

    async def _release(self, record: ServedRecord) -> None:
        await self._inventory.release(record)
        await self._inventory.setStatus(record.device, DeviceStatus.STAGED)
        self._pending.pop(record.run, None)
        await self._journal.append(
            "run.released",
            actor="fleetd",
            device=record.device,
            run=record.run,
            fields={"status": DeviceStatus.STAGED.value},
        )

    def _failed(self, f: Failure, run: str, delay: float) -> None:
        if run not in self._pending:  # released; only the journal failed
            self.log.failure("runs.release.journal-failed", failure=f)
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

    def stop(self) -> None:
        self._stopped = True
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()
