"""
What a journal entry may hold: names, sizes, and the secret guard.

A field whose name says it may hold a secret is refused, as are PEM blocks
and oversized strings: the journal records references, never secrets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

FieldValue = str | int | float | bool | None

SECRET_WORDS = tuple("code token config body key secret password cert_pem".split())
"""A field whose name contains one of these (any case) is refused."""

MAX_STRING = 512
MAX_NAME = 128
MAX_FIELDS = 64

_FIELD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# Field names that passed the name checks (a pure function of the name):
# they come from fleetd's code, so a few dozen; bounded all the same.
_ACCEPTED: set[str] = set()
_MAX_ACCEPTED = 1024


def checkFields(fields: Mapping[str, FieldValue] | None) -> dict[str, FieldValue]:
    """Return a copy of C{fields}, refusing anything that may be a secret."""
    if fields is None:
        return {}
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"journal entries take at most {MAX_FIELDS} fields")
    checked: dict[str, FieldValue] = {}
    for name, value in fields.items():
        if not (name.__class__ is str and name in _ACCEPTED):
            _checkName(name)
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise ValueError(f"journal field {name!r} exceeds {MAX_STRING} chars")
            if "-----BEGIN" in value:
                raise ValueError(f"journal field {name!r} holds PEM data")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"journal field {name!r} is not finite")
        elif isinstance(value, int) and not isinstance(value, bool):
            if not -(2**63) <= value < 2**63:
                raise ValueError(f"journal field {name!r} is out of range")
        elif value is not None and not isinstance(value, bool):
            raise ValueError(
                f"journal field {name!r} must be str, int, float, bool or None"
            )
        checked[name] = value
    return checked


def _checkName(name: object) -> None:
    """Refuse a field name that is malformed or says it may hold a secret."""
    if not isinstance(name, str) or _FIELD_NAME.fullmatch(name) is None:
        raise ValueError(f"bad journal field name {str(name)[:64]!r}")
    lowered = name.lower()
    for word in SECRET_WORDS:
        if word in lowered:
            raise ValueError(
                f"journal field {name!r} may hold a secret ({word!r}); "
                "journal a reference instead"
            )
    if name.__class__ is str and len(_ACCEPTED) < _MAX_ACCEPTED:
        _ACCEPTED.add(name)


def checkName(what: str, value: str | None) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise ValueError(f"journal {what} must be 1 to {MAX_NAME} characters")
    if not value.isprintable():
        raise ValueError(f"journal {what} must be printable")
