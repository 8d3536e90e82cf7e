"""
The embedded inventory keeps its last full listing while the database is
unchanged (the fleet view lists 10,000 devices per page it shows): every
change, by fleetd or by another connection, is seen by the next listing,
and a listing read inside a group commit that is rolled back is not kept.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TypeVar

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory import DeviceStatus, ServedRecord
from fleetd.inventory.model import IInventory
from fleetd.store import Database, InlineRunner
from tests.inventorysupport import W1, W2, W3
from tests.support import inventoryOver

_T = TypeVar("_T")


class SQLiteListingTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "fleetd.sqlite3"
        self.db = Database.open(self.path)
        self.addCleanup(self.db.close)
        self.inventory: IInventory = inventoryOver(InlineRunner(self.db))
        self.ok(self.inventory.importDevices([W1, W2], journal=()))

    def ok(self, d: Deferred[_T]) -> _T:
        return self.successResultOf(d)

    def statuses(self) -> dict[str, str]:
        return {d.name: d.status.value for d in self.ok(self.inventory.list())}

    def test_unchanged_sameDevicesNewList(self) -> None:
        """Unchanged: the same (frozen) devices again, in a list of its own."""
        first = self.ok(self.inventory.list())
        first.clear()
        second = self.ok(self.inventory.list())
        third = self.ok(self.inventory.list())
        self.assertEqual(second, [W1, W2])
        self.assertIsNot(second, third)
        for a, b in zip(second, third, strict=True):
            self.assertIs(a, b)

    def test_changes_seen(self) -> None:
        self.statuses()
        self.ok(self.inventory.add(W3, journal=()))
        self.assertEqual(list(self.statuses()), ["w1", "w2", "w3"])
        self.ok(self.inventory.setStatus("w1", DeviceStatus.PLANNED, journal=()))
        self.assertEqual(self.statuses()["w1"], "planned")
        record = ServedRecord("run-1", "w1", 1.0, "10.0.0.1")
        self.ok(self.inventory.release(record, journal=()))
        self.assertEqual(self.statuses()["w1"], "staged")
        with self.db.transaction() as _:
            self.inventory.transitionIn(
                self.db, "w2", (DeviceStatus.INVENTORY,), DeviceStatus.FAILED
            )
        self.assertEqual(self.statuses()["w2"], "failed")

    def test_otherConnection_seen(self) -> None:
        """A change another connection commits (fleetctl, a restore...)."""
        self.statuses()
        other = sqlite3.connect(self.path)
        with other:
            other.execute("UPDATE devices SET status = 'active' WHERE name = 'w2'")
        other.close()
        self.assertEqual(self.statuses()["w2"], "active")

    def test_rolledBackGroupCommit_notKept(self) -> None:
        """
        A listing read inside a group commit sees its uncommitted writes;
        once the commit is rolled back, the next listing must not show them.
        """
        self.statuses()
        try:
            with self.db.groupCommit():
                self.db.execute(
                    "UPDATE devices SET status = 'failed' WHERE name = ?", ("w1",)
                )
                self.assertEqual(self.statuses()["w1"], "failed")
                raise ZeroDivisionError("the commit fails")
        except ZeroDivisionError:
            pass
        self.assertEqual(self.statuses()["w1"], "inventory")
        self.assertEqual(self.statuses()["w1"], "inventory")
