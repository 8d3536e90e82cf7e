"""
Values of the device flow (RFC 8628): user codes, grants, requests as the
owner sees them, and the errors of deciding them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from fleetd.refused import Refused

ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LENGTH = 8
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"
REPORTED = ("uuid", "serial", "mac", "hostname", "code")
COMPARED = ("uuid", "serial")
MAX_VALUE = 256

Answer = tuple[int, dict[str, object]]


class IRunLookup(Protocol):
    def readyRun(self, device: str) -> str | None:
        """The id of C{device}'s run that can be delivered now, else L{None}."""

    def identity(self, device: str) -> tuple[str, str] | None:
        """The (uuid, serial) the inventory holds for C{device}, if known."""

    def deviceByIdentity(self, uuid: str, serial: str) -> str | None:
        """The device whose inventory uuid and serial these are, if any."""


def sameIdentity(reported: str, known: str, name: str) -> bool:
    """
    Whether a reported C{uuid} or C{serial} is the inventory's C{known}
    one: uuids compare in lower case, serials case-insensitively (as the
    inventory keeps them unique), both without surrounding space.
    """
    if name == "uuid":
        return reported.strip().lower() == known.strip().lower()
    return reported.strip().casefold() == known.strip().casefold()


def differences(reported: Mapping[str, str], known: tuple[str, str]) -> tuple[str, ...]:
    """The compared names (C{uuid}, C{serial}) not reported as C{known}."""
    return tuple(
        name
        for name, value in zip(COMPARED, known, strict=True)
        if name not in reported or not sameIdentity(reported[name], value, name)
    )


@dataclass(frozen=True)
class Grant:
    """
    What an access token authorizes [F2]: one delivery of C{device}'s
    current ready run, to the machine that reported C{uuid} and C{serial},
    while the inventory still holds C{inventory} for that device.

    @ivar delivered: the run this token already delivered, if any; then it
        authorizes nothing more (a request with it is answered as that
        run's refetch).
    """

    device: str
    uuid: str | None
    serial: str | None
    inventory: tuple[str, str]
    delivered: str | None = None
    key: bytes = field(default=b"", repr=False, compare=False)


@dataclass(frozen=True)
class RequestView:
    """
    One device authorization request, as the owner sees it.

    @ivar id: a public reference for the journal and the logs (the user
        code is a secret: it is neither journaled nor logged).
    @ivar reported: what the node sent (C{uuid}, C{serial}, C{mac},
        C{hostname}, C{code}); C{code} is a bearer secret, left out of
        C{repr} and of the admin API's JSON, which say only whether it was
        sent (L{code_sent}).
    @ivar known: the inventory device whose uuid and serial the node
        reported, if any.
    """

    id: str
    user_code: str = field(repr=False)
    reported: Mapping[str, str] = field(repr=False)
    peer: str
    client_id: str
    created_at: float
    expires_at: float
    known: str | None
    state: str
    device: str | None = None
    decided_by: str | None = None

    @property
    def code_sent(self) -> bool:
        return "code" in self.reported


class DeviceFlowError(Refused):
    """
    An owner's approval or denial was refused: a L{Refused} whose reason
    is its C{kind}, and whose line (C{str}) is its detail.

    @ivar kind: C{"invalid"}, C{"unknown-user-code"}, C{"expired"},
        C{"already-decided"}, C{"being-decided"}, C{"no-ready-run"},
        C{"unknown-device"}, C{"mismatch"}, C{"too-many-attempts"} or
        C{"not-recorded"} (the journal refused the decision).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.kind = kind

    def __str__(self) -> str:
        return self.detail


def normaliseUserCode(text: str) -> str | None:
    """
    C{text} as 8 upper-case letters of L{ALPHABET}, ignoring case, dashes
    and whitespace (RFC 8628 section 6.1); L{None} if it cannot be one.
    """
    if len(text) > 64:
        return None
    letters = "".join(c for c in text if c != "-" and not c.isspace()).upper()
    if len(letters) != USER_CODE_LENGTH or not all(c in ALPHABET for c in letters):
        return None
    return letters


def displayUserCode(letters: str) -> str:
    """C{BCDFGHJK} as the console shows it: C{BCDF-GHJK}."""
    return f"{letters[:4]}-{letters[4:]}"
