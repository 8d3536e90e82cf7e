"""
What attestation asks of the EK bindings (L{fleetd.trust}): the approved
serial for an EK, the reason there is none, and the refusal made from it.
"""

from __future__ import annotations

import sqlite3
from typing import Protocol

from fleetd import nodes as E
from fleetd.nodes import Refused


class ApprovedSerialFor(Protocol):
    """The approved, non-conflicting binding's chassis serial for an EK digest."""

    def __call__(self, db: sqlite3.Connection, ekSha256: str) -> str | None: ...


class BindingRefusal(Protocol):
    """Why an EK digest has no usable binding: C{"<code>: <sentence>"} [T1]."""

    def __call__(self, db: sqlite3.Connection, ekSha256: str) -> str: ...


def noBindingReason(db: sqlite3.Connection, ekSha256: str) -> str:
    """The reason when no binding store says otherwise."""
    return f"{E.NOT_APPROVED}: no approved binding for this EK"


def lineRefusal(line: str) -> Refused:
    """A refusal from a C{"<code>: <sentence>"} line (bindingRefusal's form)."""
    code, sep, detail = line.partition(": ")
    if not sep or not code:
        return Refused(E.NOT_APPROVED, line[:200] or "no approved binding for this EK")
    return Refused(code, detail)
