"""
One generic reader: a settings dataclass declares each TOML key once.

A field's type says how its key is read (C{bool}, C{int}, C{float},
C{str}, C{Path}, each maybe C{| None}; a dataclass is a sub-table), its
default is the key's default (none: required), and its metadata holds the
rest: the bounds of a number, the TOML key when it differs from the field's
name (dotted for a key in another table), and a C{read} function for a key
that needs its own parsing. L{readSection} walks the fields in order through
a L{Table}, so every error names the key and unknown keys stay tracked.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args, get_type_hints

from fleetd.config.table import Table

T = TypeVar("T")
Read = Callable[[Table, str], Any]


def toml(
    *,
    key: str | None = None,
    read: Read | None = None,
    low: float | None = None,
    high: float | None = None,
) -> Mapping[str, Any]:
    """Field metadata: the TOML C{key}, a C{read} function, the bounds."""
    return {"key": key, "read": read, "bounds": (low, high)}


def setting(
    default: T,
    low: T | None = None,
    high: T | None = None,
    *,
    key: str | None = None,
    read: Read | None = None,
) -> T:
    """A key with a C{default} (and, for a number, its bounds)."""
    meta = {"key": key, "read": read, "bounds": (low, high)}
    return field(default=default, metadata=meta)


def readSection(cls: type[T], table: Table, **given: Any) -> T:
    """
    Read dataclass C{cls} from C{table}, one field at a time in declaration
    order; fields named in C{given} are taken as they are.
    """
    hints = get_type_hints(cls)
    values = dict(given)
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in given:
            values[f.name] = _read(f, hints[f.name], table)
    return cls(**values)


def _kind(hint: Any) -> tuple[Any, bool]:
    """C{X | None} -> C{(X, True)}; C{X} -> C{(X, False)}."""
    if isinstance(hint, types.UnionType) and type(None) in get_args(hint):
        return next(a for a in get_args(hint) if a is not type(None)), True
    return hint, False


def declaredDefaults(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Each key declared with L{setting} under C{cls}: its dotted TOML key
    and its default (for the README's reference, and its test)."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        key = prefix + (f.metadata.get("key") or f.name)
        kind, _ = _kind(hints[f.name])
        if is_dataclass(kind):
            yield from declaredDefaults(kind, key + ".")  # type: ignore[arg-type]
        elif "bounds" in f.metadata and f.default is not MISSING:
            yield key, f.default


def _read(f: Field[Any], hint: Any, table: Table) -> Any:
    meta = f.metadata
    required = f.default is MISSING and f.default_factory is MISSING
    *outer, name = (meta.get("key") or f.name).split(".")
    for part in outer:
        table = table.section(part, required)
    if meta.get("read") is not None:
        return meta["read"](table, name)
    kind, optional = _kind(hint)
    if is_dataclass(kind):
        if optional and table.table(name, required=False) is None:
            return None
        return readSection(kind, table.section(name, required))  # type: ignore[arg-type]
    default = None if f.default is MISSING else f.default
    low, high = meta.get("bounds", (None, None))
    if kind is bool:
        return table.flag(name, default)  # type: ignore[arg-type]
    if kind is int:
        return table.integer(name, default, low, high)  # type: ignore[arg-type]
    if kind is float:
        return table.number(name, default, float(low), float(high))  # type: ignore[arg-type]
    if kind is str:
        return table.optstr(name) if optional else table.text(name, default)
    if kind is Path:
        if optional:
            return table.optpath(name)
        return table.path(name, None if default is None else str(default))
    raise TypeError(f"{f.name}: no reader for {hint!r}")
