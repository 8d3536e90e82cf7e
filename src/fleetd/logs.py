"""
Log observers: readable text, or one JSON object per line for journald.

A redacting filter sits in front of either: an event field whose name says
it holds a secret is replaced, a request object becomes its method and path
(never its query string), and C{code=}/C{token=}-style assignments and
bearer tokens inside any string are masked, both in the event's fields and
in the finished line (tracebacks and reprs included). The code never logs
secrets in the first place; this is the second line.

L{ThrottledLog} keeps per-request warnings from flooding the log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import IO, Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import (
    FileLogObserver,
    ILogObserver,
    LogEvent,
    Logger,
    eventAsJSON,
    formatEvent,
    formatEventAsClassicLogText,
)
from twisted.web.http import Request
from zope.interface import implementer

SECRET_FIELD = re.compile(
    r"(^|_)(code|token|secret|password|passphrase|key|body|config|authorization)s?($|_)",
    re.IGNORECASE,
)
_KEEP = {
    "log_format",
    "log_namespace",
    "log_level",
    "log_time",
    "log_source",
    "log_logger",
    "log_failure",
    "log_io",
    "log_system",
    "log_text",
    "log_trace",
    "log_flattened",
    "log_legacy",
    "log_id",
    "log_observer",
}
REDACTED = "<redacted>"

# `code=...`, `device_code=...`, `access_token=...` (also URL-encoded `%3D`
# and quoted, as a dataclass repr shows it) and `Bearer ...` in any text.
SECRET_ASSIGNMENT = re.compile(
    r"(?i)(\b[a-z_]*(?:code|token|secret|password)s?)(=|%3D)(\\?['\"])?"
    r"[^&\s'\"<>\\,;)\]}]+(?(3)\\?['\"])"
)
BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+")
# A Kubernetes bootstrap token anywhere (a rendered config, an exception):
# its public id stays, the secret half goes [K1]. Written to start at the
# dot (the id is checked behind it), so the search jumps from dot to dot
# instead of trying every position: the same matches as
# C{\b([a-z0-9]{6})\.[a-z0-9]{16}\b}.
BOOTSTRAP_TOKEN = re.compile(r"\.(?<=\b[a-z0-9]{6}\.)[a-z0-9]{16}\b")


def scrub(text: str) -> str:
    """
    C{text} with secret-looking assignments and bearer tokens masked.

    Each pattern runs only where it can match: an assignment needs C{=}
    or C{%3D}, a bearer token the word "bearer", a bootstrap token a dot.
    Most log lines have none of the first two, and the patterns cost tens
    of microseconds on a line.
    """
    if "=" in text or "%3" in text:
        text = SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    if "bearer" in text.lower():
        text = BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    if "." in text:
        text = BOOTSTRAP_TOKEN.sub("." + REDACTED, text)
    return text


def describeRequest(request: Request) -> str:
    """A request as method and path, without its query string."""
    method = bytes(getattr(request, "method", b"?") or b"?")
    uri = bytes(getattr(request, "uri", b"") or b"").split(b"?", 1)[0][:128]
    return "<{} {} {}>".format(
        type(request).__name__,
        method.decode("ascii", "replace"),
        uri.decode("ascii", "replace"),
    )


def _clean(value: Any) -> Any:
    """A field value safe to log, or C{value} itself when it already is."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Request):
        return describeRequest(value)
    if isinstance(value, tuple | list) and any(
        isinstance(v, str | Request) for v in value
    ):
        return type(value)(_clean(v) for v in value)
    return value


_SCRUBBED = ("log_format", "log_text", "message", "format", "log_source")


def redact(event: LogEvent) -> LogEvent:
    """
    Return C{event} with secret-named fields replaced, request objects
    described without their query string and secret-looking text masked.
    """
    copy: dict[str, Any] | None = None
    for key, value in event.items():
        if key in _KEEP and key not in _SCRUBBED:
            continue
        if key not in _KEEP and SECRET_FIELD.search(key):
            clean: Any = REDACTED
        else:
            clean = _clean(value)
        if clean is not value:
            if copy is None:
                copy = dict(event)
            copy[key] = clean
    return event if copy is None else copy


@implementer(ILogObserver)
class RedactingObserver:
    """Pass events through L{redact} to C{observer}."""

    def __init__(self, observer: ILogObserver) -> None:
        self._observer = observer

    def __call__(self, event: LogEvent) -> None:
        self._observer(redact(event))


def _jsonLine(event: LogEvent) -> str:
    withText = dict(event)
    withText["message"] = formatEvent(event)
    return eventAsJSON(withText) + "\n"


def _textLine(event: LogEvent) -> str | None:
    return formatEventAsClassicLogText(event)


FORMATS: dict[str, Callable[[LogEvent], str | None]] = {
    "json": _jsonLine,
    "text": _textLine,
}


def _scrubbed(
    format: Callable[[LogEvent], str | None],
) -> Callable[[LogEvent], str | None]:
    """C{format}, with L{scrub} over the finished line (tracebacks included)."""

    def line(event: LogEvent) -> str | None:
        text = format(event)
        return None if text is None else scrub(text)

    return line


def makeObserver(fmt: str, out: IO[Any]) -> ILogObserver:
    """An observer writing C{fmt} ('json' or 'text') lines to C{out}."""
    return RedactingObserver(FileLogObserver(out, _scrubbed(FORMATS[fmt])))


class ThrottledLog:
    """
    A L{Logger} that lets at most C{burst} lines of each event through per
    C{window} seconds; the rest are counted, and the next line that gets
    through says how many were suppressed (field C{suppressed}).

    For lines a client can cause once per request or connection, so a flood
    of requests cannot become a flood of log lines.
    """

    def __init__(
        self,
        clock: IReactorTime,
        logger: Logger | None = None,
        *,
        burst: int = 10,
        window: float = 10.0,
    ) -> None:
        self._clock = clock
        self._logger = Logger() if logger is None else logger
        self._burst = burst
        self._window = window
        # format -> (window start, lines in window, suppressed since last line)
        self._state: dict[str, tuple[float, int, int]] = {}

    def _admit(self, format: str) -> int | None:
        """The count suppressed before this line, or L{None} to drop it."""
        now = self._clock.seconds()
        start, shown, suppressed = self._state.get(format, (now, 0, 0))
        if now - start >= self._window:
            start, shown = now, 0
        if shown >= self._burst:
            self._state[format] = (start, shown, suppressed + 1)
            return None
        self._state[format] = (start, shown + 1, 0)
        return suppressed

    def _emit(self, method: Callable[..., None], format: str, fields: Any) -> None:
        suppressed = self._admit(format)
        if suppressed is None:
            return
        if suppressed:
            format += " ({suppressed} similar lines suppressed)"
            fields["suppressed"] = suppressed
        method(format, **fields)

    def debug(self, format: str, **fields: Any) -> None:
        self._emit(self._logger.debug, format, fields)

    def info(self, format: str, **fields: Any) -> None:
        self._emit(self._logger.info, format, fields)

    def warn(self, format: str, **fields: Any) -> None:
        self._emit(self._logger.warn, format, fields)

    def error(self, format: str, **fields: Any) -> None:
        self._emit(self._logger.error, format, fields)

    def failure(self, format: str, **fields: Any) -> None:
        """Like L{Logger.failure}: call it inside an C{except} block or pass
        C{failure=}."""
        self._emit(self._logger.failure, format, fields)


def dumpEvent(event: LogEvent) -> str:
    """A compact JSON rendering for tests that grep logs."""
    return json.dumps({k: repr(v) for k, v in redact(event).items()})
