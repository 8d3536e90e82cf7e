"""
The inventory's error and the small helpers its validators share
(L{fleetd.inventory.model}, L{fleetd.inventory.netaddr}).
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal["invalid", "duplicate", "not-found", "unavailable"]


class InventoryError(Exception):
    """
    The inventory refused or could not do what was asked.

    @ivar kind: C{"invalid"} (bad input), C{"duplicate"} (a name, serial,
        UUID, MAC or address already taken), C{"not-found"} or
        C{"unavailable"} (the backend cannot be reached; worth retrying).
    """

    def __init__(self, message: str, kind: ErrorKind = "invalid") -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message

    def __str__(self) -> str:
        return self.message


def shown(value: object) -> str:
    """A short, printable rendering of a rejected value for a message."""
    text = repr(value)
    return text if len(text) <= 70 else text[:67] + "..."


def nonEmptyString(field: str, value: object) -> str:
    """C{value}, which must be a non-empty string, or an error naming C{field}."""
    if not isinstance(value, str):
        raise InventoryError(f"{field}: must be a string, not {shown(value)}")
    if not value:
        raise InventoryError(f"{field}: must not be empty")
    return value
