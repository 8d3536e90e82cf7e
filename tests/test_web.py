"""Tests for L{fleetd.web}: bounded requests (L{fleetd.web.site}) and
plain-text refusals (L{fleetd.web.resources})."""

from __future__ import annotations

import io
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IRequest

from fleetd.boot.resource import bootRoot
from fleetd.web.resources import Endpoint, Router, jsonResponse
from fleetd.web.site import BoundedSite


class Boom(Endpoint):
    isLeaf = True

    def render_GET(self, request: IRequest) -> bytes:
        raise RuntimeError("secret-ish internals")


class Echo(Endpoint):
    isLeaf = True
    seen: list[Any] = []

    def render_POST(self, request: IRequest) -> bytes:
        Echo.seen.append(request.content)
        return b"got %d\n" % (len(request.content.read()),)


class Hello(Endpoint):
    isLeaf = True

    def render_GET(self, request: IRequest) -> bytes:
        return jsonResponse(request, 200, {"hello": "world"})


def makeSite(clock: Clock, maxBody: int = 100) -> BoundedSite:
    root = Router()
    root.putChild(b"boom", Boom())
    root.putChild(b"echo", Echo())
    root.putChild(b"hello", Hello())
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

    def test_requestDeadlines_oneTimerPerSite(self) -> None:
        """
        Request deadlines are kept by one timer per site, not one per
        connection; without its own idle timeout (the listener sweeps
        idle connections) a site arms no other timer, and none once every
        request has arrived.
        """
        clock = Clock()
        site = _deadlineSite(clock)
        channels = []
        for _ in range(5):
            channel = site.buildProtocol(None)
            channel.makeConnection(StringTransport())
            channels.append(channel)
            clock.advance(1)
        self.assertEqual(len(clock.getDelayedCalls()), 1)
        for channel in channels:
            channel.dataReceived(
                b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
        self.assertEqual(clock.getDelayedCalls(), [])
        for channel in channels:
            channel.connectionLost(None)

    def test_requestDeadlines_staggered_eachClosedOnTime(self) -> None:
        """
        With staggered connections the site's sweep closes each one whose
        request is late, within requestTimeout / 16 of its deadline, and
        leaves the others open.
        """
        clock = Clock()
        site = _deadlineSite(clock)
        transports = []
        for _ in range(3):
            channel = site.buildProtocol(None)
            transport = StringTransport()
            channel.makeConnection(transport)
            transports.append((channel, transport))
            clock.advance(3)  # connected at 0, 3 and 6
        clock.advance(1 + 10 / 16)  # t = 10.625: the first is past its deadline
        self.assertEqual([t.disconnecting for _, t in transports], [True, False, False])
        clock.advance(3)  # t = 13.625
        self.assertEqual([t.disconnecting for _, t in transports], [True, True, False])
        for channel, _ in transports:
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
        self.assertEqual(
            formats.count("http.access {method} {path} {status} {peer}"), 4
        )
        suppressed = [
            e for e in events if e["log_format"] == "http.access.suppressed {count}"
        ]
        self.assertEqual([e["count"] for e in suppressed], [7])

    def test_accessLog_namesPeer(self) -> None:
        """Each access line names the client's address (the source fleetd's
        per-source limits count), never the query string."""
        with capturedLogs() as events:
            self.exchange(b"GET /nope?code=s3cret HTTP/1.1\r\nHost: x\r\n\r\n")
        (line,) = [e for e in events if "http.access" in e["log_format"]]
        self.assertEqual(line["peer"], "192.168.1.1")  # StringTransport's peer
        self.assertEqual(formatEvent(line), "http.access GET /nope 404 192.168.1.1")

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


SECRET = "LIVEcode0123456789abcdefghijklmn"


class HeadAndLoggingTests(SynchronousTestCase):
    """HEAD, request reprs, the Server header and per-request log lines."""

    def exchange(self, data: bytes, site: BoundedSite) -> StringTransport:
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(data)
        self.addCleanup(channel.connectionLost, None)
        return transport

    def test_head_headersOnlyEverywhere(self) -> None:
        """
        A HEAD gets the status and headers a GET would, never a body: on a
        GET resource, a POST-only one (405) and an unknown path (404).
        """
        site = makeSite(Clock())
        for path, status, length in [
            (b"/hello", b"200", b"19"),
            (b"/echo", b"405", b"19"),
            (b"/nope", b"404", b"10"),
        ]:
            out = self.exchange(
                b"HEAD " + path + b"?code=" + SECRET.encode() + b" HTTP/1.1\r\n"
                b"Host: x\r\n\r\n",
                site,
            ).value()
            head, _, body = out.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"HTTP/1.1 " + status), out)
            self.assertIn(b"Content-Length: " + length, head)
            self.assertEqual(body, b"", path)

    def test_head_logsNoRequest(self) -> None:
        """
        [A2] Pipelined HEADs with a live code in the query write no line
        holding the code, and no event carries the request object.
        """
        site = makeSite(Clock())
        request = (
            b"HEAD /hello?code=" + SECRET.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        with capturedLogs() as events:
            self.exchange(request * 200, site)
        self.assertNotIn(SECRET, repr(events))
        self.assertFalse([e for e in events if "slf" in e])

    def test_requestRepr_withoutQuery(self) -> None:
        """A request prints as method and path: the query string stays out."""
        seen: list[str] = []

        class Peek(Endpoint):
            isLeaf = True

            def render_GET(self, request: IRequest) -> bytes:
                seen.extend([repr(request), str(request)])
                return b"ok\n"

        site = BoundedSite(
            Peek(), maxHeaderBytes=1024, maxHeaders=10, maxBodyBytes=10,
            idleTimeout=30, clock=Clock(),
        )  # fmt: skip
        self.exchange(
            b"GET /config?code=" + SECRET.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            site,
        )
        self.assertEqual(seen, ["<BoundedRequest GET /config>"] * 2)

    def test_serverHeader_absent(self) -> None:
        """No response names the software (no Server: TwistedWeb/...)."""
        site = makeSite(Clock())
        for request in [b"GET /hello", b"GET /nope", b"HEAD /hello", b"PUT /echo"]:
            out = self.exchange(request + b" HTTP/1.1\r\nHost: x\r\n\r\n", site)
            self.assertNotIn(b"server:", out.value().lower())
            self.assertNotIn(b"twisted", out.value().lower())

    def test_headAndBody_oneWrite(self) -> None:
        """
        A response's head and its body reach the transport in one write
        (one TLS record, not two), byte for byte as before: a 200, a 404
        and a chunked answer, and each of two keep-alive requests.
        """

        class Writes(StringTransport):
            def __init__(self) -> None:
                super().__init__()
                self.writes: list[bytes] = []

            def write(self, data: bytes) -> None:
                self.writes.append(data)
                super().write(data)

            def writeSequence(self, data: Any) -> None:
                self.writes.append(b"".join(data))
                super().writeSequence(data)

        class Chunked(Endpoint):
            isLeaf = True

            def render_GET(self, request: IRequest) -> int:
                request.write(b"chunk one\n")
                request.write(b"chunk two\n")
                request.finish()
                return 1  # NOT_DONE_YET

        root = Router()
        root.putChild(b"hello", Hello())
        root.putChild(b"chunked", Chunked())
        site = BoundedSite(
            root, maxHeaderBytes=1024, maxHeaders=10, maxBodyBytes=10,
            idleTimeout=30, clock=Clock(),
        )  # fmt: skip
        for path, ending in [
            (b"/hello", b'{"hello": "world"}\n'),
            (b"/nope", b"not found\n"),
        ]:
            channel = site.buildProtocol(None)
            transport = Writes()
            channel.makeConnection(transport)
            ask = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            channel.dataReceived(ask)
            channel.dataReceived(ask)
            self.addCleanup(channel.connectionLost, None)
            first, second = transport.writes
            self.assertEqual(first, second)
            self.assertTrue(first.startswith(b"HTTP/1.1 "), first)
            self.assertTrue(first.endswith(b"\r\n\r\n" + ending), first)
        channel = site.buildProtocol(None)
        transport = Writes()
        channel.makeConnection(transport)
        channel.dataReceived(b"GET /chunked HTTP/1.1\r\nHost: x\r\n\r\n")
        self.addCleanup(channel.connectionLost, None)
        head, second, last = transport.writes
        self.assertIn(b"Transfer-Encoding: chunked", head)
        self.assertTrue(head.endswith(b"\r\n\r\na\r\nchunk one\n\r\n"), head)
        self.assertEqual(second, b"a\r\nchunk two\n\r\n")
        self.assertEqual(last, b"0\r\n\r\n")

    def test_process_asTwistedsWithoutServer(self) -> None:
        """
        fleetd's request processing answers as Twisted's own does on the
        same resources (status, headers in order, body; an C{OPTIONS *},
        a gzip-encoded resource), plus C{X-Content-Type-Options} first and
        minus the C{Server} header.
        """
        from twisted.web.resource import EncodingResourceWrapper
        from twisted.web.server import GzipEncoderFactory, Site

        root = Router()
        root.putChild(b"hello", Hello())
        root.putChild(
            b"zipped", EncodingResourceWrapper(Hello(), [GzipEncoderFactory()])
        )
        ours = BoundedSite(
            root, maxHeaderBytes=1024, maxHeaders=10, maxBodyBytes=10,
            idleTimeout=30, clock=Clock(),
        )  # fmt: skip
        stock = Site(root)

        def answer(site: Any, request: bytes) -> tuple[list[bytes], bytes]:
            out = self.exchange(request + b"\r\nHost: x\r\n\r\n", site).value()
            head, _, body = out.partition(b"\r\n\r\n")
            lines = [
                b"Date: (now)" if line.startswith(b"Date: ") else line
                for line in head.split(b"\r\n")
                if not line.startswith(b"Server: ")
            ]
            return lines, body

        for request in [
            b"GET /hello HTTP/1.1",
            b"GET /nope HTTP/1.1",
            b"OPTIONS * HTTP/1.1",
            b"DELETE * HTTP/1.1",
            b"GET /zipped HTTP/1.1\r\nAccept-Encoding: gzip",
        ]:
            (status, *headers), body = answer(ours, request)
            (stockStatus, *stockHeaders), stockBody = answer(stock, request)
            self.assertEqual(status, stockStatus, request)
            self.assertEqual(headers[0], b"X-Content-Type-Options: nosniff")
            self.assertEqual(headers[1:], stockHeaders, request)
            self.assertEqual(body, stockBody, request)

    def test_httpDate_onceASecond(self) -> None:
        """The Date header is Twisted's text of the current second."""
        from twisted.web.http import datetimeToString

        import fleetd.web.site as site

        now = [1_000_000_000.2]

        class Clock:
            @staticmethod
            def time() -> float:
                return now[0]

        self.patch(site, "time", Clock)
        self.assertEqual(site.httpDate(), datetimeToString(1_000_000_000))
        now[0] = 1_000_000_000.9
        self.assertEqual(site.httpDate(), datetimeToString(1_000_000_000))
        now[0] = 1_000_000_001.0
        self.assertEqual(site.httpDate(), datetimeToString(1_000_000_001))
        now[0] = 999_999_000.0  # a clock stepped back
        self.assertEqual(site.httpDate(), datetimeToString(999_999_000))

    def test_oversizedBodies_warningsRateLimited(self) -> None:
        """
        A flood of oversized bodies writes at most 10 warnings per 10 s and
        then one line saying how many were suppressed.
        """
        clock = Clock()
        site = makeSite(clock)
        request = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        with capturedLogs() as events:
            for _ in range(100):
                self.exchange(request, site)
            clock.advance(10)
            self.exchange(request, site)
        lines = [e for e in events if "http.body.too-large" in e["log_format"]]
        self.assertEqual(len(lines), 11)
        self.assertEqual(lines[-1]["suppressed"], 90)


class OwnerBodyLimitTests(SynchronousTestCase):
    """[O2] Bodies of peers that are not owners: small, in memory only."""

    def site(self, owner: bool) -> BoundedSite:
        root = Router()
        root.putChild(b"echo", Echo())
        return BoundedSite(
            root, maxHeaderBytes=1024, maxHeaders=10, maxBodyBytes=8 << 20,
            idleTimeout=30, clock=Clock(), privileged=lambda request: owner,
        )  # fmt: skip

    def post(self, site: BoundedSite, size: int, chunked: bool = False) -> bytes:
        channel = site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        self.addCleanup(channel.connectionLost, None)
        if chunked:
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (size, b"a" * size)
            head = b"Transfer-Encoding: chunked"
        else:
            body, head = b"a" * size, b"Content-Length: %d" % (size,)
        channel.dataReceived(
            b"POST /echo HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n\r\n" + body
        )
        out: bytes = transport.value()
        return out

    def test_notOwner_over64KiB_refusedAtHeaders(self) -> None:
        """[O2] Without an owner certificate, 64 KiB + 1 is a 413; 64 KiB is not."""
        Echo.seen.clear()
        site = self.site(owner=False)
        for chunked in (False, True):
            refused = self.post(site, 65537, chunked=chunked)
            self.assertTrue(refused.startswith(b"HTTP/1.1 413 "), chunked)
            accepted = self.post(site, 65536, chunked=chunked)
            self.assertTrue(accepted.endswith(b"got 65536\n"), chunked)

    def test_notOwner_neverSpooledToDisk(self) -> None:
        """[O2] A non-owner's body is held in memory, never in a temp file."""
        Echo.seen.clear()
        site = self.site(owner=False)
        self.post(site, 60000)
        self.post(site, 60000, chunked=True)
        self.assertEqual(len(Echo.seen), 2)
        for content in Echo.seen:
            self.assertIsInstance(content, io.BytesIO)

    def test_owner_largeBodyAccepted(self) -> None:
        """[O2] An owner may send up to the admin limit (an 8 MiB import)."""
        site = self.site(owner=True)
        self.assertTrue(self.post(site, 3 << 20).endswith(b"got %d\n" % (3 << 20)))


def _deadlineSite(clock: Clock) -> BoundedSite:
    """A site with 10 s request deadlines and no idle timer of its own."""
    return BoundedSite(
        Router(), maxHeaderBytes=1024, maxHeaders=10, maxBodyBytes=10,
        idleTimeout=None, clock=clock, requestTimeout=10,
    )  # fmt: skip
