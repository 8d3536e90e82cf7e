"""
Faults injected into a fleet for [J1] tests: a journal that refuses to
append, a runner failing as a broken disk does, a vault that is full.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, fail

from fleetd.store.db import Database, StoreError
from fleetd.store.entries import JournalEntry
from fleetd.store.journal import Journal
from fleetd.vault import MemoryVault, VaultError
from tests.fleetsupport import KEY, Fleet

_T = TypeVar("_T")


class FaultyJournal(Journal):
    """The real journal, refusing every append while C{failing} is set."""

    failing: Exception | None = None
    onlyEvents: frozenset[str] | None = None  # fail only changes with these

    def appendMany(
        self, db: Database, entries: Sequence[Any], *, at: float, savepoint: bool = True
    ) -> list[JournalEntry]:
        if self.failing is not None and (
            self.onlyEvents is None or any(e.event in self.onlyEvents for e in entries)
        ):
            raise self.failing
        return super().appendMany(db, entries, at=at, savepoint=savepoint)


class FaultyRunner:
    """The inline runner, failing every call as a broken disk does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failing: Exception | None = None

    def run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        if self.failing is not None:
            return fail(self.failing)
        result: Deferred[_T] = self.inner.run(f)
        return result


class FullVault(MemoryVault):
    """A vault that refuses new files while C{full} (a full tmpfs)."""

    full = False

    def put(self, name: str, data: bytes) -> None:
        if self.full:
            raise VaultError("no space left on device")
        super().put(name, data)


FAULTS: dict[str, Callable[[], Exception]] = {
    "journal": lambda: StoreError("journal head is not authentic"),
    "database": lambda: sqlite3.OperationalError("disk I/O error"),
}


class Faults:
    """Switch faults on and off in a L{Fleet}."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.journal = FaultyJournal(KEY)
        fleet.journal._journal = self.journal
        self.runner = FaultyRunner(fleet.journal._runner)
        fleet.journal._runner = self.runner

    def inject(self, kind: str) -> None:
        if kind == "journal":
            self.journal.failing = FAULTS[kind]()
        else:
            self.runner.failing = FAULTS[kind]()

    def clear(self) -> None:
        self.journal.failing = None
        self.runner.failing = None
