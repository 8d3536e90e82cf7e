"""
CPU per delivery record on the database side, without threads or sockets.

A delivery is recorded in one transaction [J1]: the inventory release
(served record, status C{staged}) and its C{run.delivered} entry
(L{fleetd.runs.releaser.Releaser}). This builds N devices and runs in a
SQLite database on disk (WAL, synchronous=FULL, as fleetd runs it),
hands C{--batch} deliveries at a time to the real releaser and journal
and runs what they queued the way the database thread does
(L{fleetd.store.runner._runBatch}: one group commit), timing the
releaser's side and the database work with C{time.process_time}.
Compare two checkouts by running it with each one's C{PYTHONPATH}::

    PYTHONPATH=src .venv/bin/python bench/record_cost.py [--records 3000]
        [--batch 50] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from fleetd.inventory.model import ServedRecord
from fleetd.inventory.sqlite import SQLiteInventory
from fleetd.runs.releaser import Releaser
from fleetd.runs.store import RunRecord, insertRuns
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.store.runner import InlineRunner, _runBatch


class _Capture:
    """A runner that only collects the work it is given."""

    def __init__(self) -> None:
        self.calls: list[Callable[[Database], Any]] = []

    def run(self, f: Callable[[Database], Any]) -> Deferred[Any]:
        self.calls.append(f)
        return Deferred()


def once(records: int, batch: int, profile: bool) -> float:
    """Seconds of CPU per record for one fresh database."""
    directory = Path(tempfile.mkdtemp(prefix="fleetd-record-cost-"))
    try:
        db = Database.open(directory / "fleetd.sqlite3")
        clock = Clock()
        clock.advance(1.8e9)
        journal = Journal(b"k" * 32)
        inventory = SQLiteInventory(
            InlineRunner(db), AsyncJournal(InlineRunner(db), journal, clock)
        )
        with db.transaction() as conn:
            conn.executemany(
                "INSERT INTO devices (name, serial, uuid, class, status)"
                " VALUES (?, ?, ?, 'worker', 'planned')",
                [(f"n{i}", f"S{i:08d}", f"{i:032x}") for i in range(records)],
            )
        runs = [
            RunRecord(
                id=f"r-{i:016x}", device=f"n{i}", digest=f"{i:064x}", created_at=1.0
            )
            for i in range(records)
        ]
        with db.transaction():
            insertRuns(db, runs)
        capture = _Capture()
        releaser = Releaser(clock, inventory, AsyncJournal(capture, journal, clock))
        profiler = cProfile.Profile() if profile else None
        started = time.process_time()
        if profiler is not None:
            profiler.enable()
        for i in range(0, records, batch):
            # The deliveries that arrive while the database thread is busy,
            # then what it gets: one call each, or (a releaser that batches
            # records) fewer calls holding several.
            done = len(capture.calls)
            for run in runs[i : i + batch]:
                releaser.release(ServedRecord(run.id, run.device, 1.8e9, "127.0.0.1"))
            outcomes = _runBatch(db, capture.calls[done:])
            if not all(ok for ok, _ in outcomes):
                raise SystemExit(f"a record failed: {outcomes[0]}")
        if profiler is not None:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
        seconds = time.process_time() - started
        db.close()
        return seconds / records
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    figures = [
        once(args.records, args.batch, args.profile) * 1e6 for _ in range(args.repeat)
    ]
    print(
        f"{args.records} records in group commits of {args.batch}:"
        f" {statistics.median(figures):.0f} us CPU per record (median of"
        f" {len(figures)}: {', '.join(f'{f:.0f}' for f in figures)})"
    )


if __name__ == "__main__":
    main()
