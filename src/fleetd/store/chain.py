"""
Watch the journal's chain [J2]: verify it at start and periodically.

A break (an edited, deleted or inserted entry, or a forged head) sets
C{fleetd_journal_chain_ok} to 0, which raises C{FleetJournalChainBroken},
and logs the first bad entry once per break. What appends do meanwhile is
L{fleetd.store.journal.Journal.append}'s business: new entries still chain
onto the authenticated head after a mid-chain edit, so fleetd keeps
recording what happens; a head that is missing, forged or does not match
the last entry stops appends (and so every change [J1]).

An owner's re-anchor (L{fleetd.store.anchor}) acknowledges a break: the
gauge returns to 1 and C{fleetd_journal_acknowledged_breaks} counts the
breaks acknowledged; a later break is a new one and drops it to 0 again.
C{fleetctl journal verify} and the re-anchor go through L{ChainMonitor.verify},
so the gauge follows them at once rather than at the next period.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.periodic import After, PeriodicAfter
from fleetd.store.journal import AsyncJournal
from fleetd.store.verify import JournalVerification

DEFAULT_INTERVAL = 3600.0


class ChainMonitor(Service):
    """Verify the chain now and every C{interval} seconds; expose the result."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        journal: AsyncJournal,
        registry: CollectorRegistry | None,
        interval: float = DEFAULT_INTERVAL,
        after: After | None = None,
    ) -> None:
        """
        @param after: called at start with a function that begins the
            verifications; L{None} begins them at once. fleetd passes
            L{fleetd.readiness.Readiness.whenSettled}: the first
            verification reads the whole journal on the database thread
            and would otherwise hold up the start-up load behind it.
        """
        self._clock = clock
        self._journal = journal
        self.interval = interval
        self._periodic = PeriodicAfter(
            clock, self.verify, after=after, failed=self._loopFailed
        )
        self._broken: str | None = None
        self._verdict: JournalVerification | None = None
        self._checkedAt: float | None = None
        if registry is not None:
            registry.register(_ChainCollector(self))

    @property
    def verdict(self) -> JournalVerification | None:
        """The last verification's result; L{None} before the first."""
        return self._verdict

    @property
    def checkedAt(self) -> float | None:
        """When the last verification ended (the clock's time); L{None} before."""
        return self._checkedAt

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._periodic.start(self.interval)

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        self._periodic.stop()

    def verify(self) -> Deferred[JournalVerification | None]:
        """Verify the whole chain once; the gauges follow the result."""
        d: Deferred[JournalVerification | None] = self._journal.verify().addCallback(
            self._verified
        )
        d.addErrback(self._failed)
        return d

    def _verified(self, result: JournalVerification) -> JournalVerification:
        self._verdict = result
        self._checkedAt = self._clock.seconds()
        if not result.ok and result.problem != self._broken:
            self.log.error(
                "journal.chain.broken {problem}; run 'fleetctl journal verify'",
                problem=result.problem,
                seq=result.seq,
            )
        elif result.ok and self._broken is not None:
            self.log.info("journal.chain.intact {entries}", entries=result.entries)
        self._broken = None if result.ok else result.problem
        return result

    def _failed(self, failure: Failure) -> None:
        # The database could not be read: that is not a verdict on the chain.
        self.log.warn(
            "journal.chain.unverified {reason}", reason=failure.getErrorMessage()
        )
        return None

    def _loopFailed(self, failure: Failure) -> None:
        self.log.failure("journal.chain.loop-failed", failure=failure)


class _ChainCollector(Collector):
    """
    The chain's metrics; nothing before the first verification, so no
    series claims "intact" (or "broken") before anything was checked.
    """

    def __init__(self, monitor: ChainMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[GaugeMetricFamily]:
        verdict, at = self._monitor._verdict, self._monitor._checkedAt
        if verdict is None or at is None:
            return
        yield GaugeMetricFamily(
            "fleetd_journal_chain_ok",
            "1 when the last verification found the journal chain intact, 0 when"
            " it found a break (FleetJournalChainBroken).",
            value=1.0 if verdict.ok else 0.0,
        )
        yield GaugeMetricFamily(
            "fleetd_journal_verified_entries",
            "The seq up to which the last verification found the chain intact"
            " (past acknowledged breaks).",
            value=float(verdict.entries),
        )
        yield GaugeMetricFamily(
            "fleetd_journal_acknowledged_breaks",
            "Journal breaks an owner acknowledged with a re-anchor (kept in the"
            " chain for good).",
            value=float(len(verdict.acknowledged)),
        )
        yield GaugeMetricFamily(
            "fleetd_journal_verified_timestamp_seconds",
            "When the journal chain was last verified (FleetJournalUnverified"
            " when it is too long ago).",
            value=at,
        )
