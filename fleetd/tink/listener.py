"""
The tink listener until the gRPC proxy lands: every call gets a
Trailers-Only UNIMPLEMENTED answer ([A4]).
"""

from __future__ import annotations

from functools import partial

from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Factory

from fleetd.logs import ThrottledLog
from fleetd.tink.grpcwire import GRPCStatus
from fleetd.tink.h2server import H2ServerProtocol, Headers, StreamResponder


class UnimplementedHandler:
    """Answer every call at once with Trailers-Only UNIMPLEMENTED ([A4]).

    The request body needs no waiting: the protocol returns flow-control
    credit for bytes still arriving and resets the unfinished request with
    NO_ERROR, so clients see the status immediately and never stall.
    """

    def __init__(self, responder: StreamResponder) -> None:
        self._responder = responder
        # The connection's log: the listener's shared, rate-limited one.
        self.log = responder._protocol.log

    def headersReceived(self, headers: Headers) -> None:
        path = dict(headers).get(b":path", b"").decode("ascii", "replace")
        self.log.info("tink.unimplemented {path}", path=path.split("?", 1)[0][:128])
        self._responder.trailersOnly(
            GRPCStatus.UNIMPLEMENTED, f"fleetd: {path} is not served yet"
        )

    def dataReceived(self, data: bytes) -> None:
        pass

    def endReceived(self) -> None:
        pass

    def reset(self, errorCode: int) -> None:
        pass


class TinkListenerFactory(Factory):
    """Build L{H2ServerProtocol}s that answer UNIMPLEMENTED, with limits."""

    noisy = False

    def __init__(
        self,
        clock: IReactorTime,
        *,
        maxConcurrentStreams: int = 100,
        maxHeaderListSize: int = 16384,
        maxMessageBytes: int = 4 * 1024 * 1024,
        idleTimeout: float = 30.0,
    ) -> None:
        self.clock = clock
        # One rate-limited log for every connection and stream of the listener.
        self.log = ThrottledLog(clock)
        self._build = partial(
            H2ServerProtocol,
            UnimplementedHandler,
            clock=clock,
            maxConcurrentStreams=maxConcurrentStreams,
            maxHeaderListSize=maxHeaderListSize,
            maxMessageBytes=maxMessageBytes,
            idleTimeout=idleTimeout,
        )

    def buildProtocol(self, addr: IAddress | None) -> H2ServerProtocol:
        protocol = self._build()
        protocol.log = self.log
        protocol.factory = self
        return protocol
