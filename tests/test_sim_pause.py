"""
L{fleetd.sim.pause}: a spore reboot runs while no other node is on its
way; nodes not yet started wait for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.sim.pause import Pause


class PauseTests(SynchronousTestCase):
    def test_alone_waitsForOthersHoldsBackNewcomers(self) -> None:
        pause = Pause()
        log: list[str] = []
        gates: dict[str, Deferred[None]] = {n: Deferred() for n in ("a", "b", "c")}
        work: Deferred[None] = Deferred()

        def node(name: str, inside: Callable[[], Awaitable[None]]) -> Deferred[None]:
            async def way() -> None:
                async with pause.running():
                    log.append(f"{name} on")
                    await inside()
                    log.append(f"{name} off")

            return Deferred.fromCoroutine(way())

        async def rebooting() -> None:
            log.append("reboot")
            await work
            log.append("rebooted")

        async def spore() -> None:
            await pause.alone(rebooting)

        a = node("a", lambda: gates["a"])
        s = node("s", spore)
        self.assertEqual(log, ["a on", "s on"])  # a still on its way
        c = node("c", lambda: gates["c"])
        self.assertEqual(log, ["a on", "s on"])  # c held back
        gates["a"].callback(None)
        self.assertEqual(log, ["a on", "s on", "a off", "reboot"])
        work.callback(None)
        self.assertEqual(log[4:], ["rebooted", "c on", "s off"])
        gates["c"].callback(None)
        for d in (a, s, c):
            self.successResultOf(d)
