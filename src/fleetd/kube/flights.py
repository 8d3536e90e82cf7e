"""
One device at a time [R1]: retirements under way and approvals in flight.

A retirement L{hold}s its device before any API call of its own: the
device's tokens are revoked in memory (L{fleetd.kube.book.TokenBook.suspendDevice})
and every new approval for it (first certificate or renewal) is refused
until L{release}; it then waits (L{drained}) for the approvals already in
flight, which end before the retirement deletes the Node and commits.
The approver brackets each approval with L{enter} and L{exit}.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, DeferredList

from fleetd.kube.book import TokenBook


class DeviceFlights:
    """Per device: how many retirements hold it, and the approvals in flight."""

    def __init__(self, book: TokenBook) -> None:
        self.book = book
        self._inflight: dict[str, set[Deferred[None]]] = {}
        self._retiring: dict[str, int] = {}

    # The retirement's side (fleetd.kube.retire.IApprovals)

    def hold(self, device: str) -> None:
        """No approval for C{device} from now on, until L{release}."""
        self._retiring[device] = self._retiring.get(device, 0) + 1
        self.book.suspendDevice(device, True)

    def release(self, device: str) -> None:
        """The retirement ended (committed, or gave up)."""
        left = self._retiring.get(device, 0) - 1
        if left > 0:
            self._retiring[device] = left
            return
        self._retiring.pop(device, None)
        self.book.suspendDevice(device, False)

    def drained(self, device: str) -> Deferred[Any]:
        """Fires once every approval in flight for C{device} has ended."""
        return DeferredList(list(self._inflight.get(device, ())), consumeErrors=True)

    # The approver's side

    def enter(self, device: str) -> Deferred[None] | None:
        """An approval for C{device} starts; L{None} while it is held."""
        if device in self._retiring:
            return None
        done: Deferred[None] = Deferred()
        self._inflight.setdefault(device, set()).add(done)
        return done

    def exit(self, device: str, done: Deferred[None]) -> None:
        """The approval that L{enter} gave C{done} ended, however."""
        flights = self._inflight.get(device, set())
        flights.discard(done)
        if not flights:
            self._inflight.pop(device, None)
        done.callback(None)
