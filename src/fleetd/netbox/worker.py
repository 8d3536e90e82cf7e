"""
The outbox worker: takes pending outbox entries in order and writes each
to NetBox through a L{fleetd.netbox.push.Push}, then records how it
settled (with a journal entry when NetBox's state overrode it or NetBox
refused it) [J1]. It wakes when a change is queued and every C{poll}
seconds; all timers are on the injected clock and cancelled on stop.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import InventoryError
from fleetd.netbox.client import NetBoxClient, NetBoxError
from fleetd.netbox.devices import DEVICES, detailPath, remote
from fleetd.netbox.outbox import (
    DONE,
    REFUSED,
    SKIPPED,
    OutboxEntry,
    lastWritten,
    nextPending,
    pendingCount,
    settle,
)
from fleetd.netbox.push import Push
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

POLL = 5.0


def _peek(db: Database) -> tuple[OutboxEntry | None, int]:
    return nextPending(db), pendingCount(db)


class OutboxWorker:
    """Push the outbox to NetBox, one entry at a time, oldest first."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        runner: IRunner,
        journal: AsyncJournal,
        client: NetBoxClient,
        poll: float = POLL,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self._clock = clock
        self._runner = runner
        self._journal = journal
        self._client = client
        self._poll = poll
        self._busy = False
        self._again = False
        self._stopped = True
        self._timer: IDelayedCall | None = None
        self._inflight: set[Deferred[object]] = set()
        self.push: Push | None = None
        self.pendingGauge = Gauge(
            "fleetd_netbox_outbox_pending",
            "Changes committed in fleetd and not yet written to NetBox.",
            registry=metrics,
        )
        self.settledCount = Counter(
            "fleetd_netbox_pushes",
            "Outbox entries settled, by outcome (done, skipped, refused).",
            ["outcome"],
            registry=metrics,
        )
        for outcome in (DONE, SKIPPED, REFUSED):
            self.settledCount.labels(outcome)
        self.etagMissing = Gauge(
            "fleetd_netbox_etag_missing",
            "1 when NetBox's device details carry no ETag (NetBox before 4.6,"
            " or a proxy that strips it): writes cannot use If-Match.",
            registry=metrics,
        )
        self._etag: bool | None = None

    def noteETag(self, present: bool) -> None:
        """
        Whether a device detail carried an ETag: said once in the log
        (and again only if it changes) and kept in a gauge.
        """
        if present == self._etag:
            return
        if not present:
            self.log.warn(
                "netbox.etag.missing: NetBox's device details carry no ETag"
                " (NetBox before 4.6, or a proxy that strips it); fleetd writes"
                " without If-Match and writes a status only over its own"
            )
        elif self._etag is False:
            self.log.info("netbox.etag.present: device details carry an ETag again")
        self._etag = present
        self.etagMissing.set(0 if present else 1)

    async def probeETag(self) -> None:
        """At start: read one device's detail to learn whether it has an ETag."""
        try:
            page, _ = await self._client.call(
                "GET", self._client.url(DEVICES, {"limit": 1})
            )
            results = page.get("results") if isinstance(page, dict) else None
            if not results or not isinstance(results[0], dict):
                return  # no device yet: the first push will tell
            detail = await self._client.detail(detailPath(remote(results[0]).id))
        except (NetBoxError, InventoryError) as e:
            self.log.warn("netbox.etag.unknown: {reason}", reason=str(e))
            return
        self.noteETag(detail.etag is not None)

    def start(self) -> None:
        self._stopped = False
        self.kick()

    def kick(self) -> None:
        """Look at the outbox now (a change was queued, or the poll came)."""
        if self._stopped:
            return
        if self._busy:
            self._again = True
            return
        self._cancelTimer()
        self._busy, self._again = True, False
        self._track(self._runner.run(_peek)).addCallbacks(self._next, self._storeFailed)

    def _track(self, d: Deferred[object]) -> Deferred[object]:
        if not d.called:
            self._inflight.add(d)
            d.addBoth(self._untrack, d)
        return d

    def _untrack(self, result: object, d: Deferred[object]) -> object:
        self._inflight.discard(d)
        return result

    def _next(self, peeked: object) -> None:
        if self._stopped:
            return
        assert isinstance(peeked, tuple)
        entry, pending = peeked
        self.pendingGauge.set(pending)
        if not isinstance(entry, OutboxEntry):
            self._idle()
            return
        self.push = Push(
            entry,
            self._client,
            self._clock,
            self._settled,
            written=lambda: self._runner.run(lambda db: lastWritten(db, entry.device)),
            onETag=self.noteETag,
        )
        self.push.machine.begin()

    def _settled(
        self,
        entry: OutboxEntry,
        state: str,
        outcome: str,
        tries: int,
        found: str | None = None,
    ) -> None:
        self.push = None
        if state == DONE:
            self.log.info(
                "netbox.pushed {entry} {device} {status}",
                entry=entry.id,
                device=entry.device,
                status=entry.status.value,
            )
        else:
            self.log.warn(
                "netbox.push.{state} {entry} {device}: {reason}",
                state=state,
                entry=entry.id,
                device=entry.device,
                reason=outcome,
            )

        def change(db: Database, record: Recorder) -> None:
            settle(db, entry.id, state, outcome, tries, found)
            if state != DONE:
                record(
                    f"netbox.push.{state}",
                    actor="fleetd",
                    device=entry.device,
                    run=entry.run,
                    fields={"status": entry.status.value, "reason": outcome[:500]},
                )

        d = self._track(self._journal.change(change))
        d.addCallbacks(self._recorded, self._storeFailed, callbackArgs=(state,))

    def _recorded(self, _: object, state: str) -> None:
        self.settledCount.labels(state).inc()
        self._busy = False
        self.kick()

    def _storeFailed(self, failure: Failure) -> None:
        self.push = None
        self._busy = False
        self.log.error(
            "netbox.outbox.store-failed: {reason}", reason=failure.getErrorMessage()
        )
        self._arm(self._poll)

    def _idle(self) -> None:
        self._busy = False
        if self._again:
            self.kick()
        else:
            self._arm(self._poll)

    def _arm(self, delay: float) -> None:
        if self._stopped:
            return
        self._cancelTimer()
        self._timer = self._clock.callLater(delay, self.kick)

    def _cancelTimer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def stop(self) -> Deferred[None]:
        """Cancel timers and the entry in progress; fire when DB work settled."""
        self._stopped = True
        self._cancelTimer()
        if self.push is not None:
            self.push.machine.stop()
            self.push = None
        pending = list(self._inflight)
        return DeferredList(pending, consumeErrors=True).addCallback(lambda _: None)
