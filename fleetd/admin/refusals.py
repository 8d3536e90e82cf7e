"""
One clear line for a change the store could not record [J1].

When the database or the journal refuses a change, nothing changed; the
owner is told so in one line instead of a bare 500.
"""

from __future__ import annotations

import sqlite3

from twisted.web import http

from fleetd.inventory.model import InventoryError
from fleetd.store.db import StoreError
from fleetd.store.journal import JournalRefused

NOTHING_CHANGED = "nothing changed"


def storeRefusal(error: Exception) -> tuple[int, str] | None:
    """The answer for a failed change, or L{None} when it is a bug."""
    if isinstance(error, JournalRefused):
        return (
            http.BAD_REQUEST,
            f"the journal refused this change ({str(error)[:200]}); {NOTHING_CHANGED}",
        )
    if isinstance(error, InventoryError) and error.kind == "unavailable":
        return http.SERVICE_UNAVAILABLE, f"inventory unavailable; {NOTHING_CHANGED}"
    if isinstance(error, StoreError | sqlite3.Error):
        reason = str(error).splitlines()[0][:200] if str(error) else "unavailable"
        return (
            http.SERVICE_UNAVAILABLE,
            f"cannot record the change ({reason}); {NOTHING_CHANGED}",
        )
    return None
