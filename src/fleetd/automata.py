"""
Small helpers for fleetd's automat machines, so the six read alike.

Each machine module has a diagram in its docstring, an inputs C{Protocol},
a core (a dataclass or a C{Protocol} its owner implements) and a builder;
these helpers write its repeated parts:

  - L{answer}: each state answers an input with its own constant and stays
    (C{describe}'s state names for people, a per-state verdict);
  - L{ignore}: inputs that change nothing in some states (late answers);
  - L{indexed}: constant-time transition lookup for a built machine;
  - L{stateNames}: the states a built machine has (a test checks that the
    module's diagram names each of them).

On L{indexed}: automat's L{automat._core.Automaton.outputForInput} scans
every transition of the machine and compares (state, input) pairs with
dataclass equality: for the run machine (about forty transitions) that is
the largest part of an input's cost, and the boot path feeds two inputs per
delivery. L{indexed} gives a built machine a dict from (state, input) to
the same answer; anything not in the table falls back to automat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from automat import TypeMachine

_M = TypeVar("_M")


class State(Protocol):
    """A state of an automat C{TypeMachineBuilder} (what C{builder.state} gives)."""

    def upon(self, input: Callable[..., Any]) -> Any: ...


def answer(input: Callable[..., Any], answers: Iterable[tuple[State, object]]) -> None:
    """In each state of C{answers}, C{input} stays and returns that state's value."""
    for state, value in answers:
        state.upon(input).loop().returns(value)


def ignore(states: Iterable[State], *inputs: Callable[..., None]) -> None:
    """In each of C{states}, each of C{inputs} changes nothing."""
    for state in states:
        for input in inputs:
            state.upon(input).loop().returns(None)


def stateNames(machine: TypeMachine[Any, Any]) -> frozenset[str]:
    """The names of the states of a built C{machine}."""
    return frozenset(state.name for state in machine.__automat_automaton__.states())


def indexed(machine: _M) -> _M:
    """Return C{machine} (an automat C{TypeMachine}) with indexed transitions."""
    automaton: Any = getattr(machine, "__automat_automaton__")  # noqa: B009
    scan = automaton.outputForInput
    # Keyed by the state's identity: a state is one object for the machine's
    # life, and hashing it (a frozen dataclass) is a Python call per input.
    table: dict[tuple[int, str], tuple[Any, tuple[Any, ...]]] = {}
    for inState, inputSymbol, outState, outputs in automaton._transitions:
        table[(id(inState), inputSymbol)] = (outState, tuple(outputs))

    def outputForInput(inState: Any, inputSymbol: str) -> tuple[Any, Sequence[Any]]:
        found = table.get((id(inState), inputSymbol))
        if found is None:
            return scan(inState, inputSymbol)  # type: ignore[no-any-return]
        return found[0], list(found[1])

    automaton.outputForInput = outputForInput
    return machine
