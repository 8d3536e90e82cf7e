"""
The journal mirror: every journal entry about a device is copied to that
device's NetBox journal (C{/api/extras/journal-entries/}), at least once
and never twice.

Each mirrored entry carries C{fleetd-entry: <seq>-<digest>} on a line of
its own in its comments. Progress is kept in C{netbox_mirror} (migration
11): C{seq}, the last entry handled, and C{doubt}, the entry whose POST
was sent without an answer (a timeout, a crash). Before posting an entry
in doubt the mirror searches that device's journal for its marker
(NetBox's C{q} is a substring search, so the exact marker line is
checked), so a retry after a timeout never posts it twice.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from fleetd.inventory.model import InventoryError
from fleetd.netbox.client import RETRY_FIRST, RETRY_MAX, NetBoxClient, NetBoxError
from fleetd.netbox.devices import JOURNAL, OBJECT_TYPE, findByName, remote
from fleetd.store.db import Database
from fleetd.store.entries import JournalEntry, canonicalJSON, countAfter, query
from fleetd.store.runner import IRunner

POLL = 5.0
BATCH = 100
FIRST_DELAY = RETRY_FIRST
MAX_DELAY = RETRY_MAX


def marker(entry: JournalEntry) -> str:
    """The line that names a journal entry in NetBox."""
    return f"fleetd-entry: {entry.seq}-{entry.digest[:16]}"


def carries(comments: object, line: str) -> bool:
    """Whether C{comments} holds exactly the marker C{line} on a line of its own."""
    if not isinstance(comments, str):
        return False
    return re.search(rf"(?m)^{re.escape(line)}\s*$", comments) is not None


def kindOf(event: str) -> str:
    if event.endswith(
        (".refused", ".failed", ".missing", ".lost", ".broken", "-after-retirement")
    ):
        return "warning"
    if event.endswith((".released", ".approved", ".delivered")):
        return "success"
    return "info"


def codeSpan(text: str) -> str:
    """
    C{text} as one Markdown (CommonMark) code span, whatever it holds: the
    fence is one backtick longer than the longest run inside, a space pads
    content that starts or ends with a backtick or a space (CommonMark
    strips one each side), and line breaks become spaces, so a value can
    neither leave the span nor start a line of its own (a marker, say).
    """
    text = re.sub(r"\r\n|[\r\n]", " ", text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    if text.strip(" ") and (text[0] in "` " or text[-1] in "` "):
        text = f" {text} "
    return f"{fence}{text or ' '}{fence}"


def comments(entry: JournalEntry) -> str:
    """The entry as Markdown: event, actor, run, fields, then the marker."""
    lines = [f"**{entry.event}** by {codeSpan(entry.actor)}"]
    if entry.run:
        lines.append(f"run {codeSpan(entry.run)}")
    if entry.fields:
        lines.append(codeSpan(canonicalJSON(dict(entry.fields))))
    lines.append("")
    lines.append(marker(entry))
    return "\n".join(lines)


def _state(db: Database) -> tuple[int, int | None]:
    row = db.execute("SELECT seq, doubt FROM netbox_mirror WHERE id = 1").fetchone()
    return (0, None) if row is None else (int(row[0]), row[1])


def _save(db: Database, seq: int, doubt: int | None) -> None:
    db.execute(
        "INSERT INTO netbox_mirror (id, seq, doubt) VALUES (1, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, doubt = excluded.doubt",
        (seq, doubt),
    )


def _next(db: Database) -> tuple[int, int | None, list[JournalEntry]]:
    """How many entries are behind, the one in doubt, and the next batch."""
    seq, doubt = _state(db)
    behind = countAfter(db, seq)
    return behind, doubt, query(db, since_seq=seq, limit=BATCH)


class JournalMirror:
    """Copy journal entries to NetBox in order, retrying with backoff."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        runner: IRunner,
        client: NetBoxClient,
        poll: float = POLL,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self._clock = clock
        self._runner = runner
        self._client = client
        self._poll = poll
        self._delay = FIRST_DELAY
        self._ids: dict[str, int] = {}
        self._timer: IDelayedCall | None = None
        self._running: Deferred[None] | None = None
        self._stopped = True
        self.posted = 0
        self.behind = Gauge(
            "fleetd_netbox_mirror_behind",
            "Journal entries not yet mirrored to NetBox (or skipped).",
            registry=metrics,
        )

    def start(self) -> None:
        self._stopped = False
        self.kick()

    def kick(self) -> None:
        if self._stopped or self._running is not None:
            return
        if self._timer is not None and self._timer.active():
            if self._delay > FIRST_DELAY:  # backing off: let the timer decide
                return
            self._timer.cancel()
        self._timer = None
        d = Deferred.fromCoroutine(self._round())
        if not d.called:
            self._running = d
        d.addCallbacks(self._roundDone, self._roundFailed)

    async def _round(self) -> None:
        while not self._stopped:
            behind, doubt, entries = await self._runner.run(_next)
            self.behind.set(behind)
            if not entries:
                return
            for entry in entries:
                if self._stopped:
                    return
                await self._mirror(entry, doubt)
                doubt = None

    async def _mirror(self, entry: JournalEntry, doubt: int | None) -> None:
        deviceId = await self._deviceId(entry.device) if entry.device else None
        if deviceId is None:
            await self._runner.run(lambda db: _save(db, entry.seq, None))
            return
        line = marker(entry)
        if doubt == entry.seq and await self._found(deviceId, line):
            self.log.info("netbox.mirror.found {seq}", seq=entry.seq)
            await self._runner.run(lambda db: _save(db, entry.seq, None))
            return
        # From here until the answer, the POST's outcome is unknown.
        await self._runner.run(lambda db: _save(db, entry.seq - 1, entry.seq))
        body: dict[str, Any] = {
            "assigned_object_type": OBJECT_TYPE,
            "assigned_object_id": deviceId,
            "kind": kindOf(entry.event),
            "comments": comments(entry),
        }
        try:
            await self._client.post(JOURNAL, body)
        except NetBoxError as e:
            if e.kind != "invalid":
                raise
            # Retrying cannot help (the device went between lookup and post).
            self.log.error(
                "netbox.mirror.refused {seq}: {reason}", seq=entry.seq, reason=str(e)
            )
            self._ids.pop(entry.device or "", None)
        else:
            self.posted += 1
        await self._runner.run(lambda db: _save(db, entry.seq, None))

    async def _found(self, deviceId: int, line: str) -> bool:
        results = await self._client.listAll(
            JOURNAL,
            {
                "assigned_object_type": OBJECT_TYPE,
                "assigned_object_id": deviceId,
                "q": line,
            },
        )
        return any(
            r.get("assigned_object_id") == deviceId and carries(r.get("comments"), line)
            for r in results
        )

    async def _deviceId(self, name: str) -> int | None:
        if name in self._ids:
            return self._ids[name]
        try:
            data = await findByName(self._client, name)
        except InventoryError as e:  # several devices of that name
            self.log.error("netbox.mirror.skipped {device}: {e}", device=name, e=str(e))
            return None
        if data is None:
            return None
        ident = remote(data).id
        self._ids[name] = ident
        return ident

    def _roundDone(self, _: object) -> None:
        self._running = None
        self._delay = FIRST_DELAY
        self._arm(self._poll)

    def _roundFailed(self, failure: Any) -> None:
        self._running = None
        delay, self._delay = self._delay, min(self._delay * 2, MAX_DELAY)
        self.log.warn(
            "netbox.mirror.retry in {delay}s: {reason}",
            delay=delay,
            reason=failure.getErrorMessage(),
        )
        self._arm(delay)

    def _arm(self, delay: float) -> None:
        if self._stopped:
            return
        self._timer = self._clock.callLater(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.kick()

    def stop(self) -> Deferred[None]:
        self._stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        running, self._running = self._running, None
        if running is None:
            return Deferred.fromCoroutine(_nothing())
        running.cancel()
        return Deferred.fromCoroutine(_nothing())


async def _nothing() -> None:
    return None
