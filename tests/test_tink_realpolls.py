"""
[B2] Only real polls count: a GetAction (or GetWorkflowContexts) is a sign
of the node's agent only once tink-server answered it as it answers the
agent's own polls (grpc-status OK, NOT_FOUND or FAILED_PRECONDITION), told
when the response ends. Anyone who can reach the tink listener can name a
node's MAC; tink-server refuses a stranger (UNAUTHENTICATED), and that
refusal must not raise FleetNodeBootedHookOSAfterInstall.

At the observation level (decoded calls fed to the real observer, watcher
and boot tracker over a task.Clock), and through the whole daemon with a
grpcio agent and a grpcio tink-server stand-in that wants a bearer.
"""

from __future__ import annotations

from typing import Any

import grpc
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.h2.grpcwire import GRPCStatus
from fleetd.service import FleetdService
from fleetd.testing.tinkagent import channel, unary
from fleetd.testing.tinkserver import FakeTinkServer
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.proto import tink_v012_pb2 as v012
from tests.daemonsupport import DaemonTestMixin
from tests.tinkpeers import provisionedDevice
from tests.tinksupport import MAC, P, Site, frame

RETURNED = "boot.hookos-after-install"


def finishedSite(test: SynchronousTestCase) -> Site:
    """A site whose agent finished its workflow on connection 1, two
    minutes ago: the next real poll on a new connection is a return."""
    site = Site(test)
    site.agentWorkflow(connection=1)
    site.fleet.clock.advance(120)
    return site


class RealPollTests(SynchronousTestCase):
    """Which ends of a poll count as the agent's [B2]."""

    def test_unauthenticated_notAReturn(self) -> None:
        """[B2] A GetAction naming the node's MAC on a new connection that
        tink-server answers UNAUTHENTICATED is not the node back in HookOS:
        nothing journaled, no alert; the agent's own poll then is."""
        site = finishedSite(self)
        site.agentPoll(connection=2, status=int(GRPCStatus.UNAUTHENTICATED))
        self.assertNotIn(RETURNED, site.events())
        self.assertEqual(site.fleet.alerts.openFor("w1"), [])
        site.agentPoll(connection=3, status=int(GRPCStatus.FAILED_PRECONDITION))
        self.assertEqual(site.events().count(RETURNED), 1)

    def test_otherEnds_notCounted(self) -> None:
        """[B2] Neither fleetd's own UNAVAILABLE (tink-server unreachable),
        PERMISSION_DENIED, INVALID_ARGUMENT nor a reset call is a poll."""
        site = finishedSite(self)
        ends: list[int | None] = [
            int(GRPCStatus.UNAVAILABLE),
            int(GRPCStatus.PERMISSION_DENIED),
            int(GRPCStatus.INVALID_ARGUMENT),
            None,
        ]
        for connection, status in enumerate(ends, start=2):
            tap = site.observer(P + "GetAction", connection)
            assert tap is not None
            tap.request(frame(agent.ActionRequest(agent_id=MAC)))
            tap.finished(status)
        self.assertNotIn(RETURNED, site.events())

    def test_agentEnds_counted(self) -> None:
        """[B2] Each of the agent's own ends counts: OK (an action served),
        NOT_FOUND, FAILED_PRECONDITION."""
        for status in (0, 5, 9):
            site = finishedSite(self)
            site.agentPoll(connection=2, status=status)
            self.assertEqual(site.events().count(RETURNED), 1, status)

    def test_decidedAtTheEnd_notTheRequest(self) -> None:
        """[B2] The request alone says nothing: the poll is decided when its
        response ends (the trailers), not when the request arrives."""
        site = finishedSite(self)
        tap = site.observer(P + "GetAction", 2)
        assert tap is not None
        tap.request(frame(agent.ActionRequest(agent_id=MAC)))
        self.assertNotIn(RETURNED, site.events())
        tap.finished(int(GRPCStatus.NOT_FOUND))
        self.assertEqual(site.events().count(RETURNED), 1)

    def test_oldWorker_unauthenticated_notAReturn(self) -> None:
        """[B2] The same for a tink v0.12 worker's GetWorkflowContexts."""
        site = finishedSite(self)
        request = v012.WorkflowContextRequest(worker_id=MAC)
        site.call(
            "GetWorkflowContexts", 2, request, (), int(GRPCStatus.UNAUTHENTICATED)
        )
        self.assertNotIn(RETURNED, site.events())
        site.call("GetWorkflowContexts", 3, request, (), 0)
        self.assertEqual(site.events().count(RETURNED), 1)


class DaemonRealPollTests(DaemonTestMixin, TestCase):
    """The whole daemon: a grpcio agent and a stranger, through fleetd's
    tink listener, to a grpcio tink-server that wants the agent's bearer."""

    timeout = 60

    async def test_strangerNamingMAC_notAReturn(self) -> None:
        """[B2] [A4] After the agent's workflow ended, a stranger's GetAction
        naming the node's MAC, answered UNAUTHENTICATED by tink-server, is
        not journaled as a return to HookOS; the agent's own poll from a
        new connection is, once."""
        upstream = FakeTinkServer()
        self.addCleanup(upstream.stop, None)
        script = upstream.script
        served = agent.ActionResponse(workflow_id="ns/wf", action_id="a0")
        calls = {"GetAction": 0}

        def authorized(ctx: Any) -> None:
            metadata = dict(ctx.invocation_metadata())
            if metadata.get("authorization") != "Bearer agent":
                ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")

        def getAction(req: bytes, ctx: Any) -> bytes:
            authorized(ctx)
            calls["GetAction"] += 1
            if calls["GetAction"] == 1:
                data: bytes = served.SerializeToString()
                return data
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "Workflow not running")
            raise AssertionError("abort raises")

        def report(req: bytes, ctx: Any) -> bytes:
            authorized(ctx)
            return b""

        script.unary["GetAction"] = getAction
        script.unary["ReportActionStatus"] = report
        self.makeSettings(
            {"tink": {"upstream": f"tcp:127.0.0.1:{upstream.port}", "min_reboot": 0}}
        )
        service = self.startDaemon()
        mac = "52:54:00:00:00:01"
        await provisionedDevice(service, mac)
        ca = self.pki.public_ca.read_bytes()
        port = self.port(service, "tink")
        request = agent.ActionRequest(agent_id=mac).SerializeToString()
        token: list[tuple[str, str | bytes]] = [("authorization", "Bearer agent")]

        def workflow() -> list[grpc.StatusCode]:
            ch = channel(port, ca)
            try:
                codes = [unary(ch, "GetAction", request, token).code]
                for state in (2, 5):  # RUNNING, SUCCESS
                    status = agent.ActionStatusRequest(
                        workflow_id="ns/wf",
                        agent_id=mac,
                        action_id="a0",
                        action_state=state,  # type: ignore[arg-type]
                    ).SerializeToString()
                    codes.append(unary(ch, "ReportActionStatus", status, token).code)
                codes.append(unary(ch, "GetAction", request, token).code)
                return codes
            finally:
                ch.close()

        codes = await deferToThread(workflow)
        self.assertEqual(
            codes, [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.FAILED_PRECONDITION]
        )
        await self.waitFor(service, "boot.rebooting")

        def poll(metadata: list[tuple[str, str | bytes]] | None) -> grpc.StatusCode:
            ch = channel(port, ca)  # a new connection
            try:
                return unary(ch, "GetAction", request, metadata).code
            finally:
                ch.close()

        for _ in range(3):
            code = await deferToThread(poll, None)
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED)
        # The journal runs its work in submission order: this query comes
        # after anything the stranger's polls (observed before their
        # trailers reached the client) could have asked it to record.
        events = [e.event for e in await service.journal.query(device="w1")]
        self.assertNotIn(RETURNED, events)
        self.assertEqual(service.alerts.openFor("w1"), [])

        code = await deferToThread(poll, token)
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        events = await self.waitFor(service, RETURNED)
        self.assertEqual(events.count(RETURNED), 1)
        self.assertEqual(
            service.alerts.openFor("w1"), ["FleetNodeBootedHookOSAfterInstall"]
        )

    async def waitFor(self, service: FleetdService, event: str) -> list[str]:
        for _ in range(500):
            entries = await service.journal.query(device="w1")
            events = [e.event for e in entries]
            if event in events:
                return events
            await deferLater(reactor, 0.01, lambda: None)
        self.fail(f"{event} never journaled")
