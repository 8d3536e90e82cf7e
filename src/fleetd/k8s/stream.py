"""
Response bodies for L{fleetd.k8s.client}: bounded collection, and a
watch stream split into newline-delimited JSON events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse

from fleetd.k8s.errors import KubeError, KubeUnavailable, errorFor

MAX_BODY = 16 << 20
MAX_LINE = 4 << 20
_DONE = Failure(ResponseDone())


class LineReader(TwistedProtocol):
    """Split a streamed body into lines; hand each decoded JSON to C{onLine}."""

    def __init__(self, onLine: Callable[[Any], None], done: Deferred[None]) -> None:
        self._onLine = onLine
        self._done = done
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                self._line(line)
        if len(self._buffer) > MAX_LINE:
            self._fail(KubeError("watch: an event line is too long"))

    def _line(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            self._fail(KubeError("watch: an event line is not JSON"))
            return
        try:
            self._onLine(event)
        except Exception:
            self._fail(Failure())

    def _fail(self, error: Exception | Failure) -> None:
        if not self._done.called:
            self._done.errback(error)
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def stop(self) -> None:
        """End the stream from our side (stop, or a watch we no longer want)."""
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = _DONE) -> None:
        if self._done.called:
            return
        if self._buffer.strip():
            self._line(self._buffer)
            if self._done.called:
                return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._done.callback(None)
        else:
            self._done.errback(KubeUnavailable(f"watch: stream lost: {reason.value}"))


class Watch:
    """An open watch stream: C{done} fires when it ends; C{stop} ends it."""

    def __init__(self, what: str = "watch") -> None:
        self.what = what
        self.done: Deferred[None] = Deferred(lambda _: self.stop())
        self._lines: LineReader | None = None
        self._request: Deferred[Any] | None = None

    def stop(self, error: Exception | None = None) -> None:
        """End it; C{done} fails with C{error} (L{CancelledError} by default)."""
        if not self.done.called:
            self.done.errback(error or CancelledError())
        if self._lines is not None:
            self._lines.stop()
        elif self._request is not None:
            self._request.cancel()

    def expire(self) -> None:
        """The server kept it open past its own timeout: a broken stream."""
        self.stop(KubeUnavailable(f"{self.what}: no end from the server; reconnecting"))

    def follow(
        self,
        request: Deferred[IResponse],
        onEvent: Callable[[dict[str, Any]], None],
        clock: IReactorTime,
        timeoutSeconds: int,
    ) -> Watch:
        """
        Follow the answer to the watch C{request}: each event to
        C{onEvent}; C{done} fires when the server ends the stream, or fails
        (L{KubeUnavailable}, or the L{KubeError} of a non-200 answer).
        """
        what = self.what
        self._request = request

        def started(response: IResponse) -> Deferred[Any] | None:
            self._request = None
            if response.code != 200:
                chunks: list[bytes] = []
                collected: Deferred[None] = Deferred()
                response.deliverBody(BodyCollector(chunks, collected))

                def failed(_: object) -> None:
                    raise errorFor(response.code, b"".join(chunks), what)

                return collected.addCallback(failed)
            lines = LineReader(onEvent, Deferred())
            self._lines = lines
            response.deliverBody(lines)
            return lines._done

        def settle(result: object) -> None:
            if self.done.called:
                return
            if isinstance(result, Failure):
                if result.check(KubeError):
                    self.done.errback(result)
                else:
                    self.done.errback(
                        KubeUnavailable(
                            f"{what}: API unreachable: {result.getErrorMessage()}"
                        )
                    )
            else:
                self.done.callback(None)

        request.addCallback(started)
        request.addBoth(settle)
        # The server ends the stream after timeoutSeconds; this is the backstop.
        timer = clock.callLater(timeoutSeconds + 60, self.expire)

        def disarm(result: object) -> object:
            if timer.active():
                timer.cancel()
            return result

        self.done.addBoth(disarm)
        return self


class BodyCollector(TwistedProtocol):
    """Collect a bounded body."""

    def __init__(self, chunks: list[bytes], done: Deferred[None]) -> None:
        self._chunks = chunks
        self._done = done
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > MAX_BODY:
            if self.transport is not None:
                self.transport.stopProducing()  # type: ignore[attr-defined]
            if not self._done.called:
                self._done.errback(KubeUnavailable("answer too large"))
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        if self._done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._done.callback(None)
        else:
            self._done.errback(reason)
