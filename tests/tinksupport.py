"""
A Tink proxy site for boot-completion tests: a run fleet, the proxy
observing a fake agent's gRPC calls, and the frames the agent sends.
"""

from __future__ import annotations

from google.protobuf.message import Message
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import validateDevice
from fleetd.logs import ThrottledLog
from fleetd.tink.completion import BootTracker
from fleetd.tink.metrics import TinkMetrics
from fleetd.tink.observe import WireObserver
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.workflows import DeviceIndex, WorkflowWatcher
from tests.fleetsupport import Fleet

MAC = "52:54:00:12:34:56"
SUCCESS = agent.ActionStatusRequest.STATE_TYPE_SUCCESS
RUNNING = agent.ActionStatusRequest.STATE_TYPE_RUNNING
P = "/proto.WorkflowService/"


def frame(message: Message) -> bytes:
    payload: bytes = message.SerializeToString()
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class Site:
    """A fleet with one device (MAC known), and the tink observation chain."""

    def __init__(self, test: SynchronousTestCase, action: str | None = None) -> None:
        self.test = test
        self.fleet = Fleet(test)
        self.device = validateDevice(
            name="w1",
            serial="SER1",
            uuid="00000000-0000-4000-8000-000000000001",
            macs=[MAC.upper()],
            device_class="worker",
        )
        self.fleet.add(self.device)
        (self.run,) = self.fleet.provision(self.device, action=action)
        self.build()

    def build(self) -> None:
        fleet = self.fleet
        self.metrics = TinkMetrics()
        self.tracker = BootTracker(
            clock=fleet.clock,
            runs=fleet.registry,
            runner=fleet.runner,
            journal=fleet.journal,
            alerts=fleet.alerts,
        )
        self.test.successResultOf(Deferred.fromCoroutine(self.tracker.load(["w1"])))
        index = DeviceIndex(fleet.inventory, fleet.clock)
        self.test.successResultOf(index.refresh())
        self.watcher = WorkflowWatcher(index, self.tracker)
        self.observer = WireObserver(
            self.watcher, self.metrics, ThrottledLog(fleet.clock)
        )

    def restart(self) -> None:
        self.fleet.restart()
        self.build()

    def call(
        self,
        method: str,
        connection: int,
        request: Message,
        responses: tuple[Message, ...] = (),
        status: int = 0,
    ) -> None:
        tap = self.observer(P + method, connection)
        assert tap is not None
        data = frame(request)
        for i in range(len(data)):  # split anywhere: one byte at a time
            tap.request(data[i : i + 1])
        tap.response(b"".join(frame(r) for r in responses))
        tap.finished(status)

    # tink-agent

    def agentPoll(self, connection: int, status: int = 5) -> None:
        self.call(
            "GetAction", connection, agent.ActionRequest(agent_id=MAC), (), status
        )

    def agentWorkflow(self, connection: int) -> None:
        """Two actions, both SUCCESS, then FAILED_PRECONDITION: done."""
        for action in ("a0", "a1"):
            response = agent.ActionResponse(workflow_id="ns/wf", action_id=action)
            self.call(
                "GetAction", connection, agent.ActionRequest(agent_id=MAC), (response,)
            )
            for state in (RUNNING, SUCCESS):
                report = agent.ActionStatusRequest(
                    workflow_id="ns/wf",
                    agent_id=MAC,
                    action_id=action,
                    action_state=state,
                )
                self.call(
                    "ReportActionStatus",
                    connection,
                    report,
                    (agent.ActionStatusResponse(),),
                )
        self.agentPoll(connection, status=9)

    def events(self) -> list[str]:
        return self.fleet.events("w1")
