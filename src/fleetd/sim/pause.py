"""
A rack's nodes on their way, and a moment none is: a spore reboot
(L{fleetd.sim.faults.boot}) stops fleetd while no other node is between
its first step and its last check, so it hits only the runs the fault
means to hit, and every other node's outcome stays what its own fault
says.

Each node holds a share of the rack's L{Pause} from its first step to
its final check (L{Pause.running}); L{Pause.alone} gives up the caller's
share, holds back nodes not yet started, waits for the others to end,
runs its work, then lets everyone go on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from twisted.internet.defer import Deferred


class Pause:
    """Shared by the nodes on their way; one at a time alone."""

    def __init__(self) -> None:
        self._running = 0
        self._alone = False
        self._held: list[Deferred[None]] = []  # waiting for the pause to end
        self._drained: Deferred[None] | None = None  # the last one out fires it

    async def enter(self) -> None:
        while self._alone:
            d: Deferred[None] = Deferred()
            self._held.append(d)
            await d
        self._running += 1

    def leave(self) -> None:
        self._running -= 1
        if self._running == 0 and self._drained is not None:
            d, self._drained = self._drained, None
            d.callback(None)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """A node's whole way, its checks included."""
        await self.enter()
        try:
            yield
        finally:
            self.leave()

    async def alone(self, work: Callable[[], Awaitable[None]]) -> None:
        """From inside a node's way: C{work} while no other node is on its
        way; nodes not yet started wait until it is done."""
        self.leave()
        try:
            while self._alone:  # another node's pause first
                d: Deferred[None] = Deferred()
                self._held.append(d)
                await d
            self._alone = True
            try:
                if self._running:
                    self._drained = Deferred()
                    await self._drained
                await work()
            finally:
                self._alone = False
                held, self._held = self._held, []
                for waiting in held:
                    waiting.callback(None)
        finally:
            await self.enter()
