"""
"Did you mean": an unknown device name, answered with the inventory's
closest names.

fleetd refuses a device name it does not know with a 404 and one line
naming it (C{no device named w9}). fleetctl then lists the inventory's
names once (C{GET /v1/admin/devices}) and adds the closest ones to that
line: C{fleetd answered 404: no device named wrk1 (did you mean w1?)};
with C{--json}, they are the error's C{did_you_mean} member. The lookup
happens only on that error, and a lookup that fails adds nothing: the
refusal stands as fleetd said it.

A command says which of its arguments are device names with
C{set_defaults(deviceArgs=(...))} (L{DEVICE_ARGS}).
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Sequence

from fleetd.cli.client import AdminClient, AdminError
from fleetd.clitools import CLIError
from fleetd.config import Settings

DEVICE_ARGS = "deviceArgs"
"""The attribute naming the arguments that hold device names."""

SUGGESTED = 3
CUTOFF = 0.6  # difflib's default, as the class and cluster hints use


def namesGiven(args: argparse.Namespace) -> list[str]:
    """The device names the command line gave, in order."""
    found: list[str] = []
    for attribute in getattr(args, DEVICE_ARGS, ()):
        value = getattr(args, attribute, None)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, str))
    return found


def closeNames(name: str, names: Sequence[str]) -> list[str]:
    """The inventory's names closest to C{name} (case aside), best first."""
    return difflib.get_close_matches(name.lower(), names, n=SUGGESTED, cutoff=CUTOFF)


def hint(close: Sequence[str]) -> str:
    """C{ (did you mean a, b or c?)}, or nothing."""
    if not close:
        return ""
    if len(close) == 1:
        return f" (did you mean {close[0]}?)"
    return f" (did you mean {', '.join(close[:-1])} or {close[-1]}?)"


def suggest(
    error: AdminError, given: Sequence[str], listNames: Callable[[], list[str]]
) -> AdminError:
    """
    C{error} with the closest names to the first of C{given} that the
    inventory lacks, when C{error} is fleetd's 404 naming it; otherwise
    C{error} as it is. C{listNames} reads the inventory's names.
    """
    if error.httpStatus != 404 or not given:
        return error
    named = [n for n in given if _names(error.line, n)]
    if not named:
        return error
    try:
        names = listNames()
    except CLIError:
        return error
    known = set(names)
    unknown = [n for n in named if n.lower() not in known]
    if not unknown:
        return error
    close = closeNames(unknown[0], names)
    if not close:
        return error
    return AdminError(
        error.httpStatus,
        error.line,
        hint=hint(close),
        fields={"did_you_mean": close},
    )


def inventoryNames(settings: Settings) -> Callable[[], list[str]]:
    """A reader of the inventory's device names through the admin API."""

    def listNames() -> list[str]:
        devices = AdminClient(settings).request("GET", "/v1/admin/devices")
        return [str(d["name"]) for d in devices["devices"]]

    return listNames


def _names(line: str, name: str) -> bool:
    """Whether fleetd's C{line} names C{name} (a whole word, case aside)."""
    pattern = rf"(?<![\w.-]){re.escape(name)}(?![\w.-])"
    return re.search(pattern, line, re.IGNORECASE) is not None
