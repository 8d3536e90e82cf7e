"""
Who is in the console without a certificate: one-time login links and the
sessions they open (docs/design.md, the owner console).

C{fleetctl console} asks the owner API for a link; the link names a random
token that opens one session, once, within L{LINK_LIFETIME} seconds, for
the owner who asked, with the role of the certificate that asked (a
reader's link opens a reader's session [O4]). A session lives in memory
(a restart of fleetd ends every session: the owner runs C{fleetctl
console} again), ends after L{IDLE} seconds unused or L{ABSOLUTE} seconds
after it opened, and carries its own CSRF token. Tokens are kept as
SHA-256 digests only, so a memory dump or a log line never holds a
usable one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, TypeVar

from twisted.internet.interfaces import IReactorTime

from fleetd.pki.owners import OWNER

LINK_LIFETIME = 300.0  # seconds a login link may wait to be opened
IDLE = 30 * 60.0  # seconds a session may sit unused
ABSOLUTE = 12 * 3600.0  # seconds a session lives at most
# Unopened links and open sessions kept, per owner and in all; past a
# bound the oldest link (the least recently used session) goes, of the
# same owner when the owner's bound is passed: one owner (or a script
# looping fleetctl console) never ends another's link or session.
MAX_LINKS_PER_OWNER = 8
MAX_LINKS = 256
MAX_SESSIONS_PER_OWNER = 16
MAX_SESSIONS = 1024
# __Host-: the browser takes it only from this origin, Secure, Path=/ and
# without Domain, so no sibling name or other port can set it.
COOKIE = b"__Host-fleetd_console"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class _Owned(Protocol):
    @property
    def owner(self) -> str: ...


_T = TypeVar("_T", bound=_Owned)


def _bound(
    table: OrderedDict[bytes, _T], owner: str, perOwner: int, total: int
) -> None:
    """Drop C{owner}'s oldest entries past C{perOwner}, then anyone's past C{total}."""
    mine = [k for k, v in table.items() if v.owner == owner]
    for key in mine[: max(0, len(mine) - perOwner)]:
        del table[key]
    while len(table) > total:
        table.popitem(last=False)


@dataclass
class Session:
    """
    An open console session: whose it is, its CSRF token, its times, and
    the role of the certificate that asked for its link [O4].
    """

    owner: str
    csrf: str
    opened: float
    seen: float
    role: str = OWNER


@dataclass(frozen=True)
class _Link:
    owner: str
    expires: float
    role: str = OWNER


class ConsoleSessions:
    """Login links and sessions, on C{clock}."""

    def __init__(
        self,
        clock: IReactorTime,
        *,
        linkLifetime: float = LINK_LIFETIME,
        idle: float = IDLE,
        absolute: float = ABSOLUTE,
    ) -> None:
        self._clock = clock
        self.linkLifetime = linkLifetime
        self.idle = idle
        self.absolute = absolute
        self._links: OrderedDict[bytes, _Link] = OrderedDict()
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()
        self._secret = secrets.token_bytes(32)
        # Where a browser reaches the console, once the admin listener is
        # bound (L{fleetd.admin.deviceflow.followAdminPort}).
        self.base = "https://localhost"

    def setBase(self, base: str) -> None:
        """The console's C{https://name[:port]}, for the links it prints."""
        self.base = base

    def newLink(self, owner: str, role: str = OWNER) -> tuple[str, float]:
        """
        A login link token for C{owner}, and when it expires; its session
        has C{role}, the role of the certificate that asked [O4].
        """
        self._sweep()
        token = secrets.token_urlsafe(32)
        expires = self._clock.seconds() + self.linkLifetime
        self._links[_digest(token)] = _Link(owner, expires, role)
        _bound(self._links, owner, MAX_LINKS_PER_OWNER, MAX_LINKS)
        return token, expires

    def linkValid(self, token: str) -> bool:
        """Whether C{token} names a link that would open a session now (kept)."""
        link = self._links.get(_digest(token))
        return link is not None and self._clock.seconds() < link.expires

    def redeem(self, token: str) -> tuple[str, Session] | None:
        """
        Open a session with the link C{token}: its id and the session, or
        L{None} when the link is unknown, used or expired. A link is gone
        after its first use, whatever the outcome.
        """
        link = self._links.pop(_digest(token), None)
        now = self._clock.seconds()
        if link is None or now >= link.expires:
            return None
        self._sweep()
        sessionID = secrets.token_urlsafe(32)
        session = Session(link.owner, secrets.token_urlsafe(32), now, now, link.role)
        self._sessions[_digest(sessionID)] = session
        _bound(self._sessions, link.owner, MAX_SESSIONS_PER_OWNER, MAX_SESSIONS)
        return sessionID, session

    def find(self, sessionID: str, touch: bool = True) -> Session | None:
        """
        The live session C{sessionID} names, or L{None}.

        @param touch: whether this counts as use (resets the idle time); a
            page's automatic reload does not.
        """
        key = _digest(sessionID)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self._clock.seconds()
        if now - session.seen >= self.idle or now - session.opened >= self.absolute:
            del self._sessions[key]
            return None
        if touch:
            session.seen = now
            self._sessions.move_to_end(key)
        return session

    def end(self, sessionID: str) -> None:
        """Close the session C{sessionID} (logout); unknown ids are ignored."""
        self._sessions.pop(_digest(sessionID), None)

    def certificateCSRF(self, owner: str, role: str = OWNER) -> str:
        """
        The CSRF token of a browser that presents C{owner}'s certificate
        (it has no session): bound to the owner and its role, unguessable
        without this process's secret, new after every restart.
        """
        bound = owner if role == OWNER else f"{role}:{owner}"  # no ":" in names
        mac = hmac.new(self._secret, b"certificate:" + bound.encode(), "sha256")
        return mac.hexdigest()

    def _sweep(self) -> None:
        now = self._clock.seconds()
        for key in [k for k, link in self._links.items() if now >= link.expires]:
            del self._links[key]
        for key in [
            k
            for k, s in self._sessions.items()
            if now - s.seen >= self.idle or now - s.opened >= self.absolute
        ]:
            del self._sessions[key]
