"""
The bounded site every HTTP/1.1 listener of fleetd serves through.

Requests are bounded (header bytes and count, body bytes, the time to
arrive whole), and no traceback ever reaches a client. A HEAD gets
headers only, a request prints without its query string (codes travel in
query values), no C{Server} header names the software, and the lines a
client can cause once per request are rate-limited.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes as unquote

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, resource, server
from twisted.web.error import UnsupportedMethod
from twisted.web.iweb import IRequest

from fleetd.config import Limits
from fleetd.listen.policy import ListenerPolicy
from fleetd.logs import ThrottledLog, describeRequest
from fleetd.web.channel import BoundedChannel
from fleetd.web.owner import isOwner
from fleetd.web.resources import TEXT, textResponse

# Bodies up to this size are held in memory, never spooled to a temp file.
IN_MEMORY_BODY = 1 << 20


_date: list[Any] = [None, b""]


def httpDate() -> bytes:
    """
    Now as an HTTP C{Date} (Twisted's L{http.datetimeToString}), made once
    per second of the clock Twisted reads, not once per response.
    """
    second = int(time.time())
    if second != _date[0]:
        _date[:] = [second, http.datetimeToString(second)]
    date: bytes = _date[1]
    return date


class BoundedRequest(server.Request):
    """
    A request that refuses bodies over the site's limit with 413.

    The limit is decided when the headers are complete (L{BoundedSite.bodyLimit}:
    it may depend on who the peer is) and checked against Content-Length
    before any body byte is buffered, and against the running total for
    chunked bodies. Bodies under L{IN_MEMORY_BODY} are never spooled to disk.
    """

    _refused = False
    _received = 0
    _limit: int | None = None

    def __repr__(self) -> str:
        return describeRequest(self)

    __str__ = __repr__

    def _maxBody(self) -> int:
        if self._limit is None:
            site = getattr(self.channel, "site", None)
            bodyLimit = getattr(site, "bodyLimit", None)
            self._limit = 65536 if bodyLimit is None else int(bodyLimit(self))
        return self._limit

    def _throttled(self) -> ThrottledLog:
        site: Any = getattr(self.channel, "site", None) or getattr(self, "site", None)
        log: ThrottledLog = site.throttledLog
        return log

    def gotLength(self, length: int | None) -> None:
        limit = self._maxBody()
        if length is not None and length > limit:
            self._refuse()
            self.content = io.BytesIO()
            return
        if limit < IN_MEMORY_BODY:
            self.content = io.BytesIO()
            return
        super().gotLength(length)

    def setHeader(self, name: bytes | str, value: bytes | str) -> None:
        """Every header but C{Server}: the software is nobody's business."""
        # Only a six-letter name can be "server": the rest skip the lower().
        if len(name) == 6 and name.lower() in (b"server", "server"):
            return
        self.responseHeaders.setRawHeaders(name, [value])  # http.Request's, inline

    def render(self, resrc: resource.IResource) -> None:
        """
        Render; a HEAD is answered with headers only, without Twisted's
        "HEAD request is returning a message body" line (which would log
        the whole request, query string and all).
        """
        if self.method != b"HEAD":
            super().render(resrc)
            return
        try:
            body = resrc.render(self)
        except UnsupportedMethod as e:
            self.setHeader(b"allow", b", ".join(sorted(e.allowedMethods)))
            body = textResponse(self, http.NOT_ALLOWED, "method not allowed")
        if body is server.NOT_DONE_YET:
            return  # http.Request.write drops a HEAD's body
        if not isinstance(body, bytes):
            raise TypeError(f"{resrc!r} rendered {type(body).__name__}, not bytes")
        self.setHeader(b"content-length", b"%d" % (len(body),))
        self.write(b"")
        self.finish()

    def write(self, data: bytes) -> None:
        """
        The first write with a body goes out with the response's head in
        one piece (L{BoundedChannel.hold}): one TLS record, not two.
        """
        channel = self.channel
        if self.startedWriting or not data or not isinstance(channel, BoundedChannel):
            super().write(data)
            return
        channel.hold()
        try:
            super().write(data)
        except BaseException:
            channel.release(send=False)
            raise
        channel.release()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self._maxBody():
            self._refuse()
            return
        super().handleContentChunk(data)

    def _refuse(self) -> None:
        self._refused = True
        self._throttled().warn("http.body.too-large {limit}", limit=self._maxBody())
        body = b"request body too large\n"
        transport: Any = self.channel.transport
        transport.write(
            b"HTTP/1.1 413 Content Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\n"
            b"content-length: %d\r\n\r\n%s"
            % (len(body), b"" if self.method == b"HEAD" else body)
        )
        self.channel.loseConnection()

    def process(self) -> None:
        """
        Twisted's L{server.Request.process} with fleetd's headers set once:
        C{X-Content-Type-Options: nosniff}, then C{Date}, whose text is made
        once a second (L{httpDate}); no C{Server} header is set (Twisted's
        was set and then dropped by L{setHeader}). The rest is Twisted's.
        """
        if self._refused:
            return
        headers = self.responseHeaders
        headers.setRawHeaders(b"X-Content-Type-Options", [b"nosniff"])
        headers.setRawHeaders(b"Date", [httpDate()])
        channel: Any = self.channel
        site = self.site = channel.site
        self.prepath = []
        self.postpath = list(map(unquote, self.path[1:].split(b"/")))
        if self.path == b"*":
            self._handleStar()
            return
        try:
            found = site.getResourceFor(self)
            if resource._IEncodingResource.providedBy(found):
                encoder = found.getEncoder(self)
                if encoder is not None:
                    self._encoder = encoder
            self.render(found)
        except BaseException:
            self.processingFailed(Failure())

    def processingFailed(self, reason: Failure) -> None:
        self._throttled().failure("http.request.failed", failure=reason)
        if self.finished or self._disconnected:
            return
        body = b"internal error\n"
        self.setResponseCode(http.INTERNAL_SERVER_ERROR)
        self.setHeader(b"content-type", TEXT)
        self.setHeader(b"content-length", b"%d" % (len(body),))
        self.write(body)
        self.finish()


class BoundedSite(server.Site):
    """
    A L{server.Site} with per-request limits and no tracebacks for clients.

    @ivar idleTimeout: Twisted's own idle timer for each connection, in
        seconds; L{None} when the listener below closes idle connections
        already (L{fleetd.listen.LimitedFactory}'s sweep does, for every
        listener fleetd opens), which spares each connection a timer.
    @ivar requestTimeout: how long a request may take to arrive whole,
        kept by one sweep per site: a connection is closed within
        C{requestTimeout / 16} after its deadline.
    @ivar maxBodyBytes: the largest request body accepted (from a
        C{privileged} peer, when that is given).
    @ivar privileged: decides, when a request's headers are complete,
        whether its peer may send up to C{maxBodyBytes}; the others get at
        most C{unprivilegedBodyBytes}, held in memory [O2]. L{None}: every
        peer gets C{maxBodyBytes}.
    """

    requestFactory = BoundedRequest
    protocol = BoundedChannel  # type: ignore[assignment]  # HTTP/1.1 only
    displayTracebacks = False

    def __init__(
        self,
        root: resource.Resource,
        *,
        maxHeaderBytes: int,
        maxHeaders: int,
        maxBodyBytes: int,
        idleTimeout: float | None,
        clock: IReactorTime,
        requestTimeout: float = Limits.request_timeout,
        privileged: Callable[[IRequest], bool] | None = None,
        unprivilegedBodyBytes: int = Limits.max_body_bytes,
    ) -> None:
        super().__init__(root, timeout=idleTimeout, reactor=clock)
        self.maxHeaderBytes = maxHeaderBytes
        self.maxHeaders = maxHeaders
        self.maxBodyBytes = maxBodyBytes
        self.requestTimeout = requestTimeout
        self.privileged = privileged
        self.unprivilegedBodyBytes = unprivilegedBodyBytes
        self.throttledLog = ThrottledLog(clock)
        self.noisy = False
        self._deadlines: dict[BoundedChannel, float] = {}
        self._sweep: Any = None

    sweepSteps = 16

    def awaitRequest(self, channel: BoundedChannel) -> None:
        """C{channel} waits for a request: it must arrive whole in time."""
        self._deadlines[channel] = self.reactor.seconds() + self.requestTimeout
        if self._sweep is None:
            self._sweep = self.reactor.callLater(self.requestTimeout, self._tooSlow)

    def requestArrived(self, channel: BoundedChannel) -> None:
        """C{channel}'s request is complete, or the connection is gone."""
        deadlines = self._deadlines
        if deadlines.pop(channel, None) is not None and not deadlines:
            sweep, self._sweep = self._sweep, None
            if sweep is not None and sweep.active():
                sweep.cancel()

    def _tooSlow(self) -> None:
        """Close the connections past their deadline; sleep until the next."""
        self._sweep = None
        now = self.reactor.seconds()
        due: float | None = None
        for channel, deadline in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[channel]
                channel._tooSlow()
            elif due is None or deadline < due:
                due = deadline
        if due is not None and self._sweep is None:
            wait = max(due - now, self.requestTimeout / self.sweepSteps)
            self._sweep = self.reactor.callLater(wait, self._tooSlow)

    def bodyLimit(self, request: IRequest) -> int:
        """The largest body C{request} may send (its headers are complete)."""
        if self.privileged is None or self.privileged(request):
            return self.maxBodyBytes
        return min(self.maxBodyBytes, self.unprivilegedBodyBytes)

    def acceptableProtocols(self) -> list[bytes]:
        """ALPN: these listeners speak HTTP/1.1 only (curl and Go offer h2)."""
        return [b"http/1.1"]

    def buildProtocol(self, addr: Any) -> Any:
        channel = super().buildProtocol(addr)
        channel.totalHeadersSize = self.maxHeaderBytes
        channel.maxHeaders = self.maxHeaders
        channel.MAX_LENGTH = self.maxHeaderBytes
        channel.requestTimeout = self.requestTimeout
        return channel

    accessLogPerSecond = 50
    _window = -1.0
    _inWindow = 0
    _suppressed = 0

    def log(self, request: Any) -> None:
        """
        Access log without the query string: codes travel in query values;
        with the client's address, which fleetd's per-source limits count.
        At most C{accessLogPerSecond} lines a second; the rest are counted
        and reported in one line, so a flood cannot drown the log.
        """
        now = self.reactor.seconds()
        if now - self._window >= 1.0:
            if self._suppressed:
                self._accessLog.warn(
                    "http.access.suppressed {count}", count=self._suppressed
                )
            self._window, self._inWindow, self._suppressed = now, 0, 0
        self._inWindow += 1
        if self._inWindow > self.accessLogPerSecond:
            self._suppressed += 1
            return
        self._accessLog.info(
            "http.access {method} {path} {status} {peer}",
            method=request.method.decode("ascii", "replace"),
            path=request.path.split(b"?", 1)[0][:128].decode("ascii", "replace"),
            status=request.code,
            peer=getattr(request.getClientAddress(), "host", "-"),
        )

    _accessLog = Logger(namespace="fleetd.access")


def listenerSite(
    root: resource.Resource,
    policy: ListenerPolicy,
    limits: Limits,
    clock: IReactorTime,
) -> BoundedSite:
    """
    The site behind an HTTP/1.1 listener: its policy's body limit (larger
    bodies for owners only where it says so [O2]), the C{[limits]} on
    headers and requests.
    """
    assert policy.maxBodyBytes is not None  # an HTTP/1.1 listener's policy
    return BoundedSite(
        root,
        maxHeaderBytes=limits.max_header_bytes,
        maxHeaders=limits.max_headers,
        maxBodyBytes=policy.maxBodyBytes,
        # The listener's sweep closes idle connections (no byte either
        # way for limits.idle_timeout): no HTTP timer per connection.
        idleTimeout=None,
        requestTimeout=limits.request_timeout,
        clock=clock,
        privileged=isOwner if policy.largeBodiesForOwnersOnly else None,
    )
