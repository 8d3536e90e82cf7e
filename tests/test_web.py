"""Tests for L{fleetd.web}: bounded requests and plain-text refusals."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IRequest

from fleetd.boot.resource import bootRoot
from fleetd.web import BoundedSite, Endpoint, Router


class Boom(Endpoint):
    isLeaf = True

    def render_GET(self, request: IRequest) -> bytes:
        raise RuntimeError("secret-ish internals")


class Echo(Endpoint):
    isLeaf = True

    def render_POST(self, request: IRequest) -> bytes:
        return b"got %d\n" % (len(request.content.read()),)


def makeSite(clock: Clock, maxBody: int = 100) -> BoundedSite:
    root = Router()
    root.putChild(b"boom", Boom())
    root.putChild(b"echo", Echo())
    return BoundedSite(
        root,
        maxHeaderBytes=1024,
        maxHeaders=10,
        maxBodyBytes=maxBody,
        idleTimeout=30,
        clock=clock,
    )


class BoundedSiteTests(SynchronousTestCase):
    def exchange(
        self, data: bytes, site: BoundedSite | None = None, oneByte: bool = False
    ) -> StringTransport:
        clock = Clock()
        site = site or makeSite(clock)
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        if oneByte:
            for i in range(len(data)):
                channel.dataReceived(data[i : i + 1])
        else:
            channel.dataReceived(data)
        self.addCleanup(channel.connectionLost, None)
        return transport

    def test_unknownPath_plain404(self) -> None:
        """Unknown paths get a one-line text 404, never HTML."""
        out = self.exchange(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").value()
        self.assertTrue(out.startswith(b"HTTP/1.1 404 "))
        self.assertIn(b"text/plain", out)
        self.assertTrue(out.endswith(b"\r\n\r\nnot found\n"))

    def test_bootRoot_everything404(self) -> None:
        """[A2] The boot listener's tree answers 404 for /metrics and /healthz."""
        clock = Clock()
        site = BoundedSite(
            bootRoot(),
            maxHeaderBytes=1024,
            maxHeaders=10,
            maxBodyBytes=10,
            idleTimeout=5,
            clock=clock,
        )
        for path in [b"/metrics", b"/healthz", b"/", b"/v1/admin/journal"]:
            out = self.exchange(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n", site)
            self.assertTrue(out.value().startswith(b"HTTP/1.1 404 "), path)

    def test_exception_noTraceback(self) -> None:
        """A bug in a resource is a one-line 500 with no traceback."""
        out = self.exchange(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n").value()
        self.assertTrue(out.startswith(b"HTTP/1.1 500 "))
        self.assertTrue(out.endswith(b"internal error\n"))
        self.assertNotIn(b"secret-ish", out)
        self.assertNotIn(b"Traceback", out)
        self.flushLoggedErrors(RuntimeError)

    def test_wrongMethod_plain405(self) -> None:
        """An unsupported method is a one-line 405 naming the allowed ones."""
        out = self.exchange(b"DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n").value()
        self.assertTrue(out.startswith(b"HTTP/1.1 405 "))
        self.assertIn(b"Allow: POST", out)
        self.assertTrue(out.endswith(b"method not allowed\n"))

    def test_body_withinLimit(self) -> None:
        """A body within the limit is delivered, also fed one byte at a time."""
        request = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        for oneByte in (False, True):
            out = self.exchange(request, oneByte=oneByte).value()
            self.assertTrue(out.endswith(b"got 5\n"), out)

    def test_body_declaredTooLarge(self) -> None:
        """A Content-Length over the limit is refused with 413 and a close."""
        transport = self.exchange(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
            + b"a" * 1000
        )
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 413 "))
        self.assertNotIn(b"got", transport.value())
        self.assertTrue(transport.disconnecting)

    def test_body_chunkedTooLarge(self) -> None:
        """A chunked body that grows over the limit is refused with 413."""
        chunk = b"64\r\n" + b"a" * 100 + b"\r\n"
        transport = self.exchange(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk * 3
            + b"0\r\n\r\n"
        )
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 413 "))
        self.assertTrue(transport.disconnecting)

    def test_headers_tooLarge(self) -> None:
        """
        A header line over the byte limit closes the connection before any
        resource runs (Twisted's line limit answers nothing).
        """
        transport = self.exchange(
            b"GET /nope HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n"
        )
        self.assertNotIn(b"not found", transport.value())
        self.assertTrue(transport.disconnecting)

    def test_headers_tooMany(self) -> None:
        """More headers than allowed are refused."""
        headers = b"".join(b"X-%d: y\r\n" % i for i in range(20))
        transport = self.exchange(
            b"GET /nope HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
        )
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 4"))
        self.assertTrue(transport.disconnecting)

    def test_garbage_badRequest(self) -> None:
        """A request line that is not HTTP gets 400 and a close, not a crash."""
        transport = self.exchange(b"\x00\xff\xfe garbage\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 400"))
        self.assertTrue(transport.disconnecting)

    def test_idle_timesOut(self) -> None:
        """A connection that sends nothing is closed after the idle timeout."""
        clock = Clock()
        site = makeSite(clock)
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        clock.advance(31)
        self.assertTrue(transport.disconnecting)
        channel.connectionLost(None)
        clock.advance(60)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_slowClient_closedAtRequestDeadline(self) -> None:
        """
        A client trickling its request (each byte resets the idle timer)
        is still closed when the request deadline passes.
        """
        clock = Clock()
        site = BoundedSite(
            Router(), maxHeaderBytes=1024, maxHeaders=10, maxBodyBytes=10,
            idleTimeout=30, clock=clock, requestTimeout=10,
        )  # fmt: skip
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        for byte in b"GET /slow HTTP/1.1\r\n":
            clock.advance(0.5)
            channel.dataReceived(bytes([byte]))
            if transport.disconnecting:
                break
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.value(), b"")
        channel.connectionLost(None)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_keepAlive_nextRequestHasDeadline(self) -> None:
        """After a response, the next request on the connection has a deadline."""
        clock = Clock()
        site = BoundedSite(
            Router(), maxHeaderBytes=1024, maxHeaders=10, maxBodyBytes=10,
            idleTimeout=300, clock=clock, requestTimeout=10,
        )  # fmt: skip
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        clock.advance(9)
        channel.dataReceived(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 404"))
        clock.advance(9)
        self.assertFalse(transport.disconnecting)
        clock.advance(1.5)
        self.assertTrue(transport.disconnecting)
        channel.connectionLost(None)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_accessLog_throttled(self) -> None:
        """Access lines are capped per second; the rest are counted in one line."""
        clock = Clock()
        site = makeSite(clock)
        site.accessLogPerSecond = 3
        with capturedLogs() as events:
            for _ in range(10):
                self.exchange(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", site)
            clock.advance(1)
            self.exchange(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", site)
        formats = [e["log_format"] for e in events if "http.access" in e["log_format"]]
        self.assertEqual(formats.count("http.access {method} {path} {status}"), 4)
        suppressed = [
            e for e in events if e["log_format"] == "http.access.suppressed {count}"
        ]
        self.assertEqual([e["count"] for e in suppressed], [7])

    def test_pipelinedInProgress_notCutByDeadline(self) -> None:
        """A pipelined request being answered is not cut off by the deadline."""
        clock = Clock()
        held: list[Any] = []

        class Slow(Endpoint):
            isLeaf = True

            def render_GET(self, request: IRequest) -> int:
                held.append(request)
                return 1  # NOT_DONE_YET

        site = BoundedSite(
            Slow(), maxHeaderBytes=8192, maxHeaders=50, maxBodyBytes=1024,
            idleTimeout=600, clock=clock, requestTimeout=10,
        )  # fmt: skip
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        self.assertEqual(len(held), 1)
        held[0].write(b"x")
        held[0].finish()
        self.assertEqual(len(held), 2)  # /b is being answered now
        clock.advance(30)
        self.assertFalse(transport.disconnecting)
        held[1].write(b"y")
        held[1].finish()
        clock.advance(11)  # idle again: the next request has a deadline
        self.assertTrue(transport.disconnecting)
        channel.connectionLost(None)
