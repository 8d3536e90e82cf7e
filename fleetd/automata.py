"""
automat machines with a constant-time transition lookup.

automat's L{automat._core.Automaton.outputForInput} scans every transition
of the machine and compares (state, input) pairs with dataclass equality:
for the run machine (about forty transitions) that is the largest part of
an input's cost, and the boot path feeds two inputs per delivery.
L{indexed} gives a built machine a dict from (state, input) to the same
answer; anything not in the table (none today) falls back to automat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

_M = TypeVar("_M")


def indexed(machine: _M) -> _M:
    """Return C{machine} (an automat C{TypeMachine}) with indexed transitions."""
    automaton: Any = getattr(machine, "__automat_automaton__")  # noqa: B009
    scan = automaton.outputForInput
    table: dict[tuple[Any, str], tuple[Any, tuple[Any, ...]]] = {}
    for inState, inputSymbol, outState, outputs in automaton._transitions:
        table[(inState, inputSymbol)] = (outState, tuple(outputs))

    def outputForInput(inState: Any, inputSymbol: str) -> tuple[Any, Sequence[Any]]:
        found = table.get((inState, inputSymbol))
        if found is None:
            return scan(inState, inputSymbol)  # type: ignore[no-any-return]
        return found[0], list(found[1])

    automaton.outputForInput = outputForInput
    return machine
