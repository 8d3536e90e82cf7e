"""
Values of the device flow (RFC 8628): user codes, grants, pending requests
as the owner sees them, and the errors of approving them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LENGTH = 8
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"
REPORTED = ("uuid", "serial", "mac", "hostname", "code")
MAX_VALUE = 256

Answer = tuple[int, dict[str, object]]
State = Literal["pending", "approved", "denied"]


class IRunLookup(Protocol):
    def readyRun(self, device: str) -> str | None:
        """The id of C{device}'s run that can be delivered now, else L{None}."""

    def identity(self, device: str) -> tuple[str, str] | None:
        """The (uuid, serial) the inventory holds for C{device}, if known."""


@dataclass(frozen=True)
class Grant:
    """What an access token authorizes: one device's run."""

    device: str
    run: str


@dataclass(frozen=True)
class PendingRequest:
    """
    One device authorization request, as the owner sees it.

    @ivar reported: what the node sent (C{uuid}, C{serial}, C{mac},
        C{hostname}, C{code}); C{code} is a bearer secret, left out of
        C{repr} and of the admin API's JSON, which say only whether it was
        sent (L{code_sent}).
    @ivar issued: whether the access token was handed out.
    """

    user_code: str
    reported: Mapping[str, str] = field(repr=False)
    peer: str
    client_id: str
    created_at: float
    expires_at: float
    state: State = "pending"
    device: str | None = None
    run: str | None = None
    decided_by: str | None = None
    issued: bool = False

    @property
    def code_sent(self) -> bool:
        return "code" in self.reported


class DeviceFlowError(Exception):
    """
    An owner's approval or denial was refused.

    @ivar kind: C{"invalid"}, C{"unknown-user-code"}, C{"expired"},
        C{"already-decided"}, C{"no-ready-run"} or C{"too-many-attempts"}.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


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
