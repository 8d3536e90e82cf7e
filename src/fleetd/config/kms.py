"""
C{[kms]}: fleetd as the site's Talos KMS (issue 30; design.md, "Disk keys").
The C{kms} listener (C{listen.kms}, C{tcp:4050} by default) is served only
when this table is present.

    [kms]
    master_key = "/var/lib/fleetd/kms-master.key"   # default: beside the database
    destroyed_keys = "/var/lib/fleetd/kms-destroyed-keys"   # the default

The master key wraps every node's key-encryption key in the state
database: 32 random bytes, mode 0600, created on the first start when the
file is missing (docs/decisions.md, "Disk keys"). The HTTP/2 abuse limits
are the tink listener's (C{[tink]}); the message limit is the KMS's own,
since a Talos request is a uuid and a 32-byte passphrase or its sealed
blob.

The destruction record (C{destroyed_keys}) is an append-only file of the
ids of every disk key fleetd destroyed, kept outside the database so that
a restored older database cannot bring a destroyed key back
(L{fleetd.kms.record}). It is in C{paths.state} by default, not beside a
master key that may live on a read-only credential directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleetd.config.reader import readSection, setting
from fleetd.config.table import Table

# The kms listener's endpoint when [listen] does not name one.
DEFAULT_LISTEN = "tcp:4050"
# Under paths.state when kms.master_key is not set.
MASTER_KEY_FILE = "kms-master.key"
# Under paths.state when kms.destroyed_keys is not set.
DESTROYED_KEYS_FILE = "kms-destroyed-keys"


@dataclass(frozen=True)
class KMSSettings:
    """C{[kms]}: the master key's file and the listener's own bounds."""

    master_key: Path | None = None  # None: paths.state / MASTER_KEY_FILE
    # The destruction record; None: paths.state / DESTROYED_KEYS_FILE.
    destroyed_keys: Path | None = None
    # The largest gRPC message a node may send (a Request is ~100 bytes).
    max_message_bytes: int = setting(4096, 256, 1 << 20)
    # A call not answered within this many seconds is answered UNAVAILABLE
    # (Talos gives each call 10 s: docs/decisions.md, issue 30).
    call_timeout: float = setting(5.0, 0.1, 600.0)

    def masterKeyPath(self, state: Path) -> Path:
        return state / MASTER_KEY_FILE if self.master_key is None else self.master_key

    def destroyedKeysPath(self, state: Path) -> Path:
        if self.destroyed_keys is None:
            return state / DESTROYED_KEYS_FILE
        return self.destroyed_keys


def readKMS(parent: Table, name: str) -> KMSSettings | None:
    """C{[kms]}, or L{None} when the table is absent."""
    table = parent.table(name, required=False)
    if table is None:
        return None
    return readSection(KMSSettings, table)


def readKMSListen(table: Table, name: str) -> str:
    """C{listen.kms}: an endpoint as the other listeners', or the default."""
    if not table.has(name):
        return DEFAULT_LISTEN
    return table.endpoint(name)
