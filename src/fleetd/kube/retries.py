"""
CSRs looked at again after a busy store or API [K2] [J1].

A CSR whose decision failed because the database, the journal, NetBox or
the API could not answer gets no event of its own while it stays pending,
and a resumed watch does not show it again: the approver hands it here
(L{BusyRetries.later}), which reads it again (C{GET}) after 1 s, doubling
up to 30 s, and hands the object back to the approver. A new sight of
the CSR cancels the wait (L{BusyRetries.cancel}); a decision that ends
well forgets its backoff (L{BusyRetries.forget}). At most C{held} CSRs
wait at a time: the others wait for their next sight (a re-list), as
before. L{BusyRetries.stop} leaves no delayed call.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from fleetd.k8s.errors import KubeError, KubeUnavailable

RETRY_FIRST = 1.0
RETRY_CAP = 30.0
RETRY_HELD = 1000


class BusyRetries:
    """Per CSR name: the delayed look again and its next delay."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        read: Callable[[str], Coroutine[Any, Any, dict[str, Any]]],
        seen: Callable[[dict[str, Any]], None],
        held: int = RETRY_HELD,
    ) -> None:
        self.clock = clock
        self.read = read
        self.seen = seen
        self.held = held
        self._calls: dict[str, IDelayedCall] = {}
        self._delay: dict[str, float] = {}
        self._reading: set[Deferred[None]] = set()
        self._stopped = False

    def later(self, name: str) -> None:
        """C{name}'s decision met a busy peer: read and decide it again."""
        if self._stopped:
            return
        if len(self._calls) >= self.held:
            self._delay.pop(name, None)
            self.log.warn("kube.csr.retry-full {csr}: left to its next sight", csr=name)
            return
        delay = self._delay.get(name, RETRY_FIRST)
        self._delay[name] = min(delay * 2, RETRY_CAP)
        self._calls[name] = self.clock.callLater(delay, self._look, name)

    def cancel(self, name: str) -> None:
        """A sight of C{name} decides now; its backoff goes on if it fails."""
        call = self._calls.pop(name, None)
        if call is not None:
            call.cancel()

    def forget(self, name: str) -> None:
        """C{name} is decided (or not fleetd's business): start afresh."""
        self.cancel(name)
        self._delay.pop(name, None)

    def stop(self) -> None:
        self._stopped = True
        for call in self._calls.values():
            call.cancel()
        self._calls.clear()
        self._delay.clear()
        for d in list(self._reading):
            d.cancel()

    def _look(self, name: str) -> None:
        del self._calls[name]
        d = Deferred.fromCoroutine(self._readAgain(name))
        self._reading.add(d)
        d.addBoth(lambda _: self._reading.discard(d))

    async def _readAgain(self, name: str) -> None:
        try:
            obj = await self.read(name)
        except KubeUnavailable:
            self.later(name)
            return
        except KubeError as e:  # deleted meanwhile, or refused: its next sight
            self._delay.pop(name, None)
            self.log.warn("kube.csr.not-read {csr}: {reason}", csr=name, reason=str(e))
            return
        if not self._stopped:
            self.seen(obj)
