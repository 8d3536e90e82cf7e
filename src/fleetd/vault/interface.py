"""
What a vault is: a mapping of validated names to secret bytes
(L{IVault}), the name rule, and L{MemoryVault} for tests. The directory
on tmpfs that fleetd runs with is L{fleetd.vault.store.DirectoryVault}.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

from fleetd.vault.errors import VaultError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@runtime_checkable
class IVault(Protocol):
    """A mapping of validated names to secret bytes."""

    def put(self, name: str, data: bytes) -> None:
        """Store C{data} under C{name}, replacing any previous value."""

    def get(self, name: str) -> bytes | None:
        """Return the value stored under C{name}, or L{None}."""

    def delete(self, name: str) -> None:
        """Forget C{name}; no error if it is absent."""

    def names(self) -> list[str]:
        """Return all stored names, sorted."""

    def __iter__(self) -> Iterator[str]:
        """Every stored name, in no order (no sort: for a pass over all)."""

    def __len__(self) -> int:
        """Return the number of stored entries."""

    def __contains__(self, name: object) -> bool:
        """Return whether C{name} is stored."""


@runtime_checkable
class IClosableVault(IVault, Protocol):
    """An L{IVault} holding an open directory, released by L{close}."""

    def close(self) -> None:
        """
        Release the directory. Later puts and deletes raise L{VaultError};
        gets and names still answer from memory. Closing twice is harmless.
        """


def checkName(name: str) -> str:
    """Return C{name} if it is a valid vault name, else raise L{VaultError}."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        shown = repr(name[:64]) if isinstance(name, str) else type(name).__name__
        raise VaultError(f"bad vault name {shown}")
    return name


def isValidName(name: object) -> bool:
    """Whether C{name} is a valid vault name (L{checkName}, without raising)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


class MemoryVault:
    """A dict-backed L{IVault}, for tests."""

    def __init__(self, entries: Iterable[tuple[str, bytes]] = ()) -> None:
        self._entries: dict[str, bytes] = {}
        for name, data in entries:
            self.put(name, data)

    def put(self, name: str, data: bytes) -> None:
        self._entries[checkName(name)] = bytes(data)

    def get(self, name: str) -> bytes | None:
        return self._entries.get(checkName(name))

    def delete(self, name: str) -> None:
        self._entries.pop(checkName(name), None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        # Only valid names are ever kept.
        return isinstance(name, str) and name in self._entries
