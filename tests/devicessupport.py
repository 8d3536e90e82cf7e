"""
The devices resource in memory (StubTreq, inline database): the set-up the
resource tests share.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.admin.devices import devicesResource
from fleetd.inventory import SQLiteInventory
from fleetd.store import AsyncJournal, Database, InlineRunner, Journal
from fleetd.web.resources import Router
from tests.inventorysupport import SITE
from tests.ownersupport import inline


@dataclass
class DevicesTree:
    stub: Any  # a StubTreq: its request methods are made at run time
    inventory: SQLiteInventory
    journal: AsyncJournal


def devicesTree(test: SynchronousTestCase) -> DevicesTree:
    """C{/devices} over a new embedded inventory, the site's names defined."""
    db = Database.open(Path(test.mktemp()) / "fleetd.sqlite3")
    test.addCleanup(db.close)
    runner = InlineRunner(db)
    journal = AsyncJournal(runner, Journal(b"k" * 32), Clock())
    inventory = SQLiteInventory(runner, journal)
    root = Router()
    root.putChild(
        b"devices", devicesResource(inventory, journal, offload=inline, defined=SITE)
    )
    return DevicesTree(StubTreq(root), inventory, journal)
