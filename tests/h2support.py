"""
HTTP/2 test rigs for the Tink listener and proxy: a server-side harness
over a StringTransport, gRPC framing, the proxy site with a fake upstream
endpoint, the abuse guards, and a self-signed certificate.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    Event,
    RequestReceived,
    ResponseReceived,
)
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from fleetd.h2.conn import DrainingH2Connection
from fleetd.h2.guard import H2Limits
from fleetd.h2.listener import UnimplementedHandler, proxyFactory
from fleetd.h2.server import H2ServerProtocol
from fleetd.h2.stream import Headers, IStreamHandler, StreamResponder
from fleetd.h2.upstream import UpstreamPool
from fleetd.logs import ThrottledLog
from fleetd.tink.metrics import TinkMetrics

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
        server: H2ServerProtocol | None = None,
        **limits: Any,
    ) -> None:
        self.handlers: list[Any] = []

        def factory(responder: StreamResponder) -> IStreamHandler:
            handler = handlerFactory(responder)
            self.handlers.append(handler)
            return handler

        self.clock = Clock()
        self.server = server or H2ServerProtocol(factory, clock=self.clock, **limits)
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
        return dict(event.headers)

    def of(self, kind: type[E], sid: int | None = None) -> list[E]:
        found = [e for e in self.events if isinstance(e, kind)]
        if sid is None:
            return found
        return [e for e in found if getattr(e, "stream_id", None) == sid]

    def close(self) -> None:
        self.server.connectionLost(None)


def selfSignedCertificate() -> tuple[bytes, bytes]:
    """A throwaway ECDSA P-256 certificate for localhost: (key, cert) PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    keyPEM = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return keyPEM, cert.public_bytes(serialization.Encoding.PEM)


OK_TRAILERS = [(b"grpc-status", b"0")]


class FakeEndpoint:
    """Connects synchronously to a new in-memory tink-server."""

    def __init__(self, site: Site) -> None:
        self.site = site

    def connect(self, factory: Any) -> Deferred[Any]:
        if self.site.upstreamDown:
            return fail(ConnectionRefusedError())
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        # Like grpc-go's GracefulStop: GOAWAY, then finish what was taken.
        server = DrainingH2Connection(
            H2Configuration(client_side=False, header_encoding=None)
        )
        server.initiate_connection()
        self.site.upstreams.append((protocol, transport, server, []))
        return succeed(protocol)


class Site:
    """Client ↔ proxy ↔ tink-server, pumped by hand."""

    def __init__(self, **limits: Any) -> None:
        self.clock = Clock()
        self.upstreamDown = False
        self.upstreams: list[
            tuple[Any, StringTransport, DrainingH2Connection, list[Event]]
        ] = []
        self.metrics = TinkMetrics()
        self.pool = UpstreamPool(
            self.clock,
            lambda: FakeEndpoint(self),  # type: ignore[arg-type,return-value]
            log=ThrottledLog(self.clock),
            metrics=self.metrics,
        )
        self.factory = proxyFactory(self.clock, self.pool, self.metrics, **limits)
        self.clients: list[
            tuple[H2ServerProtocol, StringTransport, H2Connection, list[Event]]
        ] = []
        self.connect()

    def connect(self) -> int:
        proxy = self.factory.buildProtocol(None)
        transport = StringTransport()
        proxy.makeConnection(transport)
        # Like grpc-go, the client keeps its streams going after a GOAWAY.
        client = DrainingH2Connection(
            H2Configuration(client_side=True, header_encoding=None)
        )
        client.initiate_connection()
        self.clients.append((proxy, transport, client, []))
        self.pump()
        return len(self.clients) - 1

    @property
    def client(self) -> H2Connection:
        return self.clients[0][2]

    @property
    def server(self) -> DrainingH2Connection:
        return self.upstreams[-1][2]

    def clientEvents(self, index: int = 0) -> list[Event]:
        return self.clients[index][3]

    def serverEvents(self, index: int = -1) -> list[Event]:
        return self.upstreams[index][3]

    def pump(self) -> None:
        for _ in range(1000):
            moved = False
            for proxy, transport, client, events in self.clients:
                out = client.data_to_send()
                if out and not transport.disconnecting:
                    proxy.dataReceived(out)
                    moved = True
                back = transport.value()
                transport.clear()
                if back:
                    events += client.receive_data(back)
                    moved = True
            for protocol, transport, server, events in self.upstreams:
                out = transport.value()
                transport.clear()
                if out:
                    events += server.receive_data(out)
                    moved = True
                back = server.data_to_send()
                if (
                    back
                    and protocol.transport is not None
                    and not transport.disconnecting
                ):
                    protocol.dataReceived(back)
                    moved = True
            if not moved:
                return
        raise AssertionError("pump did not settle")

    def call(self, body: bytes = b"x", end: bool = True, index: int = 0) -> int:
        client = self.clients[index][2]
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, grpcHeaders())
        if body or end:
            client.send_data(sid, grpcMessage(body) if body else b"", end_stream=end)
        self.pump()
        return sid

    def upstreamSid(self, nth: int = 0, index: int = -1) -> int:
        requests = [
            e for e in self.serverEvents(index) if isinstance(e, RequestReceived)
        ]
        sid: int = requests[nth].stream_id
        return sid

    def answer(self, usid: int, payload: bytes = b"ok", index: int = -1) -> None:
        server = self.upstreams[index][2]
        server.send_headers(
            usid, [(b":status", b"200"), (b"content-type", b"application/grpc")]
        )
        server.send_data(usid, grpcMessage(payload))
        server.send_headers(usid, OK_TRAILERS, end_stream=True)
        self.pump()

    def of(self, kind: type, sid: int | None = None, index: int = 0) -> list[Any]:
        return [
            e
            for e in self.clientEvents(index)
            if isinstance(e, kind)
            and (sid is None or getattr(e, "stream_id", None) == sid)
        ]


CALM = "tink.h2.enhance-your-calm {reason}"


def counted(metrics: TinkMetrics, kind: str) -> float:
    value: float = metrics.h2Abuse.labels(kind)._value.get()
    return value


def calm(h: Harness) -> list[ConnectionTerminated]:
    return [
        e
        for e in h.of(ConnectionTerminated)
        if e.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    ]


def guarded(limits: H2Limits, handler: Any = RecordingHandler, **kw: Any) -> Harness:
    """A L{Harness} whose server counts abuse in C{h.metrics}."""
    metrics = TinkMetrics()
    h = Harness(handler, handshake=False, limits=limits, **kw)
    h.server.countAbuse = metrics.abuse
    h.metrics = metrics  # type: ignore[attr-defined]
    h.pump()
    return h
