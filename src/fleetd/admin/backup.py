"""
C{GET /v1/admin/backup}: a consistent copy of fleetd's database, for
C{fleetctl backup FILE} (issue 19 item 3).

Only operators get here (the owner gate), readers too [O4]: the copy
holds the inventory, the journal, bindings, evidence and sealed token
records (see L{fleetd.store.backup}); the backup job runs as a reader.
The copy is made in a worker thread with SQLite's online backup API into
a temporary file beside the database (mode 0600), streamed as
C{application/vnd.sqlite3} with its length and the last journal seq it
holds (C{fleetd-journal-seq}), and removed once sent or once the client
went away. Who took a copy is journaled (C{backup.taken}, actor
C{owner:NAME} or C{reader:NAME}) when the journal takes it; a journal
that refuses appends (a broken head) does not stop a backup, which is
exactly when one is wanted.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.protocols.basic import FileSender
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.iweb import IRequest

from fleetd.store.backup import PREFIX, BackupCopy, copyDatabase
from fleetd.store.db import StoreError
from fleetd.store.journal import AsyncJournal
from fleetd.web.owner import actorOf
from fleetd.web.resources import Endpoint, textResponse

CONTENT_TYPE = b"application/vnd.sqlite3"
Offload = Callable[[Callable[[bytes], Any], bytes], Awaitable[Any]]


class BackupResource(Endpoint):
    """Stream a consistent copy of the database at C{database}."""

    isLeaf = True
    log = Logger()

    def __init__(self, database: Path, journal: AsyncJournal, offload: Offload) -> None:
        """
        @param offload: runs the blocking copy in a worker thread.
        """
        super().__init__()
        self._database = database
        self._journal = journal
        self._offload = offload

    def render_GET(self, request: IRequest) -> int:
        actor = actorOf(request) or "owner:unknown"
        Deferred.fromCoroutine(self._send(request, actor)).addErrback(
            self._failed, request
        )
        notDoneYet: int = server.NOT_DONE_YET
        return notDoneYet

    def _failed(self, failure: Failure, request: Any) -> None:
        self.log.failure("admin.backup.failed", failure=failure)
        if request.finished or request._disconnected:
            return
        if not request.startedWriting:
            request.write(
                textResponse(request, http.INTERNAL_SERVER_ERROR, "internal error")
            )
        request.finish()

    async def _send(self, request: Any, actor: str) -> None:
        gone: list[bool] = []
        request.notifyFinish().addErrback(lambda _: gone.append(True))
        target = self._database.parent / f"{PREFIX}{secrets.token_hex(8)}.sqlite3"
        try:
            copy: BackupCopy = await self._offload(
                lambda _: copyDatabase(self._database, target), b""
            )
        except StoreError as e:
            self.log.error("admin.backup.failed {reason}", reason=str(e))
            if not gone:
                request.write(textResponse(request, http.SERVICE_UNAVAILABLE, str(e)))
                request.finish()
            return
        try:
            await self._journaled(copy, actor)
            if gone:
                return
            request.setHeader(b"content-type", CONTENT_TYPE)
            request.setHeader(b"content-length", str(copy.size).encode("ascii"))
            request.setHeader(b"cache-control", b"no-store")
            request.setHeader(b"fleetd-journal-seq", str(copy.journalSeq).encode())
            with copy.path.open("rb") as f:
                sent = FileSender().beginFileTransfer(f, request)
                await sent.addErrback(lambda _: None)
            if not gone:
                request.finish()
            self.log.info(
                "admin.backup.sent {size} bytes to {actor}",
                size=copy.size,
                actor=actor,
                journalSeq=copy.journalSeq,
            )
        finally:
            copy.path.unlink(missing_ok=True)

    async def _journaled(self, copy: BackupCopy, actor: str) -> None:
        try:
            await self._journal.append(
                "backup.taken",
                actor=actor,
                fields={"journal_seq": copy.journalSeq, "bytes": copy.size},
            )
        except Exception:
            self.log.warn(
                "admin.backup.unjournaled {reason}",
                reason=Failure().getErrorMessage(),
            )
