"""
Typed access to one TOML table, naming every problem by its dotted key.

A key or table that nothing reads is an error (section 3): each L{Table}
records the names asked of it, whether present or not, and
L{checkUnknownKeys} runs after parsing. A key read through the accessors
is therefore known without a list to keep in step.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twisted.internet.endpoints import (
    TCP4ServerEndpoint,
    TCP6ServerEndpoint,
    UNIXServerEndpoint,
    serverFromString,
)

from fleetd.topology import ConfigError

# In C{paths.vault}: the config file's directory as L{configDirId} names it,
# so that two checkouts' dev configs keep two vaults on one machine.
CONFIG_DIR_ID = "{config_dir_id}"


def configDirId(directory: Path) -> str:
    """Twelve hex digits of the SHA-256 of C{directory}'s absolute path."""
    absolute = os.path.abspath(directory)
    return hashlib.sha256(os.fsencode(absolute)).hexdigest()[:12]


class Table:
    """
    Typed access to one TOML table, naming keys by their dotted path.

    Every name asked of the table (present or not) is recorded as known;
    L{checkUnknownKeys} refuses whatever the document holds beyond that.
    """

    def __init__(self, data: Mapping[str, Any], prefix: str, base: Path) -> None:
        self._data = data
        self._prefix = prefix
        self._base = base
        self._known: set[str] = set()
        self._tables: dict[str, Table] = {}

    def key(self, name: str) -> str:
        return f"{self._prefix}.{name}" if self._prefix else name

    def _get(self, name: str, default: Any = None) -> Any:
        self._known.add(name)
        return self._data.get(name, default)

    def table(self, name: str, required: bool = True) -> Table | None:
        value = self._get(name)
        if value is None:
            if required:
                raise ConfigError(self.key(name), "missing table" + self._hint(name))
            return None
        if not isinstance(value, dict):
            raise ConfigError(self.key(name), "must be a table")
        if name not in self._tables:
            self._tables[name] = Table(value, self.key(name), self._base)
        return self._tables[name]

    def names(self) -> list[str]:
        """The keys present here, in document order (each now known)."""
        self._known.update(self._data)
        return list(self._data)

    def has(self, name: str) -> bool:
        """Whether C{name} is present (it is known from now on)."""
        return self._get(name) is not None

    def section(self, name: str, required: bool = True) -> Table:
        """L{table}, or an empty stand-in when an optional one is absent."""
        return self.table(name, required) or Table({}, self.key(name), self._base)

    def unknown(self) -> list[ConfigError]:
        """Every key or table here and below that nothing has read."""
        errors = []
        for name, value in self._data.items():
            if name in self._known:
                continue
            kind = "table" if _isTable(value) else "key"
            errors.append(
                ConfigError(self.key(name), f"unknown {kind}" + self._near(name))
            )
        for table in self._tables.values():
            errors.extend(table.unknown())
        return errors

    def _near(self, name: str) -> str:
        """A hint naming the known key closest to the unknown C{name}."""
        close = difflib.get_close_matches(name, sorted(self._known), n=1, cutoff=0.75)
        return f" (did you mean {self.key(close[0])}?)" if close else ""

    def _hint(self, name: str) -> str:
        """A hint naming an unread key present here that looks like C{name}."""
        present = sorted(k for k in self._data if k not in self._known)
        close = difflib.get_close_matches(name, present, n=1, cutoff=0.75)
        return f" (found {self.key(close[0])}: a typo?)" if close else ""

    def text(self, name: str, default: str | None = None) -> str:
        value = self._get(name, default)
        if value is None:
            raise ConfigError(self.key(name), "missing" + self._hint(name))
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(self.key(name), "must be a non-empty string")
        return value

    def optstr(self, name: str) -> str | None:
        if self._get(name) is None:
            return None
        return self.text(name)

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key(name), "must be an integer")
        if not low <= value <= high:
            raise ConfigError(self.key(name), f"must be between {low} and {high}")
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.key(name), "must be a number")
        if not low <= value <= high:
            raise ConfigError(self.key(name), f"must be between {low} and {high}")
        return float(value)

    def strings(self, name: str) -> tuple[str, ...]:
        """A list of non-empty strings; absent, the empty tuple."""
        value = self._get(name, [])
        if not isinstance(value, list) or not all(
            isinstance(item, str) and item.strip() for item in value
        ):
            raise ConfigError(self.key(name), "must be a list of non-empty strings")
        return tuple(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise ConfigError(self.key(name), "must be true or false")
        return value

    def path(self, name: str, default: str | None = None) -> Path:
        return self._resolve(self.text(name, default))

    def placedPath(self, name: str) -> Path:
        """
        L{path}, where C{{config_dir_id}} stands for L{configDirId} of the
        config file's directory; any other brace is refused (a misspelt
        placeholder must not become a directory name).
        """
        value = self.text(name).replace(CONFIG_DIR_ID, configDirId(self._base))
        if "{" in value or "}" in value:
            raise ConfigError(
                self.key(name), f"no placeholder but {CONFIG_DIR_ID} may stand in it"
            )
        return self._resolve(value)

    def optpath(self, name: str) -> Path | None:
        value = self.optstr(name)
        return None if value is None else self._resolve(value)

    def endpoint(self, name: str) -> str:
        description = self.text(name)
        kind = description.split(":", 1)[0].strip().lower()
        if kind not in ("tcp", "tcp6", "unix"):
            raise ConfigError(
                self.key(name),
                "only tcp:, tcp6: and unix: endpoints; TLS is configured in [tls]",
            )
        try:
            # Parsing only: no reactor is touched until listen() is called.
            endpoint = serverFromString(None, description)
        except Exception as e:  # the parsers raise many kinds
            raise ConfigError(self.key(name), f"bad endpoint description: {e}") from e
        allowed = (TCP4ServerEndpoint, TCP6ServerEndpoint, UNIXServerEndpoint)
        if not isinstance(endpoint, allowed):
            raise ConfigError(
                self.key(name),
                "only tcp:, tcp6: and unix: endpoints; TLS is configured in [tls]",
            )
        return description

    def _resolve(self, value: str) -> Path:
        return Path(os.path.normpath(self._base / value))


def _isTable(value: object) -> bool:
    """A TOML table, or an array of tables (C{[[name]]})."""
    if isinstance(value, list) and value:
        return all(isinstance(item, dict) for item in value)
    return isinstance(value, dict)


def checkUnknownKeys(root: Table) -> None:
    """
    Raise L{ConfigError} for the first key or table (in document order,
    tables before their sub-tables) that nothing read: a typo must never
    fall back silently to a default (section 3).
    """
    errors = root.unknown()
    if errors:
        raise errors[0]
