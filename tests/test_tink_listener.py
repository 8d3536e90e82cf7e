"""Tests for the tink listener's HTTP/2 server protocol ([A4])."""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAckReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from OpenSSL import crypto
from twisted.internet import ssl as tssl
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.tink import (
    GRPCStatus,
    H2ServerProtocol,
    IStreamHandler,
    StreamResponder,
    TinkListenerFactory,
    UnimplementedHandler,
    encodeGrpcMessage,
)
from fleetd.tink.h2server import Headers, MessageSizeGuard

E = TypeVar("E", bound=Event)
PATH = b"/proto.WorkflowService/GetAction"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def grpcHeaders(
    path: bytes = PATH,
    method: bytes = b"POST",
    contentType: bytes = b"application/grpc",
) -> Headers:
    return [
        (b":method", method),
        (b":scheme", b"https"),
        (b":path", path),
        (b":authority", b"localhost"),
        (b"te", b"trailers"),
        (b"content-type", contentType),
        (b"user-agent", b"grpc-test"),
    ]


def grpcMessage(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class RecordingHandler:
    """A handler that records calls and answers only when told to."""

    def __init__(self, responder: StreamResponder) -> None:
        self.responder = responder
        self.calls: list[tuple[str, object]] = []
        self.received = 0

    def headersReceived(self, headers: Headers) -> None:
        self.calls.append(("headers", dict(headers)[b":path"]))

    def dataReceived(self, data: bytes) -> None:
        self.received += len(data)

    def endReceived(self) -> None:
        self.calls.append(("end", self.received))

    def reset(self, errorCode: int) -> None:
        self.calls.append(("reset", errorCode))


class Harness:
    """A server protocol on a StringTransport talking to an h2 client."""

    def __init__(
        self,
        handlerFactory: Callable[[StreamResponder], IStreamHandler] = (
            UnimplementedHandler
        ),
        byteWise: bool = False,
        handshake: bool = True,
        clientConfig: H2Configuration | None = None,
        **limits: Any,
    ) -> None:
        self.handlers: list[Any] = []

        def factory(responder: StreamResponder) -> IStreamHandler:
            handler = handlerFactory(responder)
            self.handlers.append(handler)
            return handler

        self.clock = Clock()
        self.server = H2ServerProtocol(factory, clock=self.clock, **limits)
        self.transport = StringTransport()
        self.server.makeConnection(self.transport)
        self.client = H2Connection(
            clientConfig or H2Configuration(client_side=True, header_encoding=None)
        )
        self.client.initiate_connection()
        self.byteWise = byteWise
        self.events: list[Event] = []
        if handshake:
            self.pump()

    def feed(self, data: bytes) -> None:
        if self.byteWise:
            for i in range(len(data)):
                self.server.dataReceived(data[i : i + 1])
        else:
            self.server.dataReceived(data)

    def pump(self) -> list[Event]:
        new: list[Event] = []
        while True:
            out = self.client.data_to_send()
            if out:
                self.feed(out)
            back = self.transport.value()
            self.transport.clear()
            if back:
                new += self.client.receive_data(back)
            if not out and not back:
                break
        self.events += new
        return new

    def call(
        self, headers: Headers | None = None, body: bytes = b"", end: bool = True
    ) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, headers or grpcHeaders())
        if body or end:
            self.client.send_data(sid, body, end_stream=end)
        return sid

    def response(self, sid: int) -> dict[bytes, bytes]:
        [event] = [
            e
            for e in self.events
            if isinstance(e, ResponseReceived) and e.stream_id == sid
        ]
        assert isinstance(event, ResponseReceived)
        return dict(event.headers)  # type: ignore[arg-type]

    def of(self, kind: type[E], sid: int | None = None) -> list[E]:
        found = [e for e in self.events if isinstance(e, kind)]
        if sid is None:
            return found
        return [e for e in found if getattr(e, "stream_id", None) == sid]

    def close(self) -> None:
        self.server.connectionLost(None)
