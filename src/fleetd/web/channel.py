"""
The HTTP/1.1 channel of L{fleetd.web.site.BoundedSite}: each request must
arrive whole before its deadline, kept by the site's one sweep, and a
response's head leaves with its first body bytes, in one write.
"""

from __future__ import annotations

from typing import Any, Protocol

from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.http_headers import Headers

from fleetd.config import Limits
from fleetd.logs import ThrottledLog


class DeadlineSite(Protocol):
    """What a L{BoundedChannel} asks of its site (L{fleetd.web.site.BoundedSite})."""

    throttledLog: ThrottledLog

    def awaitRequest(self, channel: BoundedChannel) -> None:
        """C{channel} waits for a request: it must arrive whole in time."""

    def requestArrived(self, channel: BoundedChannel) -> None:
        """C{channel}'s request is complete, or the connection is gone."""


class BoundedChannel(http.HTTPChannel):
    """
    HTTP/1.1 with a deadline for each request to arrive whole.

    The idle timeout alone lets a client trickle one byte at a time forever;
    here the request line, headers and body must all arrive within
    C{requestTimeout} seconds of the connection (or of the previous
    response), else the connection is closed. The deadlines are kept by
    the site (L{BoundedSite.awaitRequest}): one timer per site, not one
    per connection.
    """

    requestTimeout = Limits.request_timeout
    site: DeadlineSite
    _held: list[bytes] | None = None

    def hold(self) -> None:
        """
        Hold what is written from now on (a response's head and its first
        body bytes) until L{release}: Twisted writes the head and the body
        separately, which TLS would send as two records.
        """
        self._held = []

    def release(self, send: bool = True) -> None:
        """Hand what was held to the transport in one write (unless not C{send})."""
        held, self._held = self._held, None
        if send and held:
            transport: Any = self.transport
            transport.write(b"".join(held))

    def writeHeaders(
        self, version: bytes, code: bytes, reason: bytes, headers: Any
    ) -> None:
        held = self._held
        if held is None or not isinstance(headers, Headers):
            super().writeHeaders(version, code, reason, headers)
            return
        # HTTPChannel.writeHeaders' head, into the held pieces.
        held += (version, b" ", code, b" ", reason, b"\r\n")
        for name, values in headers.getAllRawHeaders():
            for value in values:
                held += (name, b": ", value, b"\r\n")
        held.append(b"\r\n")

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            super().write(data)
        else:
            held.append(data)

    def writeSequence(self, iovec: Any) -> None:
        held = self._held
        if held is None:
            super().writeSequence(iovec)
        else:
            held.extend(iovec)

    def connectionMade(self) -> None:
        super().connectionMade()
        self.site.awaitRequest(self)

    def _tooSlow(self) -> None:
        self.site.throttledLog.info(
            "http.request-timeout {limit}", limit=self.requestTimeout
        )
        transport: Any = self.transport
        transport.abortConnection()

    def timeoutConnection(self) -> None:
        """Idle: as Twisted does, but with a rate-limited log line."""
        self.site.throttledLog.info("http.idle-timeout")
        if self.abortTimeout is not None:
            self._abortingCall = self.callLater(
                self.abortTimeout, self.forceAbortClient
            )
        self.loseConnection()

    def forceAbortClient(self) -> None:
        self._abortingCall = None
        transport: Any = self.transport
        transport.abortConnection()

    def allContentReceived(self) -> None:
        self.site.requestArrived(self)
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        super().requestDone(request)
        # Keep-alive: the next request has a deadline too, unless a
        # pipelined one is already being answered (it arrived whole).
        if (
            self.persistent
            and not self.requests
            and not getattr(self.transport, "disconnecting", False)
        ):
            self.site.awaitRequest(self)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self.site.requestArrived(self)
        super().connectionLost(reason)
