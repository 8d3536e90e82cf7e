"""
Which code digests fleetd ever issued: certainly not, or perhaps.

A request whose code matches no current run is either a code of a run
superseded since (410, from the database) or a code fleetd never issued
(404). Guesses and typos are the second kind, and a flood of them from
many sources would otherwise each cost a database read on the database
thread and a round trip on the reactor (measured: about 50 µs of CPU per
request in a boot storm with one unknown code in twelve). L{IssuedDigests}
answers the common case without the database: a digest it does not hold
was never issued, so the answer is 404 at once; one it holds is looked up
as before, so a 410 is still decided by the database.

It holds the first 8 bytes of every run's keyed digest: the runs in the
database at start in one sorted array (8 bytes each; a hundred thousand
runs is 800 KB), and the runs created since in a set. Two digests sharing
their first 8 bytes only send a request to the database that did not
need to go: "not held" is never wrong, because every run is created by a
provision that adds its digest once it commits, before anyone can hold
its code.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable

PREFIX_HEX = 16
"""How much of a (hex) digest is kept: 8 bytes."""


def _key(digest: str) -> int:
    """The digest's first 8 bytes, as an integer (or all of a prefix)."""
    return int(digest[:PREFIX_HEX], 16)


class IssuedDigests:
    """The keyed digests of every code fleetd issued, as 8-byte prefixes."""

    def __init__(self, digests: Iterable[str] = ()) -> None:
        self._loaded = array("Q", sorted({_key(d) for d in digests}))
        self._added: set[int] = set()

    def add(self, digest: str) -> None:
        """A run with C{digest} was created (its provision committed)."""
        self._added.add(_key(digest))

    def mayHold(self, digest: str) -> bool:
        """
        L{False}: no run ever had C{digest}. L{True}: one may have (ask
        the database).
        """
        key = _key(digest)
        if key in self._added:
            return True
        loaded = self._loaded
        i = bisect_left(loaded, key)
        return i < len(loaded) and loaded[i] == key
