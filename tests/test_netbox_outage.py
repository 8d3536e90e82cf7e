"""
NetBox outages of any length delay the push, never for long after NetBox
answers again (design.md, State: the outbox; issue 17 item 13): retries
back off 1 s doubling to C{RETRY_MAX} (10 s), never to minutes, the
start-up check gives up on nothing, and a pooled connection NetBox
dropped without a word costs one deadline, not one per attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treq.testing import StubTreq
from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from fleetd.inventory.model import DeviceStatus, ServedRecord
from fleetd.netbox.connect import makeClient
from fleetd.netbox.service import NetBoxService
from fleetd.store import Database
from fleetd.store.journal import AsyncJournal, Journal, Recorder
from fleetd.store.runner import DatabaseRunner
from fleetd.testing.netbox import FakeNetBox
from tests.inventorysupport import W1
from tests.netbox_support import TOKEN, NetBoxRig, seedFake

reactor: Any = _reactor
HOUR = 3600
BOUND = 30.0  # the push resumes within this of NetBox answering again


def _release(rig: NetBoxRig) -> None:
    """A delivery's record: the release row and its journal entry [J1]."""
    record = ServedRecord("r-1", "w1", 5.0, "10.0.0.7")

    def change(db: Database, journal: Recorder) -> None:
        rig.inventory.releaseIn(db, record)
        journal("run.delivered", actor="node:w1", device="w1", run="r-1", fields={})

    rig.journal.change(change)


class LongOutageTests(SynchronousTestCase):
    """After an hour without NetBox, the push resumes within 30 s of its return."""

    def setUp(self) -> None:
        self.rig = NetBoxRig(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(self.rig.close)
        self.w1 = self.rig.fake.devices[seedFake(self.rig.fake, W1)]

    def waitFor(self, done: Any, since: float) -> float:
        """Advance the clock in 1 s steps until C{done()}; seconds since C{since}."""
        while not done():
            self.assertLess(self.rig.clock.seconds() - since, 10 * BOUND)
            self.rig.clock.advance(1)
        return self.rig.clock.seconds() - since

    def test_releaseDuringHourLongOutage_pushedWithin30s(self) -> None:
        """
        [J1] A delivery's release queued while NetBox is down for an hour
        reaches NetBox within 30 s of its return; the journal mirror too.
        """
        self.rig.mirror.start()
        self.rig.runner.run(
            lambda db: self.rig.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        self.rig.settle()
        self.assertEqual(self.w1["status"], "planned")
        self.rig.http.down = True
        _release(self.rig)
        self.rig.settle()
        for _ in range(HOUR):
            self.rig.clock.advance(1)
        self.assertEqual(self.w1["status"], "planned")
        self.rig.http.down = False
        back = self.rig.clock.seconds()
        staged = self.waitFor(lambda: self.w1["status"] == "staged", back)
        self.assertLessEqual(staged, BOUND)
        self.assertEqual(self.w1["custom_fields"]["fleetd_release"]["run"], "r-1")

        def mirrored() -> bool:
            entries = self.rig.fake.journal.values()
            return any("run.delivered" in e["comments"] for e in entries)

        self.assertLessEqual(self.waitFor(mirrored, back), BOUND)

    def test_startDuringHourLongOutage_pushWithin30s(self) -> None:
        """
        fleetd started while NetBox is down: the start-up check retries (a
        proxy's 400 included) and the push starts within 30 s of NetBox's
        return, however long it was away.
        """
        self.rig.worker.stop()
        service = NetBoxService(
            self.rig.clock,
            self.rig.client,
            self.rig.runner,
            self.rig.journal,
            configDigest=lambda run: None,
            onRefused=self.fail,
            wake=lambda f: self.rig.clock.callLater(0, f),
        )
        self.rig.http.down = True
        service.startService()
        self.addCleanup(service.stopService)
        self.rig.runner.run(
            lambda db: service.inventory.setStatusIn(db, "w1", DeviceStatus.PLANNED)
        )
        for _ in range(HOUR):
            self.rig.clock.advance(1)
        self.rig.http.down = False
        stub = self.rig.http.stub
        self.rig.http.stub = StubTreq(_Refusing())  # a proxy's 400 at first
        self.rig.clock.advance(20)
        self.rig.http.stub = stub
        back = self.rig.clock.seconds()
        planned = self.waitFor(lambda: self.w1["status"] == "planned", back)
        self.assertLessEqual(planned, BOUND)


class _Refusing(Resource):
    """What a proxy in front of a restarting NetBox may answer: 400."""

    isLeaf = True

    def render(self, request: Request) -> bytes:
        request.setResponseCode(400)
        return b'{"detail": "Bad Request"}'


class _Site(Site):
    """A twisted.web site that remembers its open connections (to cut them)."""

    def __init__(self, resource: Any) -> None:
        super().__init__(resource)
        self.open: set[Any] = set()

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        made, lost = protocol.connectionMade, protocol.connectionLost

        def connectionMade() -> None:
            self.open.add(protocol)
            made()

        def connectionLost(reason: Any) -> None:
            self.open.discard(protocol)
            lost(reason)

        protocol.connectionMade = connectionMade
        protocol.connectionLost = connectionLost
        return protocol


class LoopbackOutageTests(TestCase):
    """
    A real fake NetBox on a loopback port, stopped in the middle of a
    delivery and started again on the same port, on the real clock.
    """

    timeout = 120

    async def outage(self, cut: str) -> float:
        """
        Push planned, stop NetBox (listener closed, connections cut:
        C{"reset"} aborts them, C{"silent"} leaves them open and never
        answers, as a cut link does), deliver, restart NetBox after 3 s;
        the seconds from the restart until the release is in NetBox.
        """
        fake = FakeNetBox(basePath="/nb/")
        seedFake(fake, W1)
        stored = fake.byName("w1")
        site = _Site(fake)
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        port: Any = await endpoint.listen(site)
        number = port.getHost().port
        token = Path(self.mktemp())
        token.write_text(TOKEN)
        url = f"http://127.0.0.1:{number}/nb/"
        client = makeClient(reactor, url, token, None, timeout=5.0)
        db = Database.open(Path(self.mktemp()))
        runner = DatabaseRunner(reactor, db)
        runner.start()
        journal = AsyncJournal(runner, Journal(b"k" * 32), reactor)
        service = NetBoxService(
            reactor,
            client,
            runner,
            journal,
            configDigest=lambda run: None,
            onRefused=self.fail,
        )
        service.startService()
        silenced: list[Any] = []
        try:
            await journal.change(
                lambda db, record: service.inventory.setStatusIn(
                    db, "w1", DeviceStatus.PLANNED
                )
            )
            await _until(lambda: stored["status"] == "planned")
            await port.stopListening()
            for protocol in list(site.open):
                transport = protocol._channel.transport
                if cut == "reset":
                    transport.abortConnection()
                else:
                    transport.stopReading()
                    silenced.append(transport)
                    site.open.discard(protocol)
            record = ServedRecord("r-1", "w1", 5.0, "10.0.0.7")
            await journal.change(
                lambda db, record_: service.inventory.releaseIn(db, record)
            )
            await deferLater(reactor, 3)
            port = await TCP4ServerEndpoint(
                reactor, number, interface="127.0.0.1"
            ).listen(site)
            back = reactor.seconds()
            await _until(lambda: stored["custom_fields"]["fleetd_release"] is not None)
            self.assertEqual(stored["status"], "staged")
            return float(reactor.seconds() - back)
        finally:
            await service.stopService()
            for protocol in list(site.open):
                protocol._channel.transport.abortConnection()
            for transport in silenced:
                transport.abortConnection()
            await port.stopListening()
            runner.stop()

    async def test_connectionsReset_pushedSoonAfterReturn(self) -> None:
        """
        [J1] NetBox stopped (connections reset) while a node fetched its
        configuration: the release reaches NetBox within 30 s of NetBox
        listening again.
        """
        self.assertLess(await self.outage("reset"), BOUND)

    async def test_connectionsCutSilently_pushedSoonAfterReturn(self) -> None:
        """
        The same with connections that die without a word (a cut link):
        the pooled connection costs one deadline, then a new one is used.
        """
        self.assertLess(await self.outage("silent"), BOUND)


async def _until(done: Any, within: float = 60.0) -> None:
    """Poll C{done()} on the real clock every 50 ms, failing after C{within}."""
    start = reactor.seconds()
    while not done():
        if reactor.seconds() - start > within:
            raise AssertionError(f"not within {within:g}s")
        await deferLater(reactor, 0.05)
