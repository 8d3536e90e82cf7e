"""The device-flow tests' reported machine, run lookup and journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.store import (
    JOURNAL_PURPOSE,
    AsyncJournal,
    Database,
    InlineRunner,
    Journal,
    deriveKey,
)

REPORTED = {
    "uuid": "4c4c4544-0037-3010-8052-b4c04f4e3332",
    "serial": "S1",
    "mac": "12:34:56:78:9a:bc",
    "hostname": "talos-abc",
    "code": "one-time-secret-code-value",
}


IDENTITY = (REPORTED["uuid"], REPORTED["serial"])


class FakeRuns:
    """An L{IRunLookup} over dicts: w1 is the machine REPORTED describes."""

    def __init__(self) -> None:
        self.ready: dict[str, str] = {"w1": "run-1"}
        self.identities: dict[str, tuple[str, str]] = {"w1": IDENTITY}

    def readyRun(self, device: str) -> str | None:
        return self.ready.get(device)

    def identity(self, device: str) -> tuple[str, str] | None:
        return self.identities.get(device)

    def deviceByIdentity(self, uuid: str, serial: str) -> str | None:
        for device, (u, s) in self.identities.items():
            if u == uuid.strip().lower() and s.casefold() == serial.strip().casefold():
                return device
        return None


def makeJournal(case: SynchronousTestCase, clock: Any) -> AsyncJournal:
    db = Database.open(Path(case.mktemp()) / "fleetd.sqlite3")
    case.addCleanup(db.close)
    return AsyncJournal(
        InlineRunner(db), Journal(deriveKey(b"m" * 32, JOURNAL_PURPOSE)), clock
    )
