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

import enum
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from string import Formatter
from typing import IO, Any

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IReactorTime
from twisted.logger import (
    FileLogObserver,
    ILogObserver,
    LogEvent,
    Logger,
    formatEvent,
    formatEventAsClassicLogText,
)
from twisted.python.failure import Failure
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
# and quoted, as a dataclass repr shows it, the closing quote optional) and
# `Bearer ...` in any text.
SECRET_ASSIGNMENT = re.compile(
    r"(?i)(\b[a-z_]*(?:code|token|secret|password)s?)(=|%3D)(\\?['\"])?"
    r"[^&\s'\"<>\\,;)\]}]+(?(3)(?:\\?['\"])?)"
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


# An event name: the first word of a fleetd format string, dotted and in
# lower case ("tink.h2.enhance-your-calm {reason}"), once any field in it
# is filled in ("netbox.push.{state}") and a trailing ":" or "," is dropped.
EVENT_NAME = re.compile(r"[a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)+")
# What Twisted's legacy bridge adds to an event: never the event's own.
_LEGACY = frozenset(
    {"message", "time", "system", "isError", "format", "why", "failure"}
)
_FIELD_KEY = re.compile(r"[.\[(!:]")


def eventName(event: LogEvent) -> str | None:
    """
    The first word of the event's format when it is a fleetd event name,
    else L{None} (Twisted's own lines, legacy messages, free text).
    """
    fmt = event.get("log_format")
    if not isinstance(fmt, str) or not fmt.strip():
        return None
    first = fmt.split(None, 1)[0]
    if "{" in first:
        first = formatEvent({**event, "log_format": first})
    first = first.rstrip(":,;")
    return first if EVENT_NAME.fullmatch(first) else None


def _formatKeys(fmt: object) -> list[str]:
    """The event keys a format string names, in order of appearance."""
    keys: list[str] = []
    if not isinstance(fmt, str):
        return keys
    try:
        for _, field, _, _ in Formatter().parse(fmt):
            key = _FIELD_KEY.split(field or "", maxsplit=1)[0]
            if key and key not in keys:
                keys.append(key)
    except ValueError:  # an unbalanced brace: the format names nothing
        pass
    return keys


def jsonValue(value: Any, nested: bool = False) -> Any:
    """
    C{value} as JSON that keeps a line flat: a scalar, or at the top an
    array of scalars; an address is C{host:port}, a mapping is its JSON
    text (fields named like secrets redacted), anything else its C{str};
    every string goes through L{scrub}.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, enum.Enum):
        return jsonValue(value.value, nested)
    if isinstance(value, bytes | bytearray):
        return scrub(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, IPv4Address | IPv6Address):
        host = f"[{value.host}]" if isinstance(value, IPv6Address) else value.host
        return f"{host}:{value.port}"
    if isinstance(value, Mapping):
        inner = {
            str(k): REDACTED if SECRET_FIELD.search(str(k)) else jsonValue(v, True)
            for k, v in value.items()
        }
        return scrub(json.dumps(inner, sort_keys=True))
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        rendered = [jsonValue(v, True) for v in items]
        return scrub(json.dumps(rendered)) if nested else rendered
    return scrub(str(value))


def _put(fields: dict[str, Any], key: str, value: Any) -> None:
    """Add C{key}, with a C{_} added while the name is taken."""
    while key in fields:
        key += "_"
    fields[key] = value


def _rfc3339(when: object) -> str:
    seconds = when if isinstance(when, int | float) else time.time()
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def jsonFields(event: LogEvent) -> dict[str, Any]:
    """
    The one flat object C{--log-format json} writes for C{event}: C{time}
    (RFC 3339, UTC), C{level}, C{event} (L{eventName}), then the keys the
    format names and the call supplied, in that order, and for a failure
    C{failure} and C{traceback}. No Twisted internals (C{log_*}, the
    legacy bridge's keys). A line that is not a fleetd event (Twisted's
    own) is named by its namespace (C{legacy} for old-style messages) and
    carries its text as C{message}. A field whose name is taken gets a
    trailing C{_}.
    """
    level = getattr(event.get("log_level"), "name", "info")
    name = eventName(event)
    fields: dict[str, Any] = {"time": _rfc3339(event.get("log_time")), "level": level}
    if name is None:
        namespace = event.get("log_namespace")
        legacy = namespace == "log_legacy" or not isinstance(namespace, str)
        fields["event"] = "legacy" if legacy else namespace
        fields["message"] = scrub(formatEvent(event))
    else:
        fields["event"] = name
    named = _formatKeys(event.get("log_format"))
    for key in dict.fromkeys([*named, *sorted(event)]):
        if key.startswith("log_") or key not in event:
            continue
        if key in _LEGACY and key not in named:
            continue
        _put(fields, key, jsonValue(event[key]))
    failure = event.get("log_failure")
    if isinstance(failure, Failure):
        kind = getattr(failure.type, "__name__", "Exception")
        _put(fields, "failure", scrub(f"{kind}: {failure.getErrorMessage()}"))
        _put(fields, "traceback", scrub(failure.getTraceback()))
    return fields


def _jsonLine(event: LogEvent) -> str:
    # Every string in the object went through scrub(): the finished line is
    # not scrubbed again, which could cut a JSON string's closing quote.
    return json.dumps(jsonFields(event)) + "\n"


def _textLine(event: LogEvent) -> str | None:
    return formatEventAsClassicLogText(event)


def _scrubbed(
    format: Callable[[LogEvent], str | None],
) -> Callable[[LogEvent], str | None]:
    """C{format}, with L{scrub} over the finished line (tracebacks included)."""

    def line(event: LogEvent) -> str | None:
        text = format(event)
        return None if text is None else scrub(text)

    return line


FORMATS: dict[str, Callable[[LogEvent], str | None]] = {
    "json": _jsonLine,
    "text": _scrubbed(_textLine),
}


def makeObserver(fmt: str, out: IO[Any]) -> ILogObserver:
    """An observer writing C{fmt} ('json' or 'text') lines to C{out}."""
    return RedactingObserver(FileLogObserver(out, FORMATS[fmt]))


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
