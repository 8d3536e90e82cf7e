"""
HTTP plumbing shared by the boot, device and admin listeners.

Requests are bounded (header bytes and count, body bytes), refusals are one
short line of text, and no traceback ever reaches a client.
"""

from __future__ import annotations

import io
import json
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, resource, server
from twisted.web.iweb import IRequest

TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"


def textResponse(request: IRequest, code: int, line: str) -> bytes:
    """Set C{code} and a one-line text body on C{request}; return the body."""
    request.setResponseCode(code)
    request.setHeader(b"content-type", TEXT)
    request.setHeader(b"cache-control", b"no-store")
    return (line.rstrip("\n") + "\n").encode("utf-8")


def jsonResponse(request: IRequest, code: int, document: Any) -> bytes:
    """Set C{code} and a JSON body on C{request}; return the body."""
    request.setResponseCode(code)
    request.setHeader(b"content-type", JSON)
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(document, sort_keys=True).encode("utf-8") + b"\n"


class Refusal(resource.Resource):
    """A leaf that answers every method with one status and one line."""

    isLeaf = True

    def __init__(self, code: int, line: str) -> None:
        super().__init__()
        self.code = code
        self.line = line

    def render(self, request: IRequest) -> bytes:
        return textResponse(request, self.code, self.line)


class Endpoint(resource.Resource):
    """
    A resource whose unsupported methods get a one-line 405, not HTML.

    HEAD is served by C{render_GET} when there is no C{render_HEAD}.
    """

    def render(self, request: IRequest) -> Any:
        method = request.method.decode("ascii", "replace")
        allowed = {
            name[len("render_") :]
            for name in dir(self)
            if name.startswith("render_") and name[len("render_") :].isupper()
        }
        if "GET" not in allowed:
            allowed.discard("HEAD")  # resource.Resource's HEAD needs a GET
        handler = getattr(self, f"render_{method}", None) if method in allowed else None
        if handler is None:
            request.setHeader(b"allow", ", ".join(sorted(allowed)).encode("ascii"))
            return textResponse(request, http.NOT_ALLOWED, "method not allowed")
        return handler(request)


def notFound() -> Refusal:
    return Refusal(http.NOT_FOUND, "not found")


class Router(resource.Resource):
    """
    A resource whose unknown children and own path answer 404 in plain text.

    Children are registered with L{putChild}; everything else is a
    L{Refusal}, so no twisted.web HTML page is ever produced.
    """

    def __init__(self, index: resource.Resource | None = None) -> None:
        super().__init__()
        self._index = index

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if path == b"" and self._index is not None and not request.postpath:
            return self._index
        return notFound()

    def render(self, request: IRequest) -> bytes:
        return textResponse(request, http.NOT_FOUND, "not found")


class BoundedRequest(server.Request):
    """
    A request that refuses bodies over the site's limit with 413.

    The limit is checked against Content-Length before any body byte is
    buffered, and against the running total for chunked bodies.
    """

    _log = Logger()
    _refused = False
    _received = 0

    def _maxBody(self) -> int:
        site = getattr(self.channel, "site", None)
        return int(getattr(site, "maxBodyBytes", 65536))

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self._maxBody():
            self._refuse()
            self.content = io.BytesIO()
            return
        super().gotLength(length)

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
        self._log.warn("http.body.too-large {limit}", limit=self._maxBody())
        body = b"request body too large\n"
        transport: Any = self.channel.transport
        transport.write(
            b"HTTP/1.1 413 Content Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.channel.loseConnection()

    def process(self) -> None:
        if self._refused:
            return
        self.setHeader(b"x-content-type-options", b"nosniff")
        super().process()

    def processingFailed(self, reason: Failure) -> None:
        self._log.failure("http.request.failed", failure=reason)
        if self.finished or self._disconnected:
            return
        body = b"internal error\n"
        self.setResponseCode(http.INTERNAL_SERVER_ERROR)
        self.setHeader(b"content-type", TEXT)
        self.setHeader(b"content-length", b"%d" % (len(body),))
        self.write(body)
        self.finish()


class BoundedChannel(http.HTTPChannel):
    """
    HTTP/1.1 with a deadline for each request to arrive whole.

    The idle timeout alone lets a client trickle one byte at a time forever;
    here the request line, headers and body must all arrive within
    C{requestTimeout} seconds of the connection (or of the previous
    response), else the connection is closed.
    """

    requestTimeout = 10.0
    _deadline: Any = None
    _log = Logger()

    def connectionMade(self) -> None:
        super().connectionMade()
        self._arm()

    def _arm(self) -> None:
        self._cancel()
        self._deadline = self.callLater(self.requestTimeout, self._tooSlow)

    def _cancel(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _tooSlow(self) -> None:
        self._deadline = None
        self._log.info("http.request-timeout {limit}", limit=self.requestTimeout)
        transport: Any = self.transport
        transport.abortConnection()

    def allContentReceived(self) -> None:
        self._cancel()
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
            self._arm()

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self._cancel()
        super().connectionLost(reason)


class BoundedSite(server.Site):
    """
    A L{server.Site} with per-request limits and no tracebacks for clients.

    @ivar maxBodyBytes: the largest request body accepted.
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
        idleTimeout: float,
        clock: Any,
        requestTimeout: float = 10.0,
    ) -> None:
        super().__init__(root, timeout=idleTimeout, reactor=clock)
        self.maxHeaderBytes = maxHeaderBytes
        self.maxHeaders = maxHeaders
        self.maxBodyBytes = maxBodyBytes
        self.requestTimeout = requestTimeout
        self.noisy = False

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
        Access log without the query string: codes travel in query values.
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
            "http.access {method} {path} {status}",
            method=request.method.decode("ascii", "replace"),
            path=request.path.split(b"?", 1)[0][:128].decode("ascii", "replace"),
            status=request.code,
        )

    _accessLog = Logger(namespace="fleetd.access")
