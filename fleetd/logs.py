"""
Log observers: readable text, or one JSON object per line for journald.

A redacting filter sits in front of either: an event field whose name says
it holds a secret is replaced before any observer sees it. The code never
logs secrets in the first place; this is the second line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import IO, Any

from twisted.logger import (
    FileLogObserver,
    ILogObserver,
    LogEvent,
    eventAsJSON,
    formatEvent,
    formatEventAsClassicLogText,
)
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


def redact(event: LogEvent) -> LogEvent:
    """Return C{event} with secret-named fields replaced."""
    hits = [k for k in event if k not in _KEEP and SECRET_FIELD.search(k)]
    if not hits:
        return event
    copy = dict(event)
    for k in hits:
        copy[k] = REDACTED
    return copy


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


def makeObserver(fmt: str, out: IO[Any]) -> ILogObserver:
    """An observer writing C{fmt} ('json' or 'text') lines to C{out}."""
    return RedactingObserver(FileLogObserver(out, FORMATS[fmt]))


def dumpEvent(event: LogEvent) -> str:
    """A compact JSON rendering for tests that grep logs."""
    return json.dumps({k: repr(v) for k, v in redact(event).items()})
