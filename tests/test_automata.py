"""
fleetd's automat machines: indexed ones answer as automat's own scan does,
and each module's diagram names every state its builder has.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from automat import NoTransition, TypeMachine
from automat._core import Automaton
from twisted.trial.unittest import SynchronousTestCase

from fleetd.attest import challenge
from fleetd.automata import stateNames
from fleetd.deviceflow import machine as deviceflow_machine
from fleetd.kube import machine as token
from fleetd.netbox import push
from fleetd.runs import machine as runs
from fleetd.runs.machine import RunMachine
from fleetd.tink import boot

# The six machines: each module and the machine its builder built.
MACHINES: tuple[tuple[ModuleType, TypeMachine[Any, Any]], ...] = (
    (runs, runs.RunMachine),
    (deviceflow_machine, deviceflow_machine.RequestMachine),
    (token, token.TokenMachine),
    (boot, boot.BootMachine),
    (push, push.PushMachine),
    (challenge, challenge.ChallengeMachine),
)


def diagram(doc: str) -> str:
    """The first block of indented lines in C{doc}: the module's diagram."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line)
    return "\n".join(block)


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


class DiagramTests(SynchronousTestCase):
    """Each machine module's docstring draws the machine its builder has."""

    def test_diagram_namesEveryState(self) -> None:
        """Every state the builder made is named in the module's diagram."""
        for module, machine in MACHINES:
            assert module.__doc__ is not None
            drawn = set(re.findall(r"\w+", diagram(module.__doc__)))
            self.assertEqual(
                stateNames(machine) - drawn, set(), f"{module.__name__}'s diagram"
            )
            self.assertGreater(len(stateNames(machine)), 2)


class EveryMachineIndexedTests(SynchronousTestCase):
    """All six machines are indexed, and answer as automat's scan does."""

    def test_everyMachine_sameAsScan(self) -> None:
        """Every (state, input) pair of each machine leads where the scan leads."""
        for module, machine in MACHINES:
            automaton: Any = machine.__automat_automaton__
            self.assertIn("outputForInput", vars(automaton), module.__name__)
            for inState, inputSymbol, _, _ in automaton._transitions:
                self.assertEqual(
                    automaton.outputForInput(inState, inputSymbol),
                    Automaton.outputForInput(automaton, inState, inputSymbol),
                )
