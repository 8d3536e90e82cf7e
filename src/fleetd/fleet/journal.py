"""
The journal as the owner reads it, for the owner API's C{GET
/v1/admin/journal} and the console's journal view alike: the device and
run a query names must be ones fleetd knew (L{deviceKey}, L{checkRun}),
else a C{not-found} L{Refused}; a verification now (L{Verify}); the line
when the journal cannot be read (L{UNREADABLE}).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fleetd.inventory.model import IInventory
from fleetd.refused import NOT_FOUND, Refused
from fleetd.store.journal import AsyncJournal
from fleetd.store.verify import JournalVerification

Verify = Callable[[], Awaitable[JournalVerification | None]]
"""Verify the chain now and record the verdict (L{ChainMonitor.verify})."""

UNREADABLE = "the journal could not be read; see fleetd's log"


async def deviceKey(
    journal: AsyncJournal, inventory: IInventory | None, device: str
) -> str:
    """
    The name C{device}'s entries carry; L{Refused} (C{not-found}) when neither the
    journal nor C{inventory} knows it (a typo must not look like a quiet
    device; a retired device is known by its history).
    """
    key = device.lower()  # as the inventory keys names
    if await journal.query(device=key, limit=1):
        return key
    found = None if inventory is None else await inventory.get(device)
    if found is None:
        raise Refused(
            NOT_FOUND, f"no device named {device} in the inventory or the journal"
        )
    return found.name


async def checkRun(journal: AsyncJournal, run: str) -> None:
    """L{Refused} (C{not-found}) unless the journal names C{run}."""
    if not await journal.query(run=run, limit=1):
        raise Refused(NOT_FOUND, f"no run named {run} in the journal")
