"""
The NetBox client's bound on answers: C{MAX_BODY} (16 MiB) is applied,
whether the answer declares its length or not, and the rest is never read;
and a call NetBox never answered leaves no dead pooled connection behind.
"""

from __future__ import annotations

from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone, ResponseNeverReceived
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH
from twisted.web.resource import Resource
from twisted.web.server import Request

from fleetd.netbox.client import MAX_BODY, NetBoxClient, NetBoxError
from tests.netbox_support import TOKEN, URL


class _BigResource(Resource):
    """A NetBox list page of C{size} bytes, with its Content-Length."""

    isLeaf = True

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        head = b'{"count": 1, "next": null, "previous": null, "results": [{"x": "'
        return head + b"a" * (self.size - len(head) - 4) + b'"}]}'


class _Dribble:
    """A response of unknown length fed in 1 MiB chunks while it is read."""

    length = UNKNOWN_LENGTH
    code = 200
    headers = Headers({"content-type": ["application/json"]})

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.sent = 0
        self.lost = False

    def deliverBody(self, protocol: Any) -> None:
        transport = StringTransport()
        transport.loseConnection = lambda: setattr(self, "lost", True)  # type: ignore[method-assign]
        protocol.makeConnection(transport)
        while self.sent < self.chunks and not self.lost:
            self.sent += 1
            protocol.dataReceived(b" " * (1024 * 1024))
        if not self.lost:
            protocol.connectionLost(Failure(ResponseDone()))


class BoundedAnswerTests(SynchronousTestCase):
    """The client reads at most MAX_BODY (16 MiB) of any answer."""

    def test_declaredLarge_refused(self) -> None:
        """An answer of 17 MiB fails the call (retry later), naming the bound."""
        client = NetBoxClient(_stub(17 * 1024 * 1024), Clock(), URL, TOKEN)
        outcome: list[object] = []
        d = Deferred.fromCoroutine(client.listAll("api/dcim/devices/"))
        d.addBoth(outcome.append)
        (failure,) = outcome
        # Not the answer (today's bug was to decode all of it): keep it out of logs.
        assert isinstance(failure, Failure), "the 17 MiB answer was read whole"
        error = failure.value
        assert isinstance(error, NetBoxError), failure
        self.assertEqual(error.kind, "unavailable")
        self.assertIn("larger than 16 MiB", str(error))

    def test_withinBound_read(self) -> None:
        """An answer just under the bound is read and decoded."""
        size = MAX_BODY - 1024
        client = NetBoxClient(_stub(size), Clock(), URL, TOKEN)
        results = self.successResultOf(
            Deferred.fromCoroutine(client.listAll("api/dcim/devices/"))
        )
        self.assertEqual(len(results[0]["x"]), size - 68)

    def test_unknownLength_stopsReading(self) -> None:
        """
        An answer of unknown length (40 MiB offered) is dropped as soon as
        it passes 16 MiB: the rest is never read.
        """
        response = _Dribble(40)
        http = _Answering(response)
        client = NetBoxClient(http, Clock(), URL, TOKEN)
        failure = self.failureResultOf(client.call("GET", client.url("api/")))
        failure.trap(NetBoxError)
        self.assertTrue(response.lost)
        self.assertEqual(response.sent, 17)


class _Answering:
    def __init__(self, response: Any) -> None:
        self.response = response

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        return succeed(self.response)


def _stub(size: int) -> Any:
    return StubTreq(_BigResource(size))


class _CutOff:
    """An HTTP client whose requests never answer; a cancel reports them
    as the agent does a request cut off before its answer."""

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        def cancel(d: Deferred[Any]) -> None:
            d.errback(ResponseNeverReceived([Failure(CancelledError())]))

        return Deferred(cancel)


class DeadConnectionTests(SynchronousTestCase):
    """A call NetBox never answered leaves no idle pooled connection behind."""

    def test_deadline_timeoutAndIdleConnectionsDropped(self) -> None:
        """
        A call past its deadline is a timeout (not "unreachable"), and the
        pool's idle connections are closed: one NetBox dropped without a
        word would cost the next call its whole deadline too.
        """
        clock = Clock()
        closed: list[int] = []

        def closer() -> Deferred[None]:
            closed.append(1)
            return succeed(None)

        client = NetBoxClient(_CutOff(), clock, URL, TOKEN, timeout=10.0, closer=closer)
        d = client.call("GET", client.url("api/dcim/devices/"))
        clock.advance(10)
        error = self.failureResultOf(d, NetBoxError).value
        assert isinstance(error, NetBoxError)
        self.assertEqual(error.kind, "timeout")
        self.assertEqual(closed, [1])

    def test_refused_idleConnectionsDropped(self) -> None:
        """A refused connection also drops the idle ones (NetBox restarted)."""
        closed: list[int] = []

        def closer() -> Deferred[None]:
            closed.append(1)
            return succeed(None)

        client = NetBoxClient(_Refused(), Clock(), URL, TOKEN, closer=closer)
        d = client.call("GET", client.url("api/dcim/devices/"))
        error = self.failureResultOf(d, NetBoxError).value
        assert isinstance(error, NetBoxError)
        self.assertEqual(error.kind, "unavailable")
        self.assertEqual(closed, [1])


class _Refused:
    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        return fail(ConnectionRefusedError("Connection refused"))
