"""
Real grpcio peers for the tink proxy tests: a grpcio server playing
tink-server (both wire generations, h2c on loopback) and grpcio clients
playing tink-worker and tink-agent over TLS through fleetd.

grpcio runs its own threads: client calls are plain blocking functions the
tests run with C{deferToThread}; the server records what it received under
a lock and takes its answers from a script the test sets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from fleetd.tink.proto import tink_v012_pb2 as v012

SERVICE = "/proto.WorkflowService/"
Handler = Callable[[bytes, grpc.ServicerContext], Any]


def _identity(b: bytes) -> bytes:
    return b


@dataclass
class Script:
    """What the fake tink-server answers, per method (raw bytes in, raw
    bytes or an iterator of them out); it records every request."""

    unary: dict[str, Handler] = field(default_factory=dict)
    streaming: dict[str, Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]] = (
        field(default_factory=dict)
    )
    received: list[tuple[str, bytes, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, method: str, request: bytes, context: Any) -> None:
        with self.lock:
            self.received.append((method, request, dict(context.invocation_metadata())))


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
        self.server.add_generic_rpc_handlers((_Handler(self),))
        if tls is None:
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            credentials = grpc.ssl_server_credentials([tls])
            self.port = self.server.add_secure_port(f"127.0.0.1:{port}", credentials)
        self.server.start()

    def stop(self, grace: float | None = None) -> threading.Event:
        event: threading.Event = self.server.stop(grace)
        return event


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, owner: FakeTinkServer) -> None:
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
                stream, request_deserializer=_identity, response_serializer=_identity
            )
        if name in script.unary:

            def unary(request: bytes, context: Any) -> bytes:
                script.record(name, request, context)
                result: bytes = script.unary[name](request, context)
                return result

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=_identity, response_serializer=_identity
            )
        return None


def channel(port: int, caPEM: bytes) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=caPEM)
    return grpc.secure_channel(
        f"localhost:{port}",
        credentials,
        options=[
            ("grpc.max_receive_message_length", 8 << 20),
            ("grpc.max_send_message_length", 8 << 20),
        ],
    )


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
        SERVICE + method, request_serializer=_identity, response_deserializer=_identity
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
        SERVICE + method, request_serializer=_identity, response_deserializer=_identity
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


def context(workflow: str, worker: str, index: int, total: int) -> bytes:
    data: bytes = v012.WorkflowContext(
        workflow_id=workflow,
        current_worker=worker,
        current_task="install",
        current_action=f"a{index}",
        current_action_index=index,
        current_action_state=v012.STATE_PENDING,
        total_number_of_actions=total,
    ).SerializeToString()
    return data


async def provisionedDevice(service: Any, mac: str) -> Any:
    """In a started daemon (L{fleetd.service}), add worker C{w1} with
    C{mac}, let the tink proxy's device index see it and provision it;
    returns the device."""
    from fleetd.inventory.model import validateDevice

    await service.loading.whenReady()
    device = validateDevice(
        name="w1",
        serial="S1",
        uuid="00000000-0000-4000-8000-000000000001",
        macs=[mac],
        device_class="worker",
    )
    await service.inventory.add(device, journal=())
    await service.tink.devices.refresh()
    await service.runs.provision(
        [device], actor="owner:test", render=lambda d, run: b"machine: {}\n"
    )
    return device
