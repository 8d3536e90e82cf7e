"""
A bench floor, not product code: the thinnest HTTP/2 gRPC unary proxy on
Twisted and ``h2`` that stays correct for C{bench/tink_proxy.py}'s traffic,
to show what any proxy built on those two costs per call (as
C{bench/boot_storm.py}'s "minimal twisted.web" server does for the boot
listener). No observation, metrics, limits, timeouts or logging.

Downstream: TLS with ALPN h2 and the given certificate. Upstream: one h2c
connection (prior knowledge) at a time. Per-hop stream mapping; request
headers and data, response headers, data and trailers forwarded as
received (C{stream_ended} on each event carries END_STREAM across), data
as the receiving side's windows allow, and flow-control credit returned
(C{acknowledge_received_data}) as it is forwarded. Both hops use fleetd's
C{H2Configuration} flags, TCP_NODELAY, and one C{transport.write} per
connection per C{dataReceived}. C{--memo} gives every connection fleetd's
remembered HPACK coders and header validation (L{fleetd.h2.memo}).

What the bench needs beyond that, and nothing else: nginx, the upstream,
sends GOAWAY(NO_ERROR) after 1000 streams on a connection (its
C{keepalive_requests}) and answers the streams up to its last id; plain
``h2`` would refuse those answers (its connection is CLOSED once a GOAWAY
arrives), so L{Connection} keeps it open, new streams go to a fresh
upstream connection and the ones past the last id are reset with
REFUSED_STREAM (grpcio retries them). Like fleetd, it silences hpack's
per-field debug logging and h2's per-frame C{repr}.

    taskset -c 0 .venv/bin/python bench/_h2floor.py --port P --upstream U \
        --cert public.pem --key public.key [--memo]
"""

from __future__ import annotations

import argparse
from typing import Any

import h2.connection
import hpack.hpack
import hpack.table
from h2.config import H2Configuration
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    RequestReceived,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from h2.exceptions import ProtocolError
from twisted.internet import endpoints, reactor, ssl
from twisted.internet.protocol import Factory, Protocol


class _Silent:
    def debug(self, *args: object, **kwargs: object) -> None:
        pass


hpack.hpack.log = hpack.table.log = _Silent()  # type: ignore[assignment]
h2.connection.repr = lambda _: ""  # type: ignore[attr-defined]


class Connection(h2.connection.H2Connection):
    """A received GOAWAY leaves the connection open (see the docstring)."""

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Any], list[Any]]:
        event = ConnectionTerminated()
        event.error_code = frame.error_code
        event.last_stream_id = frame.last_stream_id
        return [], [event]


remember: Any = None  # fleetd.h2.memo.remember with --memo
dirty: set[Hop] = set()  # connections with frames to write
Item = tuple[bytes, Any, bool]  # (data, headers or None, END_STREAM)


class Hop(Protocol):
    """One side's connection; C{routes} maps its streams to the other's."""

    upstream: Hop

    def __init__(self, client: bool, port: int = 0) -> None:
        self.client, self.port = client, port  # port: the upstream's
        self.h2 = Connection(
            H2Configuration(
                client_side=client,
                header_encoding=None,
                validate_inbound_headers=not client,
                normalize_inbound_headers=False,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        if remember is not None:
            remember(self.h2)
        self.h2.initiate_connection()
        self.routes: dict[int, tuple[Hop, int]] = {}
        self.queues: dict[int, list[Item]] = {}
        self.closing = False

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)  # type: ignore[union-attr]
        self.flush()

    def flush(self) -> None:
        if self.transport is not None and (data := self.h2.data_to_send()):
            self.transport.write(data)
        if self.closing and not self.routes and self.transport is not None:
            self.transport.loseConnection()

    def dataReceived(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            self.event(event)
        dirty.add(self)
        while dirty:
            dirty.pop().flush()

    def event(self, event: Any) -> None:
        route = self.routes.get(getattr(event, "stream_id", 0))
        ended = getattr(event, "stream_ended", None) is not None
        if isinstance(event, RequestReceived):
            up = Hop.upstream
            sid = up.h2.get_next_available_stream_id()
            up.h2.send_headers(sid, event.headers, end_stream=ended)
            self.routes[event.stream_id] = (up, sid)
            up.routes[sid] = (self, event.stream_id)
            dirty.add(up)
        elif isinstance(event, DataReceived):
            padding = event.flow_controlled_length - len(event.data)
            if route is None:  # already answered or reset: credit back now
                padding = event.flow_controlled_length
            else:
                route[0].queue(route[1], (event.data, None, ended))
            if padding:
                self.h2.acknowledge_received_data(padding, event.stream_id)
        elif isinstance(event, ResponseReceived | TrailersReceived):
            if route is not None:
                route[0].queue(route[1], (b"", event.headers, ended))
        elif isinstance(event, WindowUpdated | RemoteSettingsChanged):
            sid = getattr(event, "stream_id", 0)
            for each in [sid] if sid else list(self.queues):
                self.pump(each)
        elif isinstance(event, StreamReset) and route is not None:
            self.unlink(event.stream_id, event.error_code)
        elif isinstance(event, ConnectionTerminated):
            if not self.client:
                self.transport.loseConnection()  # type: ignore[union-attr]
                return
            self.closing = True  # nginx's keepalive_requests: reconnect
            if Hop.upstream is self:
                Hop.upstream = connect(self.port)
            for sid in [s for s in self.routes if s > (event.last_stream_id or 0)]:
                self.unlink(sid, ErrorCodes.REFUSED_STREAM)

    def queue(self, sid: int, item: Item) -> None:
        """Send C{item} on C{sid} after what is already waiting there."""
        waiting = self.queues.setdefault(sid, [])
        waiting.append(item)
        if len(waiting) == 1:
            self.pump(sid)
        dirty.add(self)

    def pump(self, sid: int) -> None:
        """Send what waits on C{sid}, as far as the windows allow."""
        waiting = self.queues.get(sid)
        while waiting:
            data, headers, end = waiting[0]
            if headers is not None:
                self.h2.send_headers(sid, headers, end_stream=end)
            else:
                h2 = self.h2
                room = min(
                    h2.local_flow_control_window(sid), h2.max_outbound_frame_size
                )
                chunk, rest = data[:room], data[room:]
                if chunk or (end and not rest):
                    h2.send_data(sid, chunk, end_stream=end and not rest)
                if chunk:  # forwarded: the sender may send that much more
                    source, theirs = self.routes[sid]
                    source.h2.acknowledge_received_data(len(chunk), theirs)
                    dirty.add(source)
                if rest:
                    waiting[0] = (rest, None, end)
                    return
            del waiting[0]
            if end:
                del self.queues[sid]
                if not self.client:  # the response ended: forget the call
                    source, theirs = self.routes.pop(sid)
                    source.routes.pop(theirs, None)
                    source.queues.pop(theirs, None)
                return

    def unlink(self, sid: int, code: int) -> None:
        """C{sid} was reset (or lost): reset its other half."""
        other, theirs = self.routes.pop(sid)
        self.queues.pop(sid, None)
        other.routes.pop(theirs, None)
        other.queues.pop(theirs, None)
        refused = code == ErrorCodes.REFUSED_STREAM
        try:
            other.h2.reset_stream(
                theirs, ErrorCodes.REFUSED_STREAM if refused else ErrorCodes.CANCEL
            )
        except ProtocolError:
            pass  # already closed
        dirty.add(other)

    def connectionLost(self, reason: object = None) -> None:
        for sid in list(self.routes):
            self.unlink(sid, ErrorCodes.CANCEL)
        if self.client and Hop.upstream is self:
            Hop.upstream = connect(self.port)
        while dirty:
            dirty.pop().flush()


def connect(port: int) -> Hop:
    """A new upstream connection; it takes streams before it is connected
    (h2 holds their frames until L{Hop.connectionMade} flushes them)."""
    hop = Hop(client=True, port=port)
    endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    endpoints.connectProtocol(endpoint, hop)
    return hop


def main() -> None:
    global remember
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--memo", action="store_true")
    args = parser.parse_args()
    if args.memo:
        from fleetd.h2.memo import remember
    pem = open(args.cert, "rb").read() + open(args.key, "rb").read()
    pair = ssl.PrivateCertificate.loadPEM(pem)
    tls = ssl.CertificateOptions(
        privateKey=pair.privateKey.original,
        certificate=pair.original,
        acceptableProtocols=[b"h2"],
    )
    Hop.upstream = connect(args.upstream)
    server = endpoints.SSL4ServerEndpoint(
        reactor, args.port, tls, interface="127.0.0.1"
    )
    server.listen(Factory.forProtocol(lambda: Hop(client=False)))
    reactor.run()


if __name__ == "__main__":
    main()
