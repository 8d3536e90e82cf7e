"""
[O4] A reader on the admin listener: the posts it may make, and the
refusal of every other change.

A reader's certificate (L{fleetd.pki.owners}) reads: C{GET} and C{HEAD}
of the owner API and of the console, the backup included. Any other
method is a change, refused with 403 and one line before any resource
sees it, on the API (L{fleetd.admin.resource.OwnerGate}) and in the
console (L{fleetd.admin.console.gate.ConsoleGate}), whatever the path: an
endpoint added later is refused to readers without being listed
anywhere. Only the posts that change nothing of the fleet's are listed
here: L{READER_API_POSTS} and L{READER_CONSOLE_POSTS}.

Each refusal is journaled as C{admin.reader-refused} (the reader as
actor, C{reader:NAME}; the method and path as C{action}, never the query
or the body; C{via} C{api} or C{console}), at most once per reader every
L{fleetd.attest.throttle.NAMED_EVERY} seconds on each of the two doors;
the next entry counts the refusals that were not journaled
(C{not_journaled}), so a reader's script in a loop cannot flood the
journal or its NetBox mirror. Every refusal is logged (throttled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web import http, resource
from twisted.web.iweb import IRequest

from fleetd.attest.throttle import JournalThrottle
from fleetd.logs import ThrottledLog
from fleetd.store.journal import AsyncJournal
from fleetd.web.resources import answerAsync, textResponse

# Posts below /v1/admin/ a reader may make: a login link opens a session
# with the reader's own role, so it grants nothing the certificate does not.
READER_API_POSTS = frozenset({b"console/login-link"})
# Console posts a reader may make: ending its own session, and walking the
# journal's chain (what GET /v1/admin/journal/verify does for fleetctl).
READER_CONSOLE_POSTS = frozenset({b"/logout", b"/journal/verify"})

EVENT = "admin.reader-refused"
MAX_ACTION = 200  # characters of the method and path journaled
_THROTTLE_REASON = "change"

log = Logger()


def attempted(request: IRequest) -> str:
    """
    What C{request} tried, as the journal and the line name it: its
    method and path, printable, without the query (a query may carry a
    code or a token), cut to L{MAX_ACTION} characters.
    """
    method = bytes(request.method).decode("ascii", "replace")
    path = bytes(request.path or b"/").decode("latin-1")
    text = "".join(c if c.isprintable() else "?" for c in f"{method} {path}")
    return text[:MAX_ACTION]


def refusalLine(reader: str, action: str) -> str:
    """The one line a reader's change gets (403) [O4]."""
    return (
        f"refused: {reader} holds a reader certificate, which reads and changes"
        f" nothing: {action} needs an owner"
    )


def readerPage(reader: str) -> str:
    """A console page that would make a change, as a reader sees it (403)."""
    return (
        f"{reader} holds a reader certificate, which reads and changes nothing:"
        " this page makes a change, which needs an owner"
    )


def readerLookup(reader: str) -> str:
    """A reader's lookup of a device-flow user code (403)."""
    return (
        f"{reader} holds a reader certificate: looking up a user code is an"
        " owner's step (each lookup spends from the owners' attempt budget)"
    )


class ReaderRefusals:
    """Journal and log a door's refusals of readers' changes, throttled."""

    def __init__(self, journal: AsyncJournal, clock: IReactorTime, via: str) -> None:
        """
        @param via: the door, as journaled: C{api} or C{console}.
        """
        self._journal = journal
        self._via = via
        self._throttle = JournalThrottle(clock)
        self._log = ThrottledLog(clock)

    async def record(self, reader: str, action: str) -> None:
        """
        Journal that C{reader} attempted C{action}, unless its throttle says
        only to count it; a journal that refuses the entry is logged, and
        the refusal stands.
        """
        actor = f"reader:{reader}"
        self._log.warn(
            "admin.reader-refused {actor} {action}", actor=actor, action=action
        )
        skipped = self._throttle.admit(actor, _THROTTLE_REASON)
        if skipped is None:
            return
        try:
            await self._journal.append(
                EVENT,
                actor=actor,
                fields={"action": action, "via": self._via, "not_journaled": skipped},
            )
        except Exception as e:
            log.warn("admin.reader-refused.unjournaled {reason}", reason=str(e)[:200])

    def refusal(
        self,
        reader: str,
        setHeaders: Callable[[IRequest], None] = lambda request: None,
    ) -> resource.Resource:
        """The resource that refuses C{reader}'s change, once recorded."""
        return _Refused(self, reader, setHeaders)


class _Refused(resource.Resource):
    """403 and L{refusalLine}, answered once the refusal is recorded."""

    isLeaf = True

    def __init__(
        self,
        refusals: ReaderRefusals,
        reader: str,
        setHeaders: Callable[[IRequest], None],
    ) -> None:
        super().__init__()
        self._refusals = refusals
        self._reader = reader
        self._setHeaders = setHeaders

    def render(self, request: IRequest) -> Any:
        action = attempted(request)

        async def work() -> tuple[int, str]:
            await self._refusals.record(self._reader, action)
            return http.FORBIDDEN, refusalLine(self._reader, action)

        def answer(code: int, line: str) -> bytes:
            self._setHeaders(request)
            return textResponse(request, code, line)

        return answerAsync(request, work, answer, answer)
