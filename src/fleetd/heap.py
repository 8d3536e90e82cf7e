"""
The garbage collector's settings for a long-running daemon.

CPython's cyclic collector runs its youngest generation every 700
allocations of container objects. A boot storm allocates a few hundred per
request (requests, headers, Deferreds, journal entries), so it collected
every other request, and now and then scanned every object the process
holds: modules, configuration and every run loaded at start. Measured with
C{bench/delivery_cost.py} (C{DELIVERY_GC=1}): about 115 ms of CPU per
2,000-delivery round, 25 ms with these settings.

L{tune} collects the youngest generation ten times less often (memory
held by young cyclic garbage stays small: a few thousand objects);
L{pauseForStartup} turns the collector off while start-up loads the runs:
that load only adds objects that live as long as the process, and at
50,000 runs the full collections it set off scanned them again and again
(about 0.6 s of a 2 s start). L{freezeStartup}, called once start-up has
loaded everything, collects once, moves what exists then into the
permanent generation, which later collections skip, and turns the
collector back on.
Objects frozen are still freed by reference counting; only cycles among
them would outlive their use, and what start-up builds lives as long as
the process.
"""

from __future__ import annotations

from typing import Protocol

YOUNG_THRESHOLD = 7000


class ICollector(Protocol):
    """The part of the C{gc} module used here (a fake in tests)."""

    def get_threshold(self) -> tuple[int, int, int]: ...

    def set_threshold(
        self, threshold0: int, threshold1: int, threshold2: int, /
    ) -> None: ...

    def collect(self, generation: int = 2) -> int: ...

    def freeze(self) -> None: ...

    def disable(self) -> None: ...

    def enable(self) -> None: ...


def tune(collector: ICollector) -> None:
    """Collect the youngest generation every L{YOUNG_THRESHOLD} allocations."""
    _, older, oldest = collector.get_threshold()
    collector.set_threshold(YOUNG_THRESHOLD, older, oldest)


def pauseForStartup(collector: ICollector) -> None:
    """No cyclic collection until L{freezeStartup} (or L{resume})."""
    collector.disable()


def resume(collector: ICollector) -> None:
    """Collect cycles again (start-up failed: nothing to freeze)."""
    collector.enable()


def freezeStartup(collector: ICollector) -> None:
    """
    Collect once, keep everything alive now out of later collections, and
    collect again from now on.
    """
    collector.collect()
    collector.freeze()
    collector.enable()
