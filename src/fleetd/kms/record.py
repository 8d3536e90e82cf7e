"""
The destruction record [E3]: the ids of every disk key fleetd destroyed,
in a file outside the state database (C{kms.destroyed_keys}).

A restored older database holds keys destroyed since it was copied, and
with the embedded inventory the old status of their devices too; this
file is not restored with it, so at start every key the database holds
live whose id the file names is destroyed again
(L{fleetd.kms.retire.sweepAtStart}). The file is append-only: a header
line, then one JSON object a line (C{kek_id}, C{device}, C{uuid}, C{why},
C{at}), appended and fsynced after each commit that destroys keys; a key
destroyed in the database but missing from the file (a crash between the
commit and the append) is appended at the next start.

L{loadRecord} reads it before anything listens (blocking): a missing file
is made (mode 0600); an unreadable or malformed one is a L{RecordError}
that stops start-up, never a guess. The one exception is the file's last
line without its newline, the trace of an append cut short by a crash: a
whole record there is kept (its newline added), a part of one is cut off
(the database still holds that destruction, so the start-up appends it
again). L{DestructionRecord} appends in a worker thread, one write at a
time; a failed write stays queued, counted and retried (docs/decisions.md,
"Disk keys").
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.kms.reasons import KMSMetrics
from fleetd.kms.store import KeyRow

HEADER = "# fleetd kms destroyed keys v1"
RETRY = 30.0  # seconds between tries of a failed append
_KEY_ID = re.compile(r"[0-9a-f]{32}")

log = Logger()


class RecordError(Exception):
    """The record cannot be read or made, or is not one: one line."""


@dataclass(frozen=True)
class Destroyed:
    """One destroyed key, as its line says."""

    kek_id: str
    device: str
    uuid: str
    why: str
    at: float

    def line(self) -> bytes:
        doc = {
            "kek_id": self.kek_id, "device": self.device, "uuid": self.uuid,
            "why": self.why, "at": self.at,
        }  # fmt: skip
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def destroyedRow(
    row: KeyRow, why: str | None = None, at: float | None = None
) -> Destroyed:
    """The line of a key row destroyed C{at} for C{why}, or as the row
    says when those are not given."""
    when = row.destroyed_at if at is None else at
    return Destroyed(
        row.id, row.device, row.uuid, why or row.destroyed_why or "unknown",
        0.0 if when is None else float(when),
    )  # fmt: skip


@dataclass(frozen=True)
class LoadedRecord:
    """The record as read at start."""

    path: Path
    ids: frozenset[str]
    created: bool = False
    repaired: str | None = None  # what was done to an unterminated last line


def _parse(line: str) -> Destroyed:
    """
    @raise ValueError: the line is not a record of a destroyed key.
    """
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    keyId, at = doc.get("kek_id"), doc.get("at")
    if not isinstance(keyId, str) or not _KEY_ID.fullmatch(keyId):
        raise ValueError("kek_id is not a key id (32 hex digits)")
    for name in ("device", "uuid", "why"):
        if not isinstance(doc.get(name), str):
            raise ValueError(f"{name} is not a string")
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise ValueError("at is not a time")
    return Destroyed(keyId, doc["device"], doc["uuid"], doc["why"], float(at))


def _create(path: Path) -> None:
    """The header alone, in a new file put in place atomically (a file
    made meanwhile by another process is kept)."""
    temp = path.with_name(f".tmp-{path.name}-{secrets.token_hex(8)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, HEADER.encode() + b"\n")
        os.fsync(fd)
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
    finally:
        os.close(fd)
        os.unlink(temp)
    _syncDirectory(path.parent)


def _syncDirectory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def loadRecord(path: Path) -> LoadedRecord:
    """
    Read the record at C{path}, making it when missing. Blocking: call it
    before the reactor runs.

    @raise RecordError: it cannot be read or made, or is not a record.
    """
    created = False
    try:
        if not path.exists():
            _create(path)
            created = True
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise RecordError(f"{path} is not a regular file")
            data = f.read()
    except OSError as e:
        raise RecordError(f"cannot read or make {path}: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordError(f"{path} is not UTF-8 text: not a record") from None
    lines = text.split("\n")
    if len(lines) < 2 or lines[0] != HEADER:
        raise RecordError(
            f"{path} does not start with the line {HEADER!r}: not a record of"
            " destroyed keys (restore it, or remove it to have it made again"
            " from the database)"
        )
    ids: set[str] = set()
    for number, line in enumerate(lines[1:-1], 2):
        try:
            ids.add(_parse(line).kek_id)
        except ValueError as e:
            raise RecordError(
                f"{path} line {number} is not a record of a destroyed key ({e});"
                " fleetd does not guess: put it right or remove that line"
            ) from None
    repaired = None
    if lines[-1]:  # the last append was cut short
        repaired = _repairTail(path, len(data) - len(lines[-1].encode()), lines[-1])
        if repaired.startswith("kept"):
            ids.add(_parse(lines[-1]).kek_id)
        log.warn("kms.record-repaired {path}: {what}", path=str(path), what=repaired)
    return LoadedRecord(path, frozenset(ids), created, repaired)


def _repairTail(path: Path, end: int, tail: str) -> str:
    """A whole record on the unterminated last line gets its newline; a
    part of one is cut off (the start-up appends it again from the
    database)."""
    try:
        whole = _parse(tail) is not None
    except ValueError:
        whole = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            if whole:
                os.write(fd, b"\n")
            else:
                os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise RecordError(f"cannot repair {path}'s last line: {e.strerror}") from e
    if whole:
        return "kept its unterminated last line, a whole record"
    return f"cut off an interrupted append ({len(tail.encode())} bytes)"


def appendRecord(path: Path, entries: Sequence[Destroyed]) -> None:
    """
    Append C{entries} to the record and fsync it. Blocking: call it in a
    worker thread. The file must exist (it is made at start); on a failure
    it is cut back to its size before, so no part of a line stays.

    @raise OSError: the append failed.
    """
    data = b"".join(entry.line() for entry in entries)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


Threads = Callable[..., "Deferred[Any]"]


class DestructionRecord:
    """
    The record while fleetd runs: what it holds, and the appends queued
    after each commit that destroys keys, written one batch at a time in a
    worker thread. An append that fails stays queued
    (C{fleetd_kms_destructions_unrecorded}) and is tried again every
    L{RETRY} seconds and with the next one.
    """

    log = Logger()

    def __init__(
        self,
        loaded: LoadedRecord,
        *,
        clock: IReactorTime,
        metrics: KMSMetrics,
        inThread: Threads = deferToThread,
        append: Callable[[Path, Sequence[Destroyed]], None] = appendRecord,
    ) -> None:
        self.path = loaded.path
        self._ids = set(loaded.ids)
        self._clock = clock
        self._metrics = metrics
        self._inThread = inThread
        self._append = append
        self._pending: list[Destroyed] = []
        self._waiting: list[Deferred[bool]] = []
        self._busy = False
        self._retry: IDelayedCall | None = None
        self._stopped = False

    def ids(self) -> frozenset[str]:
        """The ids the file holds (written, not queued)."""
        return frozenset(self._ids)

    @property
    def unrecorded(self) -> int:
        """Destroyed keys queued, not yet in the file."""
        return len(self._pending)

    def add(self, entries: Iterable[Destroyed]) -> Deferred[bool]:
        """
        Queue C{entries} (each commit's destroyed keys, after the commit);
        fires C{True} once nothing queued before it is left out of the file
        (written and fsynced), C{False} when that try failed (what failed
        stays queued). Never fails.
        """
        queued = {entry.kek_id for entry in self._pending}
        ids = self._ids
        new = [e for e in entries if e.kek_id not in ids and e.kek_id not in queued]
        if not new and not self._pending:
            return succeed(True)
        if self._stopped:  # the next start appends it from the database
            return succeed(False)
        self._pending.extend(new)
        self._gauge()
        waiter: Deferred[bool] = Deferred()
        self._waiting.append(waiter)
        self._kick()
        return waiter

    def _kick(self) -> None:
        if self._busy or self._stopped:
            return
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        waiting, self._waiting = self._waiting, []
        if not self._pending:
            for waiter in waiting:
                waiter.callback(True)
            return
        batch = list(self._pending)
        self._busy = True

        def written(_: object) -> None:
            self._busy = False
            del self._pending[: len(batch)]
            self._ids.update(entry.kek_id for entry in batch)
            self._gauge()
            for waiter in waiting:
                waiter.callback(True)
            self._kick()

        def failed(failure: Failure) -> None:
            self._busy = False
            self._metrics.recordFailures.inc()
            self.log.failure(
                "kms.record-append-failed {path}: {pending} destroyed keys are"
                " not in the destruction record yet; retrying",
                failure=failure, path=str(self.path), pending=len(self._pending),
            )  # fmt: skip
            for waiter in waiting:
                waiter.callback(False)
            if not self._stopped:
                self._retry = self._clock.callLater(RETRY, self._kick)

        self._inThread(self._append, self.path, batch).addCallbacks(written, failed)

    def _gauge(self) -> None:
        self._metrics.unrecorded.set(len(self._pending))

    def stop(self) -> None:
        """No more tries (fleetd stops); what is queued is appended at the
        next start from the database."""
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.callback(False)
