"""
The console's journal view, C{/journal} (issue 20 item 4; docs/operations.md,
"Console").

It lists the journal newest first, a fixed page of L{PAGE} entries at a
time, filtered by device and run through the same lookups as
C{GET /v1/admin/journal} (a device or run fleetd never knew is a 404, not
an empty page), and pages by seq (C{before}: older, C{since}: newer).

Above the entries it shows the chain's verification state [J2]: the last
verdict of the chain monitor, which verifies at start and periodically,
and when that was. A page load does not walk the chain: a walk reads the
whole journal on the database thread (seconds for a few hundred thousand
entries) and would hold up everything else fleetd stores. C{POST
/journal/verify} ("verify now") walks it once, shared by the owners who
ask while a walk runs, and sends the browser back to the view.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd.admin.console.page import Page, formValue, query, renderPageAsync
from fleetd.admin.refusals import journalRefusal
from fleetd.fleet.journal import UNREADABLE, checkRun, deviceKey
from fleetd.inventory.model import IInventory
from fleetd.refused import MALFORMED, UNAVAILABLE, Refused
from fleetd.store.chain import ChainMonitor
from fleetd.store.entries import JournalEntry
from fleetd.store.journal import AsyncJournal
from fleetd.store.verify import JournalVerification
from fleetd.web.resources import Endpoint, notFound

PAGE = 200
"""Entries on one page of the view."""

Walk = Callable[[], Deferred[JournalVerification | None]]
"""A walk of the whole chain (L{ChainMonitor.verify})."""


@dataclass(frozen=True)
class Shown:
    """One entry as the view shows it: its fields as C{(name, text)}."""

    entry: JournalEntry
    fields: list[tuple[str, str]]


def shown(entry: JournalEntry) -> Shown:
    """C{entry} with each field as text (a string as is, others as JSON)."""
    fields = [
        (name, value if isinstance(value, str) else json.dumps(value))
        for name, value in sorted(entry.fields.items())
    ]
    return Shown(entry, fields)


def _seq(request: IRequest, name: str) -> int | None:
    """Query field C{name} as a seq, or L{None}; L{Refused} (400) if not one."""
    raw = formValue(request, name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise Refused(MALFORMED, f"{name} must be a journal seq (0 or more)")
    return int(raw)


def _name(request: IRequest, name: str) -> str | None:
    value = (formValue(request, name) or "").strip()
    return value or None


class Chained:
    """
    One walk of the chain at a time: who asks while a walk runs gets the
    next one, which begins when it ends and is shared by all who asked
    meanwhile (so each answer checked the chain as it was after they
    asked, and a row of clicks costs at most two walks).
    """

    def __init__(self, verify: Walk) -> None:
        self._verify = verify
        self._running = False
        self._waiting: list[Deferred[JournalVerification | None]] = []

    def __call__(self) -> Deferred[JournalVerification | None]:
        d: Deferred[JournalVerification | None] = Deferred()
        self._waiting.append(d)
        if not self._running:
            self._start()
        return d

    def _start(self) -> None:
        waiting, self._waiting = self._waiting, []
        self._running = True

        def done(result: Any) -> None:
            self._running = False
            for d in waiting:
                if isinstance(result, Exception):
                    d.errback(result)
                else:
                    d.callback(result)
            if self._waiting:
                self._start()

        def failed(failure: Any) -> None:
            done(failure.value)

        maybeDeferred(self._verify).addCallbacks(done, failed)


class JournalView(Endpoint):
    """C{GET /journal[?device=&run=&since=&before=]}; C{/journal/verify}."""

    def __init__(
        self, journal: AsyncJournal, inventory: IInventory, chain: ChainMonitor
    ) -> None:
        super().__init__()
        self._journal = journal
        self._inventory = inventory
        self._chain = chain
        self._verifyNow = VerifyNow(Chained(chain.verify))

    def getChild(self, path: bytes, request: IRequest) -> resource.Resource:
        if path == b"" and not request.postpath:
            return self
        if path == b"verify" and not request.postpath:
            return self._verifyNow
        return notFound()

    def render_GET(self, request: IRequest) -> int:
        async def work() -> Page:
            device, run = _name(request, "device"), _name(request, "run")
            since, before = _seq(request, "since"), _seq(request, "before")
            key = None
            if device is not None:
                key = await deviceKey(self._journal, self._inventory, device)
            if run is not None:
                await checkRun(self._journal, run)
            entries = await self._page(key, run, since, before)
            return Page("journal.html", self._context(key, run, since, before, entries))

        return renderPageAsync(request, work, journalRefusal)

    async def _page(
        self, device: str | None, run: str | None, since: int | None, before: int | None
    ) -> tuple[list[JournalEntry], bool]:
        """
        The page's entries, newest first, and whether more lie beyond it
        in the direction it was read (newer for C{since}, else older).
        """
        found = await self._journal.query(
            device=device,
            run=run,
            since_seq=since or 0,
            before_seq=before,
            newest_first=since is None,
            limit=PAGE + 1,
        )
        more = len(found) > PAGE
        found = found[:PAGE]
        if since is not None:
            found.reverse()
        return found, more

    def _context(
        self,
        device: str | None,
        run: str | None,
        since: int | None,
        before: int | None,
        page: tuple[list[JournalEntry], bool],
    ) -> dict[str, Any]:
        entries, more = page
        newer = older = None
        if since is not None:  # read upwards from since
            if more:
                newer = entries[0].seq
            older = entries[-1].seq if entries else since + 1
        else:  # read downwards from before (or the newest)
            if more:
                older = entries[-1].seq
            if before is not None:
                newer = entries[0].seq if entries else before - 1
        return {
            "device": device,
            "run": run,
            "entries": [shown(e) for e in entries],
            "newer": None
            if newer is None
            else query(device=device, run=run, since=newer),
            "older": None
            if older is None
            else query(device=device, run=run, before=older),
            "first": since is None and before is None,
            "verdict": self._chain.verdict,
            "checkedAt": self._chain.checkedAt,
            "interval": int(self._chain.interval),
            "pageSize": PAGE,
        }


class VerifyNow(Endpoint):
    """
    C{POST /journal/verify} (the gate checked the form's CSRF token): walk
    the chain now, then 303 back to the journal view, filters kept.
    """

    isLeaf = True

    def __init__(self, verify: Walk) -> None:
        super().__init__()
        self._verify = verify

    def render_POST(self, request: IRequest) -> int:
        async def work() -> Page:
            back = "/journal" + query(
                device=_name(request, "device"), run=_name(request, "run")
            )
            result = await self._verify()
            if result is None:
                raise Refused(UNAVAILABLE, UNREADABLE)
            request.setHeader(b"location", back.encode("utf-8"))
            return Page(
                "verified.html", {"verdict": result, "back": back}, http.SEE_OTHER
            )

        return renderPageAsync(request, work)
