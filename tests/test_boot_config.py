"""
C{GET /config} in-process: the HTTP channel over a StringTransport, the
real registry underneath; when exactly a delivery counts [C1].
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from fleetd.boot.config import ConfigResource
from fleetd.boot.handover import BodyProducer
from fleetd.boot.query import BadQuery, Identity, parseQuery
from fleetd.boot.query import unquote as _unquote
from fleetd.boot.resource import bootRoot
from fleetd.listen.connections import LimitedFactory
from fleetd.runs.machine import Outcome
from fleetd.runs.placeholders import DevValues
from fleetd.runs.render import TemplateRenderer
from fleetd.web.site import BoundedSite
from tests.daemonsupport import configPath
from tests.fleetsupport import KEY, Fleet, device
from tests.support import REPO

PEER = IPv4Address("TCP", "10.20.0.42", 40000)


class SlowTransport(StringTransport):
    """Pauses its producer after C{pauseAfter} more bytes, as a full socket does."""

    def __init__(self, pauseAfter: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pauseAfter = pauseAfter
        self.budget = pauseAfter
        self.paused = False

    def write(self, data: bytes) -> None:
        super().write(data)
        if self.budget is not None and self.producer is not None:
            self.budget -= len(data)
            if self.budget <= 0 and not self.paused:
                self.paused = True
                self.producer.pauseProducing()

    def drain(self) -> None:
        self.budget = self.pauseAfter
        self.paused = False
        assert self.producer is not None
        self.producer.resumeProducing()


class KernelTransport(StringTransport):
    """
    A transport with a TCP transport's user-space buffer: what is written
    stays in C{dataBuffer} (fleetd's memory) until C{toKernel} moves it to
    the operating system, as C{doWrite} does when the socket takes it.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataBuffer = b""
        self.offset = 0
        self._tempDataLen = 0
        self.disconnected = False

    def write(self, data: bytes) -> None:
        super().write(data)
        self.dataBuffer += data

    def toKernel(self) -> None:
        self.offset = len(self.dataBuffer)


class ConfigResourceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = Fleet(self)
        self.fleet.add(device("w1", "SER1"))
        resource = ConfigResource(
            self.fleet.registry, clock=self.fleet.clock, metrics=CollectorRegistry()
        )
        self.site = BoundedSite(
            bootRoot(config=resource),
            maxHeaderBytes=8192, maxHeaders=64, maxBodyBytes=1024,
            idleTimeout=30, clock=self.fleet.clock,
        )  # fmt: skip

    def connect(self, pauseAfter: int | None = None) -> tuple[Any, SlowTransport]:
        channel = self.site.buildProtocol(PEER)
        transport = SlowTransport(pauseAfter, peerAddress=PEER)
        channel.makeConnection(transport)
        return channel, transport

    def get(
        self, code: str, pauseAfter: int | None = None
    ) -> tuple[Any, SlowTransport]:
        uuid = self.fleet.registry.identity("w1")
        assert uuid is not None
        channel, transport = self.connect(pauseAfter)
        path = configPath(code, uuid[0], "SER1").encode()
        channel.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        return channel, transport

    def provision(self, padding: int = 0) -> Any:
        if padding:
            template = (REPO / "conf" / "templates" / "default.yaml").read_text()
            directory = Path(self.mktemp())
            directory.mkdir()
            (directory / "default.yaml").write_text(
                template.replace(
                    "persist: true", "persist: true\nnote: " + "x" * padding
                )
            )
            import tests.fleetsupport as runs

            self.patch(
                runs, "RENDERER", TemplateRenderer(directory, values=DevValues(KEY))
            )
        (run,) = self.fleet.provision(device("w1", "SER1"))
        return run

    def test_clientClosesRightAfterBody_consumed(self) -> None:
        """
        [C1] A client that closes right after reading the body got the
        configuration: the run is consumed, never served again.
        """
        run = self.provision()
        channel, transport = self.get(run.code)
        self.assertIn(b"hostname: w1", transport.value())
        channel.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_largeBody_closeAfterLastChunk_consumed(self) -> None:
        """[C1] With a body in chunks, the response finishes with the last one."""
        run = self.provision(padding=300_000)
        channel, transport = self.get(run.code, pauseAfter=100_000)
        self.assertLess(len(transport.value()), 300_000)
        while transport.paused:  # the reader drains its buffer, slowly
            transport.drain()
        self.assertIn(b"hostname: w1", transport.value())
        channel.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_largeBody_lostMidway_deliverableAgain(self) -> None:
        """[C1] Lost while chunks are held back: not delivered, mark withdrawn."""
        run = self.provision(padding=300_000)
        channel, transport = self.get(run.code, pauseAfter=100_000)
        self.assertTrue(transport.paused)  # chunks held back, then the node vanishes
        self.assertLess(len(transport.value()), 300_000)
        channel.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.DELIVER)

    def getThrough(self, transport: StringTransport, code: str) -> Any:
        uuid = self.fleet.registry.identity("w1")
        assert uuid is not None
        channel = self.site.buildProtocol(PEER)
        channel.makeConnection(transport)
        path = configPath(code, uuid[0], "SER1").encode()
        channel.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        return channel

    def test_bodyInFleetdBuffers_connectionDies_deliverableAgain(self) -> None:
        """
        [C1] Twisted finished the response, but part of the body is still
        in fleetd's own buffers when the connection dies: the operating
        system never had it, so the mark is withdrawn and the run is
        deliverable again.
        """
        run = self.provision()
        transport = KernelTransport(peerAddress=PEER)
        channel = self.getThrough(transport, run.code)
        self.assertIn(b"hostname: w1", transport.value())  # finished...
        self.assertFalse(self.fleet.registry.readyRun("w1"))  # ...not yet counted
        self.fleet.clock.advance(0.5)  # the client stopped reading
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        transport.disconnected = True  # and then reset the connection
        channel.connectionLost(Failure(ConnectionLost()))
        self.fleet.clock.advance(1.0)
        self.assertEqual(self.fleet.registry.readyRun("w1"), run.run)
        self.assertEqual(self.fleet.clock.getDelayedCalls(), [])

    def test_bodyHandedToOS_delivered(self) -> None:
        """[C1] Once the operating system has every byte, the run is consumed."""
        run = self.provision()
        transport = KernelTransport(peerAddress=PEER)
        channel = self.getThrough(transport, run.code)
        self.fleet.clock.advance(0.05)
        transport.toKernel()
        self.fleet.clock.advance(1.0)
        transport.disconnected = True
        channel.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)
        self.assertEqual(self.fleet.clock.getDelayedCalls(), [])

    def test_pipelinedBehindDelivery_dropped(self) -> None:
        """
        [C1] Requests pipelined behind a delivery are not answered: their
        answers would sit in fleetd's buffers after the body, so a client
        that read the body, stopped reading and reset would look like it
        never got it, and the run would be deliverable twice.
        """
        run = self.provision()
        uuid = self.fleet.registry.identity("w1")
        assert uuid is not None
        transport = KernelTransport(peerAddress=PEER)
        channel = self.site.buildProtocol(PEER)
        channel.makeConnection(transport)
        path = configPath(run.code, uuid[0], "SER1").encode()
        head = b"HEAD /config HTTP/1.1\r\nHost: x\r\n\r\n"
        channel.dataReceived(
            b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n" + head * 200
        )
        self.assertEqual(transport.value().count(b"HTTP/1.1 "), 1)
        self.assertIn(b"connection: close", transport.value().lower())
        transport.toKernel()  # the client read everything that was sent
        self.fleet.clock.advance(0.5)
        transport.disconnected = True  # then reset
        channel.connectionLost(Failure(ConnectionLost()))
        self.fleet.clock.advance(1.0)
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_unsentBytes_countsTheSocketBufferOnce(self) -> None:
        """
        [C1] Protocol wrappers forward attribute lookups to their transport:
        the socket's buffer is counted once, whatever wraps it.
        """
        from twisted.internet.protocol import Protocol
        from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

        from fleetd.boot.handover import connectionGone, unsentBytes

        bottom = KernelTransport(peerAddress=PEER)
        bottom.write(b"x" * 100)
        outer = ProtocolWrapper(WrappingFactory(None), Protocol())
        inner = ProtocolWrapper(WrappingFactory(None), outer)
        inner.makeConnection(bottom)  # bottom <- inner <- outer <- protocol
        self.assertEqual(unsentBytes(outer), 100)
        bottom.toKernel()
        self.assertEqual(unsentBytes(outer), 0)
        self.assertFalse(connectionGone(outer))
        bottom.disconnected = True
        self.assertTrue(connectionGone(outer))

    def test_nextRequest_settlesHandoverFirst(self) -> None:
        """
        [C1] A request arriving after the operating system took the body
        sees the run consumed (410), not busy: the hand-over is checked
        before deciding.
        """
        self.assertNextRequestConsumed(self.getThrough)

    def assertNextRequestConsumed(self, get: Callable[[Any, str], Any]) -> None:
        """Deliver through C{get}; once the kernel has the body, a second
        request for the run gets 410."""
        run = self.provision()
        transport = KernelTransport(peerAddress=PEER)
        get(transport, run.code)
        transport.toKernel()
        again = StringTransport(peerAddress=PEER)
        self.getThrough(again, run.code)
        self.assertTrue(again.value().startswith(b"HTTP/1.1 410"), again.value())

    def limitedGet(self, transport: StringTransport, code: str) -> Any:
        """GET through the listener's limit wrapper, as on a real listener."""
        factory = LimitedFactory(
            self.site, name="boot", clock=self.fleet.clock,
            maxConnections=10, idleTimeout=30,
        )  # fmt: skip
        uuid = self.fleet.registry.identity("w1")
        assert uuid is not None
        protocol = factory.buildProtocol(PEER)
        protocol.makeConnection(transport)
        path = configPath(code, uuid[0], "SER1").encode()
        protocol.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        return protocol

    def test_limitedStack_settledWhenLost_noPolling(self) -> None:
        """
        [C1] Behind the listener's limit wrapper the hand-over sets no
        timer: the run counts as delivered when the connection is lost
        with the whole body with the kernel.
        """
        run = self.provision()
        transport = KernelTransport(peerAddress=PEER)
        protocol = self.limitedGet(transport, run.code)
        self.assertIn(b"hostname: w1", transport.value())
        self.assertIsNone(self.fleet.registry.readyRun("w1"))  # being delivered
        # Only the listener's idle sweep is scheduled, no hand-over poll.
        self.assertEqual(len(self.fleet.clock.getDelayedCalls()), 1)
        transport.toKernel()
        transport.disconnected = True
        protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_limitedStack_bodyHeldWhenLost_deliverableAgain(self) -> None:
        """
        [C1] Behind the limit wrapper, a connection lost while part of the
        body is still in fleetd's buffers withdraws the mark.
        """
        run = self.provision()
        transport = KernelTransport(peerAddress=PEER)
        protocol = self.limitedGet(transport, run.code)
        transport.disconnected = True
        protocol.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.fleet.registry.readyRun("w1"), run.run)

    def test_limitedStack_bytesAfterBodyHeld_stillDelivered(self) -> None:
        """
        [C1] Bytes written after the body (a TLS close alert) that never
        reach the kernel do not make a delivered body look unsent: the run
        stays consumed, never deliverable twice.
        """
        run = self.provision()
        transport = KernelTransport(peerAddress=PEER)
        protocol = self.limitedGet(transport, run.code)
        transport.toKernel()  # the kernel took the whole body...
        protocol.write(b"\x15\x03\x03\x00\x13" + b"x" * 19)  # ...not the alert
        transport.disconnected = True
        protocol.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(self.fleet.fetch(run.code)[0], Outcome.CONSUMED)

    def test_limitedStack_nextRequest_settlesFirst(self) -> None:
        """
        [C1] Behind the limit wrapper too, a request arriving once the
        kernel has the body sees the run consumed (410), not busy.
        """
        self.assertNextRequestConsumed(self.limitedGet)

    def test_postpath_404(self) -> None:
        """[A2] /config/anything is not /config."""
        run = self.provision()
        channel, transport = self.connect()
        channel.dataReceived(
            b"GET /config/x?code=" + run.code.encode() + b" HTTP/1.1\r\n\r\n"
        )
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 404"))
        self.assertEqual(self.fleet.registry.readyRun("w1"), run.run)

    def test_head_headersOnly_neverConsumes(self) -> None:
        """
        [C1] [A2] HEAD /config with a live code (pipelined, many times) is a
        405 with headers only: nothing is delivered, the run stays ready, and
        no log event holds the code; the GET after it gets the configuration.
        """
        run = self.provision()
        uuid = self.fleet.registry.identity("w1")
        assert uuid is not None
        path = configPath(run.code, uuid[0], "SER1").encode()
        channel, transport = self.connect()
        with capturedLogs() as events:
            channel.dataReceived(
                (b"HEAD " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n") * 50
            )
        answers = transport.value().split(b"HTTP/1.1 ")[1:]
        self.assertEqual(len(answers), 50)
        for answer in answers:
            head, _, body = answer.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"405 "), answer)
            self.assertIn(b"Allow: GET", head)
            self.assertEqual(body, b"")
        self.assertNotIn(run.code, repr(events))
        self.assertEqual(self.fleet.registry.readyRun("w1"), run.run)
        _, transport = self.get(run.code)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200"))
        self.assertIn(b"hostname: w1", transport.value())

    def test_wrongMachine_warningsRateLimited(self) -> None:
        """A flood of another machine's requests logs at most ten warnings."""
        run = self.provision()
        path = configPath(run.code, "4c4c4544-0000-0000-0000-000000000000", "SER9")
        with capturedLogs() as events:
            for _ in range(30):
                channel, transport = self.connect()
                channel.dataReceived(
                    b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"
                )
                self.assertTrue(transport.value().startswith(b"HTTP/1.1 403"))
        warned = [e for e in events if "config.wrong-machine" in e["log_format"]]
        self.assertEqual(len(warned), 10)

    def test_serial_caseInsensitive(self) -> None:
        """Serials match case-insensitively, as the inventory keeps them unique."""
        run = self.provision()
        uuid = self.fleet.registry.identity("w1")
        assert uuid is not None
        channel, transport = self.connect()
        path = configPath(run.code, uuid[0].upper(), "ser1").encode()
        channel.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200"))


class BodyProducerTests(SynchronousTestCase):
    def test_smallBody_writtenAndFinishedAtOnce(self) -> None:
        """A body of one chunk is written and finished in the same call."""

        class Request:
            def __init__(self) -> None:
                self.calls: list[str] = []

            def write(self, data: bytes) -> None:
                self.calls.append(f"write {len(data)}")

            def finish(self) -> None:
                self.calls.append("finish")

        request = Request()
        BodyProducer(
            request,  # type: ignore[arg-type]
            b"x" * 10,
        ).start()
        self.assertEqual(request.calls, ["write 10", "finish"])


class _URI:
    """Just what L{parseQuery} reads of a request."""

    def __init__(self, uri: bytes) -> None:
        self.uri = uri


def _parseQueryAsFirstWritten(uri: bytes) -> Identity:
    """L{parseQuery} before names as nodes send them skipped the decoding."""
    raw = uri.split(b"?", 1)[1] if b"?" in uri else b""
    values: dict[str, str] = {}
    for pair in raw.split(b"&") if raw else []:
        key, _, value = pair.partition(b"=")
        try:
            name = _unquote(key)
            text = _unquote(value)
        except UnicodeDecodeError as e:
            raise BadQuery("query is not UTF-8") from e
        if name not in ("code", "uuid", "serial"):
            continue
        if name in values:
            raise BadQuery(f"repeated parameter {name}")
        if len(text) > 256 or not text.isprintable():
            raise BadQuery(f"bad {name}")
        values[name] = text
    return Identity(values.get("code"), values.get("uuid"), values.get("serial"))


def _outcome(parse: Callable[[Any], Identity], arg: Any) -> Identity | str:
    try:
        return parse(arg)
    except BadQuery as e:
        return f"BadQuery: {e}"


class ParseQueryTests(SynchronousTestCase):
    """The query of C{GET /config}: the same answers, parsed cheaper."""

    @settings(max_examples=2000)
    @given(
        st.lists(
            st.sampled_from(
                [
                    b"code",
                    b"uuid",
                    b"serial",
                    b"c%6Fde",
                    b"cod+e",
                    b"x",
                    b"=",
                    b"&",
                    b"?",
                    b"%",
                    b"%ff",
                    b"%2",
                    b"+",
                    b"\xff",
                    b"\xc3\xa9",
                    b"%0a",
                    b"A7",
                    b"ser",
                    b"ial",
                    b"/config",
                ]
            )
            | st.binary(max_size=3),
            max_size=14,
        ).map(b"".join)
    )
    def test_sameAsFirstWritten(self, tail: bytes) -> None:
        """Every query gets the identity, or the refusal, it got before."""
        for uri in (b"/config?" + tail, b"/config" + tail):
            self.assertEqual(
                _outcome(parseQuery, _URI(uri)),
                _outcome(_parseQueryAsFirstWritten, uri),
                uri,
            )
