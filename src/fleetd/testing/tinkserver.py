"""
A grpcio server playing tink-server, the Tink proxy's upstream: h2c (or
TLS) on loopback, answering C{/proto.WorkflowService/*} for both wire
generations (tink-agent's and tink v0.12's worker).

Two ways to answer: a L{Script} of raw handlers per method (tests set
exactly what the upstream says), or L{Workflows}, which gives each agent
(named by its MAC, as tink-agent names itself) a workflow of actions and
plays it out the way tink-server does: C{GetAction} serves the next
action, C{ReportActionStatus} records its states, and once every action
succeeded C{GetAction} ends C{FAILED_PRECONDITION} ("workflow not
running"); an agent with no workflow gets C{NOT_FOUND}.

grpcio runs its own threads: the server records what it received under a
lock. Shared by the tests and by C{fleetd-sim}.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from fleetd.tink.proto import tink_agent_pb2 as agent

SERVICE = "/proto.WorkflowService/"
Handler = Callable[[bytes, grpc.ServicerContext], Any]
StreamHandler = Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]
SUCCESS = agent.ActionStatusRequest.STATE_TYPE_SUCCESS


def raw(b: bytes) -> bytes:
    """grpcio's (de)serializer for messages kept as bytes."""
    return b


@dataclass
class Script:
    """What the stand-in answers, per method (raw bytes in, raw bytes or
    an iterator of them out); it records every request."""

    unary: dict[str, Handler] = field(default_factory=dict)
    streaming: dict[str, StreamHandler] = field(default_factory=dict)
    received: list[tuple[str, bytes, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, method: str, request: bytes, context: Any) -> None:
        with self.lock:
            self.received.append((method, request, dict(context.invocation_metadata())))


class Scripted(Protocol):
    """Anything holding a L{Script} (the server, or a bench's stand-in)."""

    script: Script


class FakeTinkServer:
    """A grpcio server answering /proto.WorkflowService/* from a L{Script}."""

    def __init__(self, port: int = 0, tls: tuple[bytes, bytes] | None = None) -> None:
        """h2c on loopback, or TLS with C{tls} = (key PEM, cert PEM)."""
        self.script = Script()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            options=[
                ("grpc.max_receive_message_length", 8 << 20),
                ("grpc.max_send_message_length", 8 << 20),
            ],
        )
        self.server.add_generic_rpc_handlers((ScriptHandler(self),))
        if tls is None:
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            credentials = grpc.ssl_server_credentials([tls])
            self.port = self.server.add_secure_port(f"127.0.0.1:{port}", credentials)
        self.server.start()

    def stop(self, grace: float | None = None) -> threading.Event:
        event: threading.Event = self.server.stop(grace)
        return event


class ScriptHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """grpcio's generic handler over the L{Script} of C{owner}."""

    def __init__(self, owner: Scripted) -> None:
        self.owner = owner

    def service(self, details: Any) -> Any:
        method = details.method
        if not method.startswith(SERVICE):
            return None
        name = method[len(SERVICE) :]
        script = self.owner.script

        if name in script.streaming:

            def stream(request: bytes, context: Any) -> Iterator[bytes]:
                script.record(name, request, context)
                yield from script.streaming[name](request, context)

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=raw, response_serializer=raw
            )
        if name in script.unary:

            def unary(request: bytes, context: Any) -> bytes:
                script.record(name, request, context)
                result: bytes = script.unary[name](request, context)
                return result

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=raw, response_serializer=raw
            )
        return None


@dataclass
class _Played:
    """One agent's workflow: its actions, and how far it got."""

    workflow: str
    actions: list[str]
    done: int = 0
    states: list[tuple[str, int]] = field(default_factory=list)
    started: bool = False


class Workflows:
    """
    tink-server's side of tink-agent's protocol, one workflow per agent,
    installed on a L{FakeTinkServer}'s script.
    """

    def __init__(
        self,
        server: FakeTinkServer,
        onState: Callable[[str, str], None] | None = None,
    ) -> None:
        """
        @param onState: told (on grpcio's thread) each state the workflow
            reaches as tink-server moves its Workflow: RUNNING at the first
            action, POST then SUCCESS once the last one succeeded.
        """
        self._onState = onState
        self._lock = threading.Lock()
        self._played: dict[str, _Played] = {}
        server.script.unary["GetAction"] = self._getAction
        server.script.unary["ReportActionStatus"] = self._report

    def add(self, mac: str, workflow: str, actions: Sequence[str]) -> None:
        """Give the agent C{mac} the workflow C{workflow} of C{actions}."""
        with self._lock:
            self._played[mac.lower()] = _Played(workflow, list(actions))

    def finished(self, mac: str) -> bool:
        """Whether every action of C{mac}'s workflow reported SUCCESS."""
        with self._lock:
            played = self._played.get(mac.lower())
            return played is not None and played.done == len(played.actions)

    def _getAction(self, request: bytes, context: Any) -> bytes:
        mac = agent.ActionRequest.FromString(request).agent_id.lower()
        with self._lock:
            played = self._played.get(mac)
            if played is not None and played.done < len(played.actions):
                data: bytes = agent.ActionResponse(
                    workflow_id=played.workflow,
                    action_id=played.actions[played.done],
                    name=played.actions[played.done],
                ).SerializeToString()
                return data
        if played is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no workflow for this agent")
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "workflow not running")
        raise AssertionError("abort raises")

    def _report(self, request: bytes, context: Any) -> bytes:
        report = agent.ActionStatusRequest.FromString(request)
        with self._lock:
            played = self._played.get(report.agent_id.lower())
            if played is None or played.done >= len(played.actions):
                context.abort(grpc.StatusCode.NOT_FOUND, "no such action")
                raise AssertionError("abort raises")
            if report.action_id != played.actions[played.done]:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "not the current action"
                )
                raise AssertionError("abort raises")
            played.states.append((report.action_id, int(report.action_state)))
            moves = [] if played.started else ["RUNNING"]
            played.started = True
            if report.action_state == SUCCESS:
                played.done += 1
                if played.done == len(played.actions):
                    moves += ["POST", "SUCCESS"]
            workflow = played.workflow
        if self._onState is not None:
            for state in moves:
                self._onState(workflow, state)
        data: bytes = agent.ActionStatusResponse().SerializeToString()
        return data


def realisticAction(size: int = 1668) -> bytes:
    """
    What tink-server answers C{GetAction} with for the image2disk action of
    a Talos install (tink-agent's C{ActionResponse}), padded to exactly
    C{size} bytes by a machine-config patch in its environment: answers of
    this size are what a reader that never opens its window leaves queued
    in the proxy.
    """
    filler = base64.b64encode(bytes(range(256)) * (size // 256 + 1)).decode()

    def build(pad: int) -> bytes:
        data: bytes = agent.ActionResponse(
            workflow_id="tink-system/talos-worker-g1-00042",
            task_id="os-installation",
            agent_id="52:54:00:12:34:56",
            action_id="tink-system/talos-worker-g1-00042/os-installation/0",
            name="stream-talos-image",
            image="ghcr.io/tinkerbell/actions/image2disk:v1.0.0",
            timeout=900,
            volumes=[
                "/dev:/dev",
                "/dev/console:/dev/console",
                "/lib/firmware:/lib/firmware:ro",
            ],
            environment=[
                "DEST_DISK=/dev/nvme0n1",
                "IMG_URL=https://images.example:8080/talos/v1.9.5/metal-amd64.raw.zst",
                "COMPRESSED=true",
                "TALOS_CONFIG_PATCH=" + filler[:pad],
            ],
            pid="host",
        ).SerializeToString()
        return data

    pad = size - len(build(0))
    while len(build(pad)) > size:  # the patch's length took a second byte
        pad -= 1
    action = build(pad)
    assert len(action) == size, len(action)
    return action
