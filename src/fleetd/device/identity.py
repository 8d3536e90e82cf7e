"""
Who is calling the device listener: a node's identity, from its LDevID.

Node resources on 8444 (disk reports, plan lookups, renewal) take an
L{Identify} function and ask it who sent the request; they never read TLS
details themselves, so tests drive them with a fake. The real function
(L{byLDevID}) hands the client certificate TLS verified to the LDevID
identifier, which checks it against the trust bundle and the records [T4].
"""

from __future__ import annotations

from typing import Protocol

from twisted.web.iweb import IRequest

from fleetd.attest.identity import LDevIDIdentifier
from fleetd.nodes import NodeIdentity, Refused
from fleetd.web.peer import peerCertificate


class Identify(Protocol):
    """Name the node that sent C{request}, or L{None} when it proved nothing."""

    def __call__(self, request: IRequest) -> NodeIdentity | None: ...


def unidentified(request: IRequest) -> NodeIdentity | None:
    """
    Identify nobody: every node request is refused. The daemon uses this
    until the LDevID identification is wired in its place.
    """
    return None


def byLDevID(identifier: LDevIDIdentifier) -> Identify:
    """Identify the node by the LDevID client certificate it presented [T4]."""

    def identify(request: IRequest) -> NodeIdentity | None:
        try:
            return identifier.check(peerCertificate(request)).identity
        except Refused:
            return None

    return identify
