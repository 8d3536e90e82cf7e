"""
CSRs left pending [K2]: journaled with their reason, at most once per CSR
and reason per L{JOURNAL_EVERY} seconds however often the watch shows
them (in memory: a restart journals a pending CSR again).
"""

from __future__ import annotations

from collections import OrderedDict

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.kube.decisions import CSRDecisions
from fleetd.store.journal import AsyncJournal

JOURNAL_EVERY = 3600.0
REMEMBERED = 4096


class LeftPending:
    """Journal CSRs left pending, throttled per CSR and reason."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        journal: AsyncJournal,
        decisions: CSRDecisions | None = None,
    ) -> None:
        self.clock = clock
        self.journal = journal
        self.decisions = decisions or CSRDecisions(None)
        self._journaled: OrderedDict[tuple[str, str], float] = OrderedDict()

    def leave(
        self, csr: str, requester: str, device: str | None, reason: str, uid: str
    ) -> None:
        """Journal a CSR left pending, at most once per CSR and reason per hour."""
        key = (uid or csr, reason)
        now = self.clock.seconds()
        last = self._journaled.get(key)
        if last is not None and now - last < JOURNAL_EVERY:
            return
        self._journaled[key] = now
        self._journaled.move_to_end(key)
        while len(self._journaled) > REMEMBERED:
            self._journaled.popitem(last=False)
        self.log.warn(
            "kube.csr.left-pending {csr} {requester}: {reason}",
            csr=csr,
            requester=requester,
            reason=reason,
        )
        d = self.journal.append(
            "kube.csr-left-pending",
            actor="fleetd",
            device=device,
            fields={"csr": csr[:128], "requester": requester[:256], "reason": reason},
        )
        # Counted with its entry: a failed one is journaled (and counted)
        # again on the next sight.
        d.addCallbacks(
            lambda _: self.decisions.leftPending(reason),
            self._journalFailed,
            errbackArgs=(key,),
        )

    def _journalFailed(self, f: Failure, key: tuple[str, str]) -> None:
        self._journaled.pop(key, None)  # try again on the next sight
        self.log.failure("kube.csr.journal-failed", f)
