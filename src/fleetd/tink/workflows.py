"""
What the observed Tinkerbell calls mean for a device's workflow.

L{WorkflowWatcher} turns decoded calls (L{fleetd.tink.observe}) into three
facts about a device, which it hands to an L{IBootEvents} (the boot
completion tracker):

- C{running}: an action of its workflow started;
- C{done}: its workflow finished. tink v0.9-v0.12: the last action reported
  SUCCESS, where "last" means C{current_action_index + 1 ==
  total_number_of_actions} for the action reported (positions from the
  worker's C{GetWorkflowActions} list, or from the context itself).
  tink-agent (whose API does not say which action is last): an action
  reported SUCCESS and the agent's next C{GetAction} answered
  FAILED_PRECONDITION (the server moved the workflow to POST/SUCCESS);
- C{polled}: the device's worker or agent asked for work, on which
  downstream connection (an agent that restarted, e.g. after a reboot into
  HookOS, comes on a new one); told only once tink-server answered the
  poll as the agent's own (L{fleetd.tink.observe.POLL_ENDS}) [B2].

When configured, the Workflow's state in Kubernetes is a second C{done}
(L{WorkflowWatcher.workflowFinished}, fed by L{fleetd.tink.wfstate}).

Worker and agent ids (the MAC by default) are mapped to devices through
the inventory (L{DeviceIndex}); ids that match no device are ignored, so
strangers cannot grow this state. A device added moments before its
HookOS polls (a rack added, then powered on) is found at once: an id the
index does not know asks for a new listing, each id on its own backoff.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol as TypingProtocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import Device, InventoryError, validateMAC
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.proto import tink_v012_pb2 as v012

# An unknown id asks for a new listing at its first call, again FIRST_RETRY
# later, the gap doubling to REFRESH_EVERY; whatever the ids, at most one
# listing every REFRESH_FLOOR seconds, one at a time; the last UNKNOWN_KEPT
# unknown ids are remembered (a stranger's rotating MACs cannot grow it).
REFRESH_EVERY = 30.0
FIRST_RETRY = 1.0
REFRESH_FLOOR = 1.0
UNKNOWN_KEPT = 4096
FAILED_PRECONDITION = 9
_OLD_SUCCESS = v012.STATE_SUCCESS
_OLD_RUNNING = v012.STATE_RUNNING
_AGENT_SUCCESS = agent.ActionStatusRequest.STATE_TYPE_SUCCESS
_AGENT_RUNNING = agent.ActionStatusRequest.STATE_TYPE_RUNNING


class IBootEvents(TypingProtocol):
    def running(self, device: str, workflow: str) -> None:
        """An action of C{device}'s C{workflow} started."""

    def done(
        self,
        device: str,
        workflow: str,
        connection: int,
        *,
        signal: str = "proxy",
        createdAt: float | None = None,
    ) -> None:
        """C{device}'s workflow finished; last seen on C{connection}."""

    def polled(self, device: str, connection: int) -> None:
        """C{device}'s worker or agent asked for work on C{connection}."""


class IDeviceSource(TypingProtocol):
    def list(self) -> Deferred[list[Device]]: ...


class DeviceIndex:
    """
    Worker/agent id → device name, from the inventory's MACs (and device
    names, for an C{agentID} set to one).

    Refreshed when an id is not found: an id's first miss lists the
    inventory again, so a device added seconds before its HookOS polls is
    linked to its workflow from its next call on ([B1] [B2]); the same id
    asks again after L{FIRST_RETRY} seconds, doubling to L{REFRESH_EVERY}.
    Listings are at most one at a time and L{REFRESH_FLOOR} seconds
    apart, so ids that match nothing (a stranger naming MACs) cost at most
    one listing that often.
    """

    log = Logger()

    def __init__(
        self,
        inventory: IDeviceSource,
        clock: IReactorTime,
        floor: float = REFRESH_FLOOR,
    ) -> None:
        """
        @param floor: the least seconds between two listings: more than
            L{REFRESH_FLOOR} where a listing is dear (NetBox: a walk of its
            device pages), since anyone who reaches the tink listener can
            name ids that match nothing.
        """
        self._inventory = inventory
        self._clock = clock
        self._floor = floor
        self._byId: dict[str, str] = {}
        self._refreshedAt = float("-inf")
        self._refreshing: Deferred[None] | None = None
        # unknown id -> (when it may ask for a listing again, its gap)
        self._unknown: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def refresh(self) -> Deferred[None]:
        if self._refreshing is not None:
            return self._refreshing
        self._refreshedAt = self._clock.seconds()

        def loaded(devices: list[Device]) -> None:
            index: dict[str, str] = {}
            for device in devices:
                index[device.name] = device.name
                for mac in device.macs:
                    index[mac] = device.name
            self._byId = index
            for known in [i for i in self._unknown if i in index]:
                del self._unknown[known]

        def failed(f: Failure) -> None:
            self.log.failure("tink.devices.refresh-failed", failure=f)

        def done(_: object) -> None:
            self._refreshing = None

        d = self._inventory.list().addCallbacks(loaded, failed)
        d.addBoth(done)
        if not d.called:
            self._refreshing = d
        return d

    def lookup(self, workerId: str) -> str | None:
        found = self._byId.get(workerId)  # the usual: a MAC as the index keeps it
        if found is not None:
            return found
        key = workerId.strip().lower()
        try:
            key = validateMAC(key)
        except InventoryError:
            pass
        found = self._byId.get(key)
        if found is None:
            self._missed(key)
        return found

    def _missed(self, key: str) -> None:
        """C{key} matched no device: a new listing, if its turn came and
        the last listing is done and L{REFRESH_FLOOR} old. A turn lost to
        the floor is not spent: the id's next call asks again."""
        now = self._clock.seconds()
        turn = self._unknown.get(key)
        if turn is not None and now < turn[0]:
            return
        if self._refreshing is not None or now - self._refreshedAt < self._floor:
            return
        gap = FIRST_RETRY if turn is None else min(turn[1] * 2, REFRESH_EVERY)
        self._unknown[key] = (now + gap, gap)
        self._unknown.move_to_end(key)
        while len(self._unknown) > UNKNOWN_KEPT:
            self._unknown.popitem(last=False)
        self.refresh()


@dataclass
class _OldWorkflow:
    device: str
    total: int = 0
    index: int = -1
    action: str = ""
    actions: list[tuple[str, str]] = field(default_factory=list)


class WorkflowWatcher:
    """The rules above, as an L{fleetd.tink.observe.IWorkflowEvents}."""

    def __init__(self, devices: DeviceIndex, boot: IBootEvents) -> None:
        self._devices = devices
        self._boot = boot
        self._connection: dict[str, int] = {}  # device -> last poll's connection
        self._old: dict[str, _OldWorkflow] = {}  # workflow id -> what we know
        self._agentSucceeded: dict[str, str] = {}  # device -> workflow

    def polled(self, workerId: str, connection: int) -> None:
        device = self._devices.lookup(workerId)
        if device is None:
            return
        self._boot.polled(device, connection)
        self._connection[device] = max(connection, self._connection.get(device, 0))

    # tink v0.9-v0.12

    def contexts(self, workerId: str, contexts: list[v012.WorkflowContext]) -> None:
        device = self._devices.lookup(workerId)
        if device is None:
            return
        for context in contexts:
            known = self._old.get(context.workflow_id)
            if known is None or known.device != device:
                known = self._old[context.workflow_id] = _OldWorkflow(device)
            known.total = context.total_number_of_actions
            known.index = context.current_action_index
            known.action = context.current_action

    def actionList(self, workflowId: str, actions: list[tuple[str, str]]) -> None:
        known = self._old.get(workflowId)
        if known is not None:
            known.actions = actions

    def oldReport(self, status: v012.WorkflowActionStatus) -> None:
        known = self._old.get(status.workflow_id)
        device = known.device if known is not None else None
        if device is None and status.worker_id:
            device = self._devices.lookup(status.worker_id)
        if device is None:
            return
        if status.action_status == _OLD_RUNNING:
            self._boot.running(device, status.workflow_id)
        elif status.action_status == _OLD_SUCCESS and known is not None:
            if _isLastOld(known, status.task_name, status.action_name):
                self._old.pop(status.workflow_id, None)
                self._boot.done(
                    device, status.workflow_id, self._connection.get(device, 0)
                )

    # tink-agent

    def agentReport(self, status: agent.ActionStatusRequest) -> None:
        device = self._devices.lookup(status.agent_id)
        if device is None:
            return
        if status.action_state == _AGENT_RUNNING:
            self._agentSucceeded.pop(device, None)
            self._boot.running(device, status.workflow_id)
        elif status.action_state == _AGENT_SUCCESS:
            self._agentSucceeded[device] = status.workflow_id
        else:
            self._agentSucceeded.pop(device, None)

    def actionServed(self, agentId: str, response: agent.ActionResponse) -> None:
        device = self._devices.lookup(agentId)
        if device is not None:
            self._agentSucceeded.pop(device, None)

    def actionRefused(self, agentId: str, status: int) -> None:
        device = self._devices.lookup(agentId)
        if device is None or status != FAILED_PRECONDITION:
            return
        workflow = self._agentSucceeded.pop(device, None)
        if workflow is not None:
            self._boot.done(device, workflow, self._connection.get(device, 0))

    def workflowFinished(
        self, device: str, workflow: str, createdAt: float | None
    ) -> None:
        """The Workflow C{workflow} (C{namespace/name}, as the wire names
        it) of C{device} reached POST or SUCCESS."""
        if self._agentSucceeded.get(device) == workflow:
            del self._agentSucceeded[device]  # its FAILED_PRECONDITION: no news
        self._boot.done(
            device,
            workflow,
            self._connection.get(device, 0),
            signal="kubernetes",
            createdAt=createdAt,
        )


def _isLastOld(known: _OldWorkflow, task: str, action: str) -> bool:
    """Whether (C{task}, C{action}) is the workflow's last action:
    C{current_action_index + 1 == total_number_of_actions}."""
    if known.total <= 0:
        return False
    if known.actions:
        positions = [i for i, a in enumerate(known.actions) if a == (task, action)]
        return bool(positions) and positions[-1] + 1 == known.total
    return known.action == action and known.index + 1 == known.total
