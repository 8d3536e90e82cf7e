"""L{fleetd.reactors.fleetdReactor}: the daemon's reactor, checked."""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.reactors import fleetdReactor


class FleetdReactorTests(SynchronousTestCase):
    def test_realReactor_accepted(self) -> None:
        """The running reactor provides every interface the daemon needs."""
        self.assertIs(fleetdReactor(reactor), reactor)

    def test_clock_refusedNamingWhatItLacks(self) -> None:
        """A bare clock is refused, naming the first interface it lacks."""
        e = self.assertRaises(TypeError, fleetdReactor, Clock())
        self.assertIn("IReactorCore", str(e))
