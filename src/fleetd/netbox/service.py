"""
NetBox as the inventory, as one service: the inventory fleetd uses, the
outbox worker and the journal mirror, and the start-up check of fleetd's
custom fields.

At start the check runs first: a missing custom field refuses the start,
naming it; NetBox unreachable is retried with backoff (fleetd meanwhile
serves from its own records, so a spore reboot while NetBox is down
delays nothing but the pushes). The worker and the mirror start once the
fields are known to exist.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from fleetd.inventory.model import InventoryError
from fleetd.netbox.client import RETRY_FIRST, RETRY_MAX, NetBoxClient, NetBoxError
from fleetd.netbox.inventory import NetBoxInventory
from fleetd.netbox.mirror import JournalMirror
from fleetd.netbox.worker import OutboxWorker
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner

FIRST_DELAY = RETRY_FIRST
MAX_DELAY = RETRY_MAX


class NetBoxService(Service):
    """The NetBox inventory's moving parts, started and stopped together."""

    log = Logger()

    def __init__(
        self,
        reactor: IReactorTime,
        client: NetBoxClient,
        runner: IRunner,
        journal: AsyncJournal,
        *,
        configDigest: Callable[[str], str | None],
        onRefused: Callable[[str], None],
        wake: Callable[[Callable[[], None]], object] | None = None,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        """
        @param wake: how the database thread hands the worker's kick to the
            reactor (default C{reactor.callFromThread}).
        @param onRefused: called with one line when NetBox lacks fleetd's
            custom fields; it should stop fleetd.
        """
        self._clock = reactor
        self._onRefused = onRefused
        if wake is None:
            wake = IReactorFromThreads(reactor).callFromThread
        self._handOver = wake
        self.worker = OutboxWorker(reactor, runner, journal, client, metrics=metrics)
        self.mirror = JournalMirror(reactor, runner, client, metrics=metrics)
        self.inventory = NetBoxInventory(
            client,
            runner,
            journal,
            reactor,
            configDigest=configDigest,
            wake=self._wake,
            metrics=metrics,
        )
        self.checking: Deferred[None] | None = None

    def _wake(self) -> None:
        """On the database thread: have the reactor kick the worker."""
        self._handOver(self.worker.kick)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.checking = Deferred.fromCoroutine(self._check())
        self.checking.addErrback(lambda f: f.trap(CancelledError))

    async def _check(self) -> None:
        delay = FIRST_DELAY
        while True:
            try:
                missing = await self.inventory.checkCustomFields()
            except (NetBoxError, InventoryError) as e:
                # Even a refusal (a proxy's 400 while NetBox restarts) is
                # retried: a check that gave up would never start the push.
                self.log.warn(
                    "netbox.check.retry in {delay}s: {reason}",
                    delay=delay,
                    reason=str(e),
                )
                await deferLater(self._clock, delay)
                delay = min(delay * 2, MAX_DELAY)
                continue
            break
        if missing:
            message = (
                "NetBox lacks fleetd's custom fields on dcim.device: "
                + ", ".join(missing)
                + " (create them with conf/netbox/custom-fields.json)"
            )
            self.log.critical("netbox.fields.missing: {reason}", reason=message)
            self._onRefused(message)
            return
        self.log.info("netbox.ready {url}", url=self.inventory.client.base)
        await self.worker.probeETag()  # says so once when there is none
        self.worker.start()
        self.mirror.start()

    def stopService(self) -> Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        if self.checking is not None and not self.checking.called:
            self.checking.cancel()
        worker = self.worker.stop()
        mirror = self.mirror.stop()
        client = self.inventory.client
        return worker.addCallback(lambda _: mirror).addCallback(
            lambda _: client.close()
        )
