"""
C{fleetctl backup FILE [--force]}: a consistent copy of fleetd's database,
made by fleetd while it runs (C{GET /v1/admin/backup}, owners only).

The copy is received into a temporary file beside C{FILE} (mode 0600),
flushed to disk, checked (C{PRAGMA integrity_check}), and only then
renamed to C{FILE}; an existing C{FILE} is kept unless C{--force}. It does
not include C{master.key}, nor the vault: restoring is in
docs/operations.md ("Backup and restore").
"""

from __future__ import annotations

import argparse
import http.client
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import IO, Any

from fleetd.cli.client import AdminClient, refused, unreachable
from fleetd.clitools import CLIError, writeJSON
from fleetd.config import Settings

CHUNK = 1 << 16


def addCommands(commands: Any) -> None:
    """Register C{backup} on fleetctl's subcommand parsers."""
    backup = commands.add_parser(
        "backup", help="copy fleetd's database, consistently, while it runs"
    )
    backup.add_argument("file", metavar="FILE", type=Path, help="where to write it")
    backup.add_argument("--force", action="store_true", help="replace FILE")
    backup.set_defaults(handler=cmdBackup)


def cmdBackup(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    target: Path = args.file
    if target.exists() and not args.force:
        raise CLIError(f"backup: {target} exists (--force replaces it)")
    client = AdminClient(settings, timeout=60.0)
    try:
        fd, name = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".partial", dir=target.parent
        )
    except OSError as e:
        raise CLIError(f"backup: cannot write in {target.parent}: {e.strerror}") from e
    partial = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            size, seq = _receive(client, f)
            f.flush()
            os.fsync(f.fileno())
        verdict = _check(partial)
        if verdict != "ok":
            raise CLIError(f"backup: the copy fails its integrity check: {verdict}")
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if args.json:
        writeJSON(
            out,
            {"file": str(target), "bytes": size, "journal_seq": seq, "integrity": "ok"},
        )
    else:
        out.write(
            f"backup {target}: {size} bytes, journal to seq {seq}, integrity ok\n"
        )
    return 0


def _receive(client: AdminClient, f: IO[bytes]) -> tuple[int, int]:
    """Stream the copy into C{f}; its size and the last journal seq in it."""
    conn = client.connection()
    try:
        conn.request("GET", "/v1/admin/backup", headers={"accept": "*/*"})
        response = conn.getresponse()
        if response.status != 200:
            raise refused(response.status, response.read(1 << 16))
        expected = int(response.getheader("content-length") or "-1")
        seq = int(response.getheader("fleetd-journal-seq") or "0")
        size = 0
        while chunk := response.read(CHUNK):
            f.write(chunk)
            size += len(chunk)
    except (OSError, http.client.HTTPException) as e:
        raise unreachable(client, e, "backup") from e
    finally:
        conn.close()
    if size != expected:
        raise CLIError(f"backup: received {size} of {expected} bytes; try again")
    return size, seq


def _check(path: Path) -> str:
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            (verdict,) = conn.execute("PRAGMA integrity_check").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise CLIError(f"backup: the copy is not a database: {e}") from e
    return str(verdict)
