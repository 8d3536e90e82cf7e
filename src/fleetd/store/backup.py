"""
A consistent copy of the database while fleetd runs (issue 19 item 3).

L{copyDatabase} opens a connection of its own to C{fleetd.sqlite3} and
copies it with SQLite's online backup API in one step: that step reads
one snapshot of a WAL database, so the copy holds every transaction
committed before it and none after (a change and its journal entry
together [J1]), while fleetd's own connection goes on writing. It runs in
a worker thread, never on the database thread, so nothing waits for it.
The copy is switched out of WAL mode, so it is one self-contained file,
and checked (C{PRAGMA integrity_check}) before it is handed out.

What the copy holds (and why only owners get it): the inventory (names,
serials, SMBIOS uuids, MACs), runs (ids and digests of their codes, never
a code or a configuration body), the journal, EK bindings and attestation
evidence, LDevID records, disk reports, Kubernetes token records (the
secrets sealed with a key derived from C{master.key}) and the NetBox
outbox. It does not hold C{master.key}, without which the journal cannot
be verified nor the sealed secrets opened, nor the vault (tmpfs).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from fleetd.store.db import StoreError

PREFIX = ".backup-"
"""Copies being made or sent sit in the state directory under this prefix."""


@dataclass(frozen=True)
class BackupCopy:
    """A checked copy: its file, size, and the last journal seq it holds."""

    path: Path
    size: int
    journalSeq: int


def copyDatabase(source: Path, target: Path) -> BackupCopy:
    """
    Copy the database at C{source} to the new file C{target} (mode 0600),
    consistently, while others write to C{source}. Blocking: call it in a
    worker thread.

    @raise StoreError: the copy could not be made or does not check out
        (C{target} is then removed).
    """
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        return _copy(source, target)
    except (OSError, sqlite3.Error) as e:
        target.unlink(missing_ok=True)
        raise StoreError(f"cannot back up the database: {e}") from e
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _copy(source: Path, target: Path) -> BackupCopy:
    uri = source.resolve().as_uri() + "?mode=ro"
    src = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        src.execute("PRAGMA busy_timeout=5000")
        dst = sqlite3.connect(target, isolation_level=None)
        try:
            src.backup(dst)  # pages=-1: one step, one snapshot
            dst.execute("PRAGMA journal_mode=DELETE")
            (verdict,) = dst.execute("PRAGMA integrity_check").fetchone()
            (seq,) = dst.execute("SELECT coalesce(max(seq), 0) FROM journal").fetchone()
        finally:
            dst.close()
    finally:
        src.close()
    if verdict != "ok":
        raise StoreError(f"the copy fails its integrity check: {verdict}")
    with target.open("rb") as f:
        os.fsync(f.fileno())
    return BackupCopy(target, target.stat().st_size, int(seq))
