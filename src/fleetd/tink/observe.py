"""
Observation, never alteration, of the Tinkerbell calls passing the proxy
(design.md, wire contract "Tink proxy").

A L{CallTap} gets copies of one call's bytes each way, reassembles the
gRPC length-prefixed messages across DATA frames (and messages split over
frames), decodes them with the protobuf runtime from the project's
C{.proto} files, and reports what they say to an L{IWorkflowEvents}.
Compressed messages and messages above the observation limit pass through
undecoded (counted); a message that does not decode is counted and
ignored. Nothing here can change or delay a byte: the proxy forwards
before it hands copies over, and a tap that raises is a bug that is logged.

Two wire generations share C{/proto.WorkflowService/} and the method name
C{ReportActionStatus}; they are told apart by the other methods seen on the
same connection (C{GetWorkflowContexts}/C{GetWorkflowActions}: tink
v0.9-v0.12; C{GetAction}: tink-agent), and failing that by the wire types
of the fields the two C{ReportActionStatus} requests disagree on.

What a call means is decided when it ends, from the final grpc-status the
proxy hands over (the trailers): a report counts only if tink-server
accepted it, and a poll (C{GetAction}, C{GetWorkflowContexts}) only if
tink-server answered it as it answers the agent's own polls (OK, NOT_FOUND,
FAILED_PRECONDITION). Anyone can name a node's MAC in a request; a stranger
that tink-server refuses (UNAUTHENTICATED) is not the node back in HookOS
[B2].
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol as TypingProtocol

from google.protobuf.message import DecodeError, Message

from fleetd.logs import ThrottledLog
from fleetd.tink.metrics import TinkMetrics
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.proto import tink_v012_pb2 as v012

PREFIX = "/proto.WorkflowService/"
OLD, AGENT = "v012", "agent"
OBSERVE_LIMIT = 1 << 20  # larger messages are forwarded, not decoded
# How tink-server ends the agent's (or worker's) own polls: an action served
# (or the contexts streamed), nothing to do, the workflow not running [B2].
POLL_ENDS = frozenset({0, 5, 9})  # OK, NOT_FOUND, FAILED_PRECONDITION
_REMEMBERED_CONNECTIONS = 4096


class MessageReader:
    """Reassemble gRPC messages (1-byte flag, 4-byte length, payload) from
    chunks cut anywhere."""

    def __init__(self, limit: int = OBSERVE_LIMIT) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._skip = 0  # bytes left of a message too large to keep

    def feed(self, data: bytes) -> list[tuple[bool, bytes | None]]:
        """Complete messages: (compressed, payload), payload L{None} when
        it was over the limit."""
        if not self._buffer and not self._skip and len(data) >= 5:
            # The usual: a DATA frame holding exactly one whole message.
            length = int.from_bytes(data[1:5], "big")
            if len(data) == length + 5 and length <= self._limit:
                return [(data[0] != 0, bytes(data[5:]))]
        out: list[tuple[bool, bytes | None]] = []
        view = memoryview(data)
        while view:
            if self._skip:
                step = min(self._skip, len(view))
                self._skip -= step
                view = view[step:]
                continue
            need = 5 - len(self._buffer) if len(self._buffer) < 5 else 0
            if need:
                self._buffer += view[:need]
                view = view[need:]
                if len(self._buffer) < 5:
                    break
            compressed = self._buffer[0] != 0
            length = int.from_bytes(self._buffer[1:5], "big")
            if length > self._limit:
                self._buffer.clear()
                self._skip = length
                out.append((compressed, None))
                continue
            take = min(length + 5 - len(self._buffer), len(view))
            self._buffer += view[:take]
            view = view[take:]
            if len(self._buffer) == length + 5:
                out.append((compressed, bytes(self._buffer[5:])))
                self._buffer.clear()
        return out


def guessReportGeneration(payload: bytes) -> str | None:
    """Which C{ReportActionStatus} request C{payload} is, from the wire types
    of fields 4 and 6 (old: enum 4, string 6, string 8; agent: string 4,
    enum 6, message 10)."""
    offset, end = 0, len(payload)
    try:
        while offset < end:
            key, offset = _varint(payload, offset)
            number, wireType = key >> 3, key & 7
            if (number, wireType) in ((4, 0), (6, 2), (8, 2)):
                return OLD
            if (number, wireType) in ((4, 2), (6, 0), (10, 2)):
                return AGENT
            if wireType == 0:
                _, offset = _varint(payload, offset)
            elif wireType == 2:
                length, offset = _varint(payload, offset)
                offset += length
            elif wireType == 1:
                offset += 8
            elif wireType == 5:
                offset += 4
            else:
                return None
    except IndexError:
        return None
    return None


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


class IWorkflowEvents(TypingProtocol):
    """What the decoded calls say (see L{fleetd.tink.workflows})."""

    def polled(self, workerId: str, connection: int) -> None:
        """A worker (GetWorkflowContexts) or agent (GetAction) asked for work
        and tink-server answered as it answers their own polls (L{POLL_ENDS}),
        told when the call ended [B2]."""

    def contexts(self, workerId: str, contexts: list[v012.WorkflowContext]) -> None:
        """tink-server's workflow contexts for a v0.12 worker."""

    def actionList(self, workflowId: str, actions: list[tuple[str, str]]) -> None:
        """A v0.12 workflow's actions as (task, action), in order."""

    def oldReport(self, status: v012.WorkflowActionStatus) -> None:
        """A v0.12 worker's action status (as sent; success not yet known)."""

    def agentReport(self, status: agent.ActionStatusRequest) -> None:
        """A tink-agent action status (as sent)."""

    def actionServed(self, agentId: str, response: agent.ActionResponse) -> None:
        """GetAction gave the agent an action."""

    def actionRefused(self, agentId: str, status: int) -> None:
        """GetAction ended with gRPC C{status} (NOT_FOUND, FAILED_PRECONDITION...)."""


class WireObserver:
    """Builds a L{CallTap} per Tinkerbell call (the proxy's tap factory)."""

    def __init__(
        self, events: IWorkflowEvents, metrics: TinkMetrics, log: ThrottledLog
    ) -> None:
        self.events = events
        self.metrics = metrics
        self.log = log
        self._generation: OrderedDict[int, str] = OrderedDict()

    def __call__(self, path: str, connection: int) -> CallTap | None:
        if not path.startswith(PREFIX):
            return None
        method = path[len(PREFIX) :]
        if method in ("GetWorkflowContexts", "GetWorkflowActions"):
            self._remember(connection, OLD)
        elif method == "GetAction":
            self._remember(connection, AGENT)
        elif method != "ReportActionStatus":
            return None
        return CallTap(self, method, connection)

    def _remember(self, connection: int, generation: str) -> None:
        self._generation[connection] = generation
        self._generation.move_to_end(connection)
        while len(self._generation) > _REMEMBERED_CONNECTIONS:
            self._generation.popitem(last=False)

    def generation(self, connection: int) -> str | None:
        return self._generation.get(connection)


class CallTap:
    """One call's observer: reassembles, decodes, reports."""

    def __init__(self, owner: WireObserver, method: str, connection: int) -> None:
        self._owner = owner
        self._method = method
        self._connection = connection
        self._requests = MessageReader()
        self._responses = MessageReader()
        self._request: Message | None = None
        self._workerId = ""
        self._poll = False  # the request asked for work; counted at the end

    def request(self, data: bytes) -> None:
        for compressed, payload in self._requests.feed(data):
            message = self._decode(compressed, payload, request=True)
            if message is not None:
                self._onRequest(message)

    def response(self, data: bytes) -> None:
        for compressed, payload in self._responses.feed(data):
            message = self._decode(compressed, payload, request=False)
            if message is not None:
                self._onResponse(message)

    def finished(self, status: int | None) -> None:
        events = self._owner.events
        if self._poll and status in POLL_ENDS:
            # Only tink-server's answer says the caller is the node's agent:
            # anyone can name a MAC, and a stranger is refused [B2].
            events.polled(self._workerId, self._connection)
        if self._method == "ReportActionStatus" and status == 0:
            # Only a report tink-server accepted says anything.
            if isinstance(self._request, v012.WorkflowActionStatus):
                events.oldReport(self._request)
            elif isinstance(self._request, agent.ActionStatusRequest):
                events.agentReport(self._request)
        elif self._method == "GetAction" and status and self._workerId:
            events.actionRefused(self._workerId, status)

    def _type(self, request: bool, payload: bytes) -> type[Message] | None:
        method = self._method
        if method == "GetWorkflowContexts":
            return v012.WorkflowContextRequest if request else v012.WorkflowContext
        if method == "GetWorkflowActions":
            return v012.WorkflowActionsRequest if request else v012.WorkflowActionList
        if method == "GetAction":
            return agent.ActionRequest if request else agent.ActionResponse
        if not request:  # Empty / ActionStatusResponse: nothing to learn
            return None
        generation = self._owner.generation(self._connection)
        generation = generation or guessReportGeneration(payload)
        if generation == OLD:
            return v012.WorkflowActionStatus
        if generation == AGENT:
            return agent.ActionStatusRequest
        return None

    def _decode(
        self, compressed: bool, payload: bytes | None, request: bool
    ) -> Message | None:
        metrics = self._owner.metrics
        if payload is None:
            metrics.undecoded.labels("too-large").inc()
            return None
        if compressed:
            metrics.undecoded.labels("compressed").inc()
            return None
        kind = self._type(request, payload)
        if kind is None:
            return None
        message = kind()
        try:
            message.ParseFromString(payload)
        except DecodeError:
            metrics.decodeFailures.labels(PREFIX + self._method).inc()
            self._owner.log.warn(
                "tink.observe.decode-failed {method}", method=self._method
            )
            return None
        return message

    def _onRequest(self, message: Message) -> None:
        if isinstance(message, v012.WorkflowContextRequest):
            self._workerId = message.worker_id
            self._poll = True
        elif isinstance(message, agent.ActionRequest):
            self._workerId = message.agent_id
            self._poll = True
        elif isinstance(message, v012.WorkflowActionsRequest):
            self._workerId = message.workflow_id
        elif isinstance(message, v012.WorkflowActionStatus):
            self._request = message
        elif isinstance(message, agent.ActionStatusRequest):
            self._request = message

    def _onResponse(self, message: Message) -> None:
        events = self._owner.events
        if isinstance(message, v012.WorkflowContext):
            events.contexts(self._workerId, [message])
        elif isinstance(message, v012.WorkflowActionList):
            events.actionList(
                self._workerId, [(a.task_name, a.name) for a in message.action_list]
            )
        elif isinstance(message, agent.ActionResponse):
            events.actionServed(self._workerId, message)
