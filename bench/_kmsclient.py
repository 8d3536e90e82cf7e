"""
A light client of fleetd's kms listener for C{bench/kms.py}: asyncio,
C{ssl} and the C{h2} state machine, one coroutine per node, each
connection bound to the node's own loopback address ([E1] answers a node
only from its own address; grpcio cannot bind a source address). It
speaks what Talos's grpc-go client sends: a TLS connection with ALPN h2
and SNI the enrollment name, a POST of one length-prefixed
C{sidero.kms.Request} with C{te: trailers} and C{grpc-timeout}, and reads
the C{Response} and the C{grpc-status} (in the trailers, or Trailers-Only).
It costs far less per call than a grpcio channel in Python, and what is
measured of fleetd is its own CPU (C{/proc}), not this client's.

Also the Talos config fetch of the same nodes (C{GET /config} over a new
TLS connection, HTTP/1.1, C{Connection: close}), from the same addresses.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from fleetd.kms.proto import kms_pb2

SERVICE = kms_pb2.DESCRIPTOR.services_by_name["KMSService"].full_name
SEAL, UNSEAL = f"/{SERVICE}/Seal", f"/{SERVICE}/Unseal"
TIMEOUT = 10.0  # seconds Talos gives a call
USER_AGENT = "grpc-go/1.79.3"  # Talos v1.13's


def kmsContext(ca: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    return context


def bootContext(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


@dataclass
class Answer:
    """One call's end: C{status} is the gRPC status (-1: none, the
    connection failed), C{data} the Response's, C{seconds} from the
    connect (or the call's start on a kept connection) to its end."""

    status: int
    message: str
    data: bytes
    seconds: float


class KMSConnection:
    """One TLS + HTTP/2 connection from C{source}; calls one at a time."""

    def __init__(self, port: int, context: ssl.SSLContext, name: str, source: str):
        self.port, self.context, self.name, self.source = port, context, name, source
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=self.context, server_hostname=self.name,
            local_addr=(self.source, 0),
        )  # fmt: skip
        self.h2.initiate_connection()
        self.writer.write(self.h2.data_to_send())

    async def call(self, path: str, uuid: str, data: bytes) -> Answer:
        """One unary call on this connection."""
        assert self.reader is not None and self.writer is not None
        started = time.monotonic()
        message = kms_pb2.Request(node_uuid=uuid, data=data).SerializeToString()
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, [
            (":method", "POST"), (":scheme", "https"), (":path", path),
            (":authority", f"{self.name}:{self.port}"),
            ("content-type", "application/grpc"), ("te", "trailers"),
            ("grpc-timeout", f"{int(TIMEOUT * 1000)}m"), ("user-agent", USER_AGENT),
        ])  # fmt: skip
        framed = b"\x00" + len(message).to_bytes(4, "big") + message
        self.h2.send_data(stream, framed, end_stream=True)
        self.writer.write(self.h2.data_to_send())
        body, status, text = b"", -1, ""
        ended = False
        while not ended:
            chunk = await self.reader.read(65536)
            if not chunk:
                text = text or "the connection closed before the answer"
                break
            for event in self.h2.receive_data(chunk):
                if isinstance(
                    event, h2.events.ResponseReceived | h2.events.TrailersReceived
                ):
                    headers = dict(event.headers)
                    if b"grpc-status" in headers:
                        status = int(headers[b"grpc-status"])
                        text = headers.get(b"grpc-message", b"").decode()
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    self.h2.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                elif isinstance(event, h2.events.StreamEnded):
                    ended = event.stream_id == stream
                elif isinstance(event, h2.events.StreamReset):
                    ended = event.stream_id == stream
                    text = text or f"RST_STREAM {event.error_code!r}"
                elif isinstance(event, h2.events.ConnectionTerminated):
                    ended, text = True, text or f"GOAWAY {event.error_code!r}"
            self.writer.write(self.h2.data_to_send())
        data = b""
        if status == 0 and len(body) >= 5:
            data = kms_pb2.Response.FromString(body[5:]).data
        return Answer(status, text, data, time.monotonic() - started)

    def close(self) -> None:
        if self.writer is not None:
            self.h2.close_connection()
            self.writer.write(self.h2.data_to_send())
            self.writer.close()


async def oneCall(
    port: int, context: ssl.SSLContext, name: str, source: str,
    path: str, uuid: str, data: bytes,
) -> Answer:  # fmt: skip
    """A call on a new connection, as a booting Talos makes it; its
    C{seconds} count the TCP and TLS handshakes."""
    started = time.monotonic()
    connection = KMSConnection(port, context, name, source)
    try:
        await asyncio.wait_for(connection.open(), TIMEOUT)
        answer = await asyncio.wait_for(connection.call(path, uuid, data), TIMEOUT)
    except (OSError, ssl.SSLError, TimeoutError, h2.exceptions.ProtocolError) as e:
        return Answer(-1, f"{type(e).__name__}: {e}", b"", time.monotonic() - started)
    finally:
        connection.close()
    answer.seconds = time.monotonic() - started
    return answer


async def fetchConfig(
    port: int, context: ssl.SSLContext, name: str, source: str, path: str
) -> Answer:
    """Talos's C{GET path} on the boot listener over a new TLS connection
    from C{source}: the HTTP status (-1: no answer, C{message} says why)
    and the seconds."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname=name,
                local_addr=(source, 0),
            ),
            30,
        )  # fmt: skip
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode()
        )
        raw = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        status = int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/") else -1
        message = "" if status != -1 else f"no HTTP answer: {raw[:40]!r}"
    except (OSError, ssl.SSLError, TimeoutError, ValueError, IndexError) as e:
        status, message = -1, f"{type(e).__name__}: {e}"
    return Answer(status, message, b"", time.monotonic() - started)
