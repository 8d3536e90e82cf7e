"""
The journal's chain in the owner API (issue 19 item 5).

  - C{GET /v1/admin/journal/verify}: walk the whole chain now; the answer
    is L{fleetd.store.verify.JournalVerification.toJSON}, and the chain
    gauge (C{fleetd_journal_chain_ok}) follows it at once.
  - C{POST /v1/admin/journal/reanchor} C{{"reason": "..."}}: acknowledge
    the first break (L{fleetd.store.anchor}); 201 with the entry appended
    and the verification that follows it, 409 when the chain is intact,
    400 without a reason. Only owners get here (the owner gate); the
    owner is the entry's actor.

What C{GET /v1/admin/journal} and the console's journal view share (the
device and run a query names must be ones fleetd knew, else a 404) is
L{fleetd.fleet.journal}.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.fleet.journal import UNREADABLE, Verify
from fleetd.store.anchor import Reanchored, ReanchorRefused, checkReason
from fleetd.store.journal import AsyncJournal
from fleetd.web.owner import ownerOf
from fleetd.web.refusals import storeRefusal
from fleetd.web.resources import Endpoint, renderAsync, textResponse


class JournalVerifyResource(Endpoint):
    """C{GET /v1/admin/journal/verify}: walk the whole chain."""

    isLeaf = True

    def __init__(self, verify: Verify) -> None:
        super().__init__()
        self._verify = verify

    def render_GET(self, request: IRequest) -> int:
        async def work() -> tuple[int, Any]:
            result = await self._verify()
            if result is None:
                return http.SERVICE_UNAVAILABLE, {"error": UNREADABLE}
            return http.OK, result.toJSON()

        return renderAsync(request, work)


class ReanchorResource(Endpoint):
    """C{POST /v1/admin/journal/reanchor}: acknowledge the chain's break."""

    isLeaf = True

    def __init__(self, journal: AsyncJournal, verify: Verify) -> None:
        super().__init__()
        self._journal = journal
        self._verify = verify

    def render_POST(self, request: IRequest) -> int | bytes:
        try:
            reason = _reason(request)
        except ReanchorRefused as e:
            return textResponse(request, http.BAD_REQUEST, f"invalid: {e}")
        actor = "owner:" + (ownerOf(request) or "unknown")

        async def work() -> tuple[int, Any]:
            done = await self._journal.reanchor(actor=actor, reason=reason)
            after = await self._verify()
            return http.CREATED, {
                **_described(done),
                "verification": None if after is None else after.toJSON(),
            }

        return renderAsync(request, work, _refusal)


def _reason(request: IRequest) -> str:
    raw = b"" if request.content is None else request.content.read()
    try:
        doc = json.loads(raw.decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError):
        raise ReanchorRefused("body: not JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"reason"}:
        raise ReanchorRefused('body: must be {"reason": "..."}')
    return checkReason(doc["reason"])


def _described(done: Reanchored) -> dict[str, Any]:
    return {
        "entry": done.entry.toJSON(),
        "seq": done.entry.seq,
        "break_seq": done.breakSeq,
        "problem": done.problem,
        "found": done.found,
        "expected": done.expected,
    }


def _refusal(error: Exception) -> tuple[int, str] | None:
    if isinstance(error, ReanchorRefused):
        return http.CONFLICT, f"{error}; nothing appended"
    return storeRefusal(error)
