"""
Store trouble as inventory errors, one translation for both back ends: the
embedded SQLite inventory and the NetBox inventory's local store (its
outbox and cache commit with their journal entries [J1]).
"""

from __future__ import annotations

import sqlite3

from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.inventory.model import InventoryError
from fleetd.store.db import StoreError
from fleetd.store.entries import JournalRefused

__all__ = ["storeFailure"]

log = Logger()


def storeFailure(failure: Failure) -> Failure:
    """
    C{failure} as the inventory reports it: its own L{InventoryError}s pass
    on, the journal's refusal is C{"invalid"}, a constraint the back end's
    checks do not know C{"duplicate"} (logged as a bug), database trouble
    C{"unavailable"} (logged); anything else is left as it is.
    """
    if failure.check(InventoryError):
        return failure
    if failure.check(JournalRefused):
        reason = failure.getErrorMessage()
        return Failure(InventoryError(f"the journal refused it: {reason}", "invalid"))
    if failure.check(sqlite3.IntegrityError):
        # The back end's checks run in the same write transaction, so this
        # is a constraint they do not know about.
        log.failure("inventory.integrity", failure=failure)
        return Failure(InventoryError("the inventory refused the change", "duplicate"))
    if failure.check(StoreError, sqlite3.Error):
        log.error("inventory.unavailable {reason}", reason=failure.getErrorMessage())
        error = InventoryError(
            f"inventory database unavailable: {failure.getErrorMessage()}",
            "unavailable",
        )
        return Failure(error)
    return failure
