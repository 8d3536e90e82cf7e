"""
grpcio clients playing tink-agent (and tink v0.12's worker) over TLS
through fleetd's Tink proxy: blocking calls (grpcio runs its own
threads), which Twisted callers run with C{deferToThread}.

Shared by the tests and by C{fleetd-sim}, whose nodes poll the proxy
with L{getAction} and L{report} as tink-agent does in HookOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from fleetd.testing.tinkserver import SERVICE, raw
from fleetd.tink.proto import tink_agent_pb2 as agent

OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
]
RUNNING = agent.ActionStatusRequest.STATE_TYPE_RUNNING
SUCCESS = agent.ActionStatusRequest.STATE_TYPE_SUCCESS


def channel(port: int, caPEM: bytes, host: str = "localhost") -> grpc.Channel:
    """
    A TLS channel to C{host}:C{port} trusting C{caPEM}. (grpcio cannot
    choose its local address, so every agent connects from 127.0.0.1.)
    """
    credentials = grpc.ssl_channel_credentials(root_certificates=caPEM)
    return grpc.secure_channel(f"{host}:{port}", credentials, options=OPTIONS)


@dataclass
class Outcome:
    """A call's result as the client saw it."""

    code: grpc.StatusCode
    details: str | None
    responses: list[bytes]
    trailing: dict[str, Any]


def unary(
    ch: grpc.Channel,
    method: str,
    request: bytes,
    metadata: list[tuple[str, str | bytes]] | None = None,
    timeout: float = 10,
) -> Outcome:
    call = ch.unary_unary(
        SERVICE + method, request_serializer=raw, response_deserializer=raw
    )
    try:
        response, state = call.with_call(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as e:
        return Outcome(e.code(), e.details(), [], dict(e.trailing_metadata() or ()))
    return Outcome(
        grpc.StatusCode.OK, None, [response], dict(state.trailing_metadata() or ())
    )


def streaming(
    ch: grpc.Channel, method: str, request: bytes, timeout: float = 10
) -> Outcome:
    call = ch.unary_stream(
        SERVICE + method, request_serializer=raw, response_deserializer=raw
    )
    responses: list[bytes] = []
    it = call(request, timeout=timeout)
    try:
        for response in it:
            responses.append(response)
    except grpc.RpcError as e:
        return Outcome(
            e.code(), e.details(), responses, dict(e.trailing_metadata() or ())
        )
    return Outcome(
        grpc.StatusCode.OK, None, responses, dict(it.trailing_metadata() or ())
    )


def getAction(ch: grpc.Channel, mac: str) -> Any:
    """
    tink-agent's poll: the C{ActionResponse} tink-server serves C{mac}, or
    L{None} when its workflow is not running (C{FAILED_PRECONDITION}).

    @raise RuntimeError: on any other end of the call.
    """
    request = agent.ActionRequest(agent_id=mac).SerializeToString()
    polled = unary(ch, "GetAction", request)
    if polled.code == grpc.StatusCode.FAILED_PRECONDITION:
        return None
    if polled.code != grpc.StatusCode.OK:
        raise RuntimeError(f"GetAction: {polled.code.name} {polled.details}")
    return agent.ActionResponse.FromString(polled.responses[0])


def report(ch: grpc.Channel, mac: str, action: Any, running: bool) -> None:
    """
    Report C{action} (an C{ActionResponse}) RUNNING, or SUCCESS when not
    C{running}.

    @raise RuntimeError: unless tink-server answers OK.
    """
    status = agent.ActionStatusRequest(
        workflow_id=action.workflow_id,
        agent_id=mac,
        action_id=action.action_id,
        action_state=RUNNING if running else SUCCESS,
    ).SerializeToString()
    reported = unary(ch, "ReportActionStatus", status)
    if reported.code != grpc.StatusCode.OK:
        raise RuntimeError(
            f"ReportActionStatus: {reported.code.name} {reported.details}"
        )
