"""
Who is calling the device listener: a node's identity, from its LDevID.

Node resources on 8444 (disk reports, plan lookups, renewal) take an
L{Identify} function and ask it who sent the request; they never read TLS
details themselves, so tests drive them with a fake. The real function
(LDevID client certificate verified against the trust bundle, mapped to the
inventory [T4]) lives with the LDevID issuer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from twisted.web.iweb import IRequest


@dataclass(frozen=True)
class NodeIdentity:
    """
    The node behind a request, as its LDevID names it.

    @ivar device: the inventory name of the device (lowercase label).
    @ivar serial: its chassis serial, as the inventory spells it.
    """

    device: str
    serial: str


class Identify(Protocol):
    """Name the node that sent C{request}, or L{None} when it proved nothing."""

    def __call__(self, request: IRequest) -> NodeIdentity | None: ...


def unidentified(request: IRequest) -> NodeIdentity | None:
    """
    Identify nobody: every node request is refused. The daemon uses this
    until the LDevID identification is wired in its place.
    """
    return None
