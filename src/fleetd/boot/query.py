"""
The query of a Talos config request: C{code}, C{uuid} and C{serial}.

Talos fills them in from the kernel command line (C{${code}} until the
node's META 0x0b holds one); anything that cannot be such a query is
refused as malformed (400).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from twisted.web.iweb import IRequest


class BadQuery(ValueError):
    """The query cannot be a Talos config request."""


@dataclass(frozen=True)
class Identity:
    """What a node says about itself in the query."""

    code: str | None
    uuid: str | None
    serial: str | None


_NAMES = frozenset(("code", "uuid", "serial"))
_PLAIN_NAMES = {name.encode("ascii"): name for name in _NAMES}


def parseQuery(request: IRequest) -> Identity:
    """
    Read C{code}, C{uuid} and C{serial}; refuse repeats and bad encodings.
    Other parameters are ignored.
    """
    raw = request.uri.partition(b"?")[2]
    values: dict[str, str] = {}
    for pair in raw.split(b"&") if raw else []:
        key, _, value = pair.partition(b"=")
        name = _PLAIN_NAMES.get(key)  # as nodes send them: nothing to decode
        try:
            if name is None:
                name = unquote(key)
            text = unquote(value)
        except UnicodeDecodeError as e:
            raise BadQuery("query is not UTF-8") from e
        if name not in _NAMES:
            continue
        if name in values:
            raise BadQuery(f"repeated parameter {name}")
        if len(text) > 256 or not text.isprintable():
            raise BadQuery(f"bad {name}")
        values[name] = text
    return Identity(values.get("code"), values.get("uuid"), values.get("serial"))


def unquote(part: bytes) -> str:
    """A query part decoded as a form does (C{+} is a space); plain ones cheaply."""
    if b"%" in part or b"+" in part:
        part = unquote_to_bytes(part.replace(b"+", b" "))
    return part.decode("utf-8")
