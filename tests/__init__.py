"""
fleetd's tests (trial).

Property tests (hypothesis) have no per-example deadline: the suite runs
two workers on a two-core machine beside real peers (swtpm, nginx, dig),
so one example can take longer than hypothesis's default 200 ms without
anything being wrong, and a deadline would make such a run fail at random.
"""

from hypothesis import settings

settings.register_profile("fleetd", deadline=None)
settings.load_profile("fleetd")
