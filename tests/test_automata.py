"""Indexed automat machines answer as automat's own scan does."""

from __future__ import annotations

from typing import Any

from automat import NoTransition
from automat._core import Automaton
from twisted.trial.unittest import SynchronousTestCase

from fleetd.runs.machine import RunMachine


class IndexedTests(SynchronousTestCase):
    """L{fleetd.automata.indexed} on the run machine [C1]."""

    def setUp(self) -> None:
        self.automaton: Any = getattr(RunMachine, "__automat_automaton__")  # noqa: B009

    def test_everyTransition_sameAsScan(self) -> None:
        """[C1] Every (state, input) pair leads where automat's scan leads."""
        transitions = list(self.automaton._transitions)
        self.assertGreater(len(transitions), 30)
        for inState, inputSymbol, _, _ in transitions:
            self.assertEqual(
                self.automaton.outputForInput(inState, inputSymbol),
                Automaton.outputForInput(self.automaton, inState, inputSymbol),
            )

    def test_unknownPair_noTransition(self) -> None:
        """[C1] An input a state does not take still raises NoTransition."""
        states = {t[0] for t in self.automaton._transitions}
        for state in states:
            self.assertRaises(
                NoTransition, self.automaton.outputForInput, state, "nonsense"
            )

    def test_outputs_freshListEachTime(self) -> None:
        """A caller changing the outputs it got cannot change the machine."""
        inState, inputSymbol, _, _ = next(iter(self.automaton._transitions))
        first = self.automaton.outputForInput(inState, inputSymbol)[1]
        first.append("junk")
        self.assertNotIn("junk", self.automaton.outputForInput(inState, inputSymbol)[1])
