"""
Strict JSON for what fleetd is sent: request bodies and uploaded files.

One decoder for every place that reads JSON from a client [O3]: UTF-8
only, a key named twice in one object is refused (never "the last one
wins"), C{NaN} and C{Infinity} are refused (they are not JSON), and input
nested too deep is "not JSON" rather than a crash. Errors are a
L{JSONBodyError} with one short line that callers prefix (C{body: ...},
C{line N: ...}).
"""

from __future__ import annotations

import json
from typing import Any

MAX_KEY_SHOWN = 40


class JSONBodyError(ValueError):
    """The input is not strict JSON; the message is one short line."""


def _show(key: str) -> str:
    text = repr(key)
    return text if len(text) <= MAX_KEY_SHOWN else text[: MAX_KEY_SHOWN - 3] + "..."


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise JSONBodyError(f"key {_show(key)} appears twice")
        result[key] = value
    return result


def _constant(name: str) -> Any:
    raise JSONBodyError(f"{name} is not JSON")


DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_constant)
"""The strict decoder itself, for callers that walk a document (C{raw_decode})."""


def loads(data: bytes | str) -> Any:
    """
    Decode C{data} (UTF-8 bytes or text) as strict JSON.

    @raise JSONBodyError: C{"key 'k' appears twice"}, C{"NaN is not JSON"}
        or C{"not JSON"}.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return DECODER.decode(text)
    except JSONBodyError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise JSONBodyError("not JSON") from None
