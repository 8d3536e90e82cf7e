"""
The one refusal mapping every listener uses: one clear line for a change
the store could not record [J1], and for an inventory error wherever an
HTTP resource meets one.

When the database or the journal refuses a change, nothing changed; the
owner is told so in one line instead of a bare 500. An L{InventoryError}
is answered by its kind (L{inventoryRefusal}): 400 invalid, 404
not-found, 409 duplicate, 503 unavailable; never a 500. A busy answer
carries C{Retry-After} (L{withRetryAfter}), on every listener alike.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.inventory.model import ErrorKind, InventoryError
from fleetd.refused import Refused
from fleetd.store.db import StoreError
from fleetd.store.entries import JournalRefused

NOTHING_CHANGED = "nothing changed"

# Seconds a client is told to wait (Retry-After) when fleetd answers busy.
RETRY_AFTER = 30

Answer = Callable[[Exception], tuple[int, str] | None]

STATUS_OF_INVENTORY_KIND: dict[ErrorKind, int] = {
    "invalid": http.BAD_REQUEST,
    "not-found": http.NOT_FOUND,
    "duplicate": http.CONFLICT,
    "unavailable": http.SERVICE_UNAVAILABLE,
}


def _line(error: Exception) -> str:
    text = str(error).splitlines()
    return text[0][:300] if text else type(error).__name__


def inventoryRefusal(error: InventoryError) -> tuple[int, str]:
    """The status for C{error}'s kind and its one line."""
    return STATUS_OF_INVENTORY_KIND[error.kind], _line(error)


def readRefusal(error: Exception) -> tuple[int, str] | None:
    """
    The answer for a read the inventory or the database could not serve
    (503 while either is down), or L{None} when it is a bug.
    """
    if isinstance(error, InventoryError):
        return inventoryRefusal(error)
    if isinstance(error, StoreError | sqlite3.Error):
        return (
            http.SERVICE_UNAVAILABLE,
            f"the database cannot be read ({_line(error)[:200]}); try again",
        )
    return None


def storeRefusal(error: Exception) -> tuple[int, str] | None:
    """The answer for a failed change, or L{None} when it is a bug."""
    if isinstance(error, JournalRefused):
        return (
            http.BAD_REQUEST,
            f"the journal refused this change ({str(error)[:200]}); {NOTHING_CHANGED}",
        )
    if isinstance(error, InventoryError):
        if error.kind == "unavailable":
            return http.SERVICE_UNAVAILABLE, f"inventory unavailable; {NOTHING_CHANGED}"
        return inventoryRefusal(error)
    if isinstance(error, StoreError | sqlite3.Error):
        reason = str(error).splitlines()[0][:200] if str(error) else "unavailable"
        return (
            http.SERVICE_UNAVAILABLE,
            f"cannot record the change ({reason}); {NOTHING_CHANGED}",
        )
    return None


def withRetryAfter(request: IRequest, answer: Answer) -> Answer:
    """
    C{answer}, with C{Retry-After} on C{request}: a L{Refused}'s own
    (C{challenges-pending}, 429), or L{RETRY_AFTER} on a 503 (busy: retry
    later).
    """

    def refusal(error: Exception) -> tuple[int, str] | None:
        answered = answer(error)
        wait = error.retryAfter if isinstance(error, Refused) else None
        if wait is None and answered is not None:
            wait = RETRY_AFTER if answered[0] == http.SERVICE_UNAVAILABLE else None
        if wait is not None:
            request.setHeader(b"retry-after", b"%d" % (wait,))
        return answered

    return refusal
