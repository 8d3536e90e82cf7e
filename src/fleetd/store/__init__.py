"""The persistent store: SQLite database, its thread, keys and the journal."""

from fleetd.store.db import Database, StoreError
from fleetd.store.entries import JournalEntry
from fleetd.store.fields import FieldValue
from fleetd.store.journal import AsyncJournal, Journal
from fleetd.store.keys import JOURNAL_PURPOSE, deriveKey, loadOrCreateKey
from fleetd.store.migrations import MIGRATIONS
from fleetd.store.runner import DatabaseRunner, InlineRunner, IRunner
from fleetd.store.verify import JournalVerification

__all__ = [
    "JOURNAL_PURPOSE",
    "MIGRATIONS",
    "AsyncJournal",
    "Database",
    "DatabaseRunner",
    "FieldValue",
    "IRunner",
    "InlineRunner",
    "Journal",
    "JournalEntry",
    "JournalVerification",
    "StoreError",
    "deriveKey",
    "loadOrCreateKey",
]
