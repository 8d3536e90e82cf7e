"""
The start-up load as a service (L{fleetd.loading.LoadService}) and the
database worker that stops after the services using it
(L{fleetd.store.runner.RunnerService}).
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from fleetd.loading import LoadService
from fleetd.readiness import Readiness, State
from fleetd.store.runner import RunnerService


class LoadServiceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.held: Deferred[None] = Deferred()
        self.sent: list[bytes] = []
        self.stops: list[str] = []
        self.readiness = Readiness(notify=self.sent.append)

        async def load() -> None:
            await self.held

        def stop() -> Deferred[None]:
            self.stops.append("stopped")
            return succeed(None)

        self.service = LoadService(load, self.readiness, stop=stop)

    def test_whenReady_firesOnceLoaded(self) -> None:
        """whenReady() waits for the load, then readiness is ready and
        READY=1 was sent; asked again later it fires at once."""
        waiting = self.service.whenReady()
        self.service.startService()
        self.assertNoResult(waiting)
        self.held.callback(None)
        self.successResultOf(waiting)
        self.assertIs(self.readiness.state, State.READY)
        self.assertEqual(self.sent, [b"READY=1\nSTATUS=serving"])
        self.successResultOf(self.service.whenReady())

    def test_whenReady_firesOnceFailed(self) -> None:
        """A failed load settles whenReady() too; readiness says why."""
        self.service.startService()
        waiting = self.service.whenReady()
        self.held.errback(RuntimeError("gone"))
        self.successResultOf(waiting)
        self.flushLoggedErrors(RuntimeError)
        self.assertIs(self.readiness.state, State.FAILED)
        self.assertEqual(
            self.sent, [b"STATUS=loading the runs failed: RuntimeError: gone"]
        )

    def test_stop_waitsForTheLoad(self) -> None:
        """Stopping stops what the load fed at once and fires only once the
        load settled."""
        self.service.startService()
        stopping = self.service.stopService()
        self.assertEqual(self.stops, ["stopped"])
        self.assertNoResult(stopping)
        self.held.callback(None)
        self.successResultOf(stopping)


class FakeRunner:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def start(self) -> None:
        self.log.append("runner started")

    def stop(self) -> None:
        self.log.append("runner stopped")


class Child(Service):
    def __init__(self, name: str, log: list[str], stopped: Deferred[None]) -> None:
        self.setName(name)
        self.log = log
        self.stopped = stopped

    def startService(self) -> None:
        super().startService()
        self.log.append(f"{self.name} started")

    def stopService(self) -> Deferred[None]:
        super().stopService()
        self.log.append(f"{self.name} stopping")
        return self.stopped


class RunnerServiceTests(SynchronousTestCase):
    def test_order_runnerFirstUp_lastDown(self) -> None:
        """The worker starts before its children and stops only once every
        child finished stopping (children stop last first)."""
        log: list[str] = []
        runner: Any = FakeRunner(log)
        service = RunnerService(runner)
        first: Deferred[None] = Deferred()
        second: Deferred[None] = Deferred()
        Child("a", log, first).setServiceParent(service)
        Child("b", log, second).setServiceParent(service)
        service.startService()
        self.assertEqual(log, ["runner started", "a started", "b started"])
        stopping = service.stopService()
        self.assertEqual(log[3:], ["b stopping", "a stopping"])
        first.callback(None)
        second.errback(RuntimeError("one child failed"))
        self.successResultOf(stopping)
        self.assertEqual(log[-1], "runner stopped")
