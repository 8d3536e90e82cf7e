"""
An L{H2Connection} that drains on GOAWAY instead of stopping dead.

The ``h2`` package moves a connection to CLOSED as soon as a GOAWAY is sent
or received, after which it refuses to send anything, so streams already
accepted could not finish. HTTP/2 (RFC 9113 section 6.8) says those streams
go on: a graceful GOAWAY only stops new ones. L{DrainingH2Connection} keeps
the connection open for the streams in flight when the GOAWAY carries
NO_ERROR; the protocols built on it stop opening (or accepting) new streams
themselves. A GOAWAY with an error code still closes at once.
"""

from __future__ import annotations

from typing import Any

from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import ConnectionTerminated, Event
from hyperframe.frame import Frame, GoAwayFrame


class DrainingH2Connection(H2Connection):
    """Graceful GOAWAY both ways (see the module docstring)."""

    def goAway(self, lastStreamId: int, debug: bytes = b"") -> None:
        """Queue GOAWAY(NO_ERROR, C{lastStreamId}) and keep serving the
        streams at or below it."""
        frame = GoAwayFrame(
            stream_id=0,
            last_stream_id=lastStreamId,
            error_code=ErrorCodes.NO_ERROR,
            additional_data=debug,
        )
        self._prepare_for_sending([frame])

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Frame], list[Event]]:
        if frame.error_code != ErrorCodes.NO_ERROR:
            result: tuple[list[Frame], list[Event]] = super()._receive_goaway_frame(
                frame
            )
            return result
        event = ConnectionTerminated()
        event.error_code = ErrorCodes.NO_ERROR
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]
