"""
The life of one attestation challenge, as an automat state machine [T3].

    pending --present--> used
       |
       +----expire-----> expired

A challenge is issued after the EK, its binding and the AK were checked;
the node answers it once. The first presentation consumes it whatever the
proof turns out to be (a wrong answer cannot be retried against the same
secret), a later one is a replay. At its TTL a pending challenge expires;
answered or expired, it is remembered for one more TTL so that a late
node is told what happened, then forgotten.

Each challenge may carry a key (the EK digest). Anyone can send an EK's
public claim again, so a new challenge never cancels a pending one [T1]:
a key holds at most L{PER_KEY} pending challenges, and the next is
refused (L{NoRoom}, with the time until its oldest expires) until one is
answered or expires. Answered and expired entries (kept only to tell a
late node what happened) give way to a new challenge when the book is at
its global C{limit}; only pending challenges make it full.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from automat import TypeMachineBuilder
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from fleetd.automata import answer, ignore, indexed

# Pending challenges one key (EK) may hold: an honest node that restarts
# its attest action twice within a TTL still gets a challenge at once.
PER_KEY = 3


class NoRoom(Exception):
    """
    The book takes no challenge now: C{perKey} when the key's
    L{PER_KEY} challenges are pending, else the book is full of pending
    ones. C{retryAfter}: seconds until the oldest of those expires.
    """

    def __init__(self, perKey: bool, retryAfter: float) -> None:
        super().__init__("per key" if perKey else "full")
        self.perKey = perKey
        self.retryAfter = retryAfter


class Presented(enum.Enum):
    """What presenting an answer to a challenge gets."""

    ACCEPT = "accept"  # first presentation in time: check the proof
    USED = "used"  # replay
    EXPIRED = "expired"  # too late


class ChallengeInputs(Protocol):
    def present(self) -> Presented:
        "The node sends its proof for this challenge."

    def expire(self) -> None:
        "The challenge's TTL has passed."


@dataclass(eq=False)
class Challenge:
    """
    One challenge's core: what the service checks the proof against
    (C{context}), when it was issued, its key (the EK digest, if any) and
    its timer (to expire it, then to forget it); the book keeps the timers.
    """

    context: Any
    issuedAt: float
    key: str | None = None
    timer: IDelayedCall | None = None


builder = TypeMachineBuilder(ChallengeInputs, Challenge)
pending = builder.state("pending")
used = builder.state("used")
expired = builder.state("expired")

pending.upon(ChallengeInputs.present).to(used).returns(Presented.ACCEPT)
pending.upon(ChallengeInputs.expire).to(expired).returns(None)
answer(ChallengeInputs.present, ((used, Presented.USED), (expired, Presented.EXPIRED)))
ignore((used, expired), ChallengeInputs.expire)

ChallengeMachine = indexed(builder.build())


class ChallengeBook:
    """
    Outstanding challenges by id, each with its machine and its context
    (whatever the service needs to check the proof). Time comes from the
    injected clock; L{stop} cancels every timer.
    """

    def __init__(self, clock: IReactorTime, ttl: float, limit: int = 4096) -> None:
        self._clock = clock
        self.ttl = ttl
        self.limit = limit
        self._entries: dict[str, tuple[ChallengeInputs, Challenge]] = {}
        # Ids of pending challenges in the order issued, all and by key;
        # answered or expired ones in the order they finished.
        self._pending: dict[str, None] = {}
        self._byKey: dict[str, list[str]] = {}
        self._finished: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _retryAfter(self, ident: str) -> float:
        _, challenge = self._entries[ident]
        return max(0.0, challenge.issuedAt + self.ttl - self._clock.seconds())

    def room(self, key: str | None = None) -> None:
        """
        Whether a challenge for C{key} can be issued now.

        @raise NoRoom: C{key} holds L{PER_KEY} pending challenges, or the
            book is at its limit with pending challenges only.
        """
        pending = self._byKey.get(key, []) if key is not None else []
        if len(pending) >= PER_KEY:
            raise NoRoom(True, self._retryAfter(pending[0]))
        if len(self._entries) >= self.limit and not self._finished:
            oldest = next(iter(self._pending), None)
            raise NoRoom(
                False, self.ttl if oldest is None else self._retryAfter(oldest)
            )

    def issue(self, context: Any, key: str | None = None) -> str:
        """
        A new pending challenge for C{context}; returns its id. Pending
        challenges stay; the oldest answered or expired entry gives way
        when the book is at its limit.

        @raise NoRoom: see L{room}.
        """
        self.room(key)
        while len(self._entries) >= self.limit and self._finished:
            self._drop(next(iter(self._finished)))
        ident = secrets.token_urlsafe(18)
        now = self._clock.seconds()
        challenge = Challenge(context, now, key=key)
        challenge.timer = self._clock.callLater(self.ttl, self._expire, ident)
        self._entries[ident] = (ChallengeMachine(challenge), challenge)
        self._pending[ident] = None
        if key is not None:
            self._byKey.setdefault(key, []).append(ident)
        return ident

    def _finish(self, ident: str) -> None:
        """C{ident} was answered or expired: no longer pending."""
        self._pending.pop(ident, None)
        self._finished[ident] = None
        key = self._entries[ident][1].key
        if key is not None:
            idents = self._byKey.get(key, [])
            if ident in idents:
                idents.remove(ident)
            if not idents:
                self._byKey.pop(key, None)

    def _drop(self, ident: str) -> None:
        if ident in self._pending:
            self._finish(ident)
        self._finished.pop(ident, None)
        found = self._entries.pop(ident, None)
        timer = None if found is None else found[1].timer
        if timer is not None and timer.active():
            timer.cancel()

    def present(self, ident: str) -> tuple[Presented, Any] | None:
        """Present an answer: the outcome and the context, or L{None} if unknown."""
        found = self._entries.get(ident)
        if found is None:
            return None
        machine, challenge = found
        outcome = machine.present()
        if outcome is Presented.ACCEPT:
            self._finish(ident)
        return outcome, challenge.context

    def _expire(self, ident: str) -> None:
        machine, challenge = self._entries[ident]
        machine.expire()
        if ident in self._pending:
            self._finish(ident)
        challenge.timer = self._clock.callLater(self.ttl, self._forget, ident)

    def _forget(self, ident: str) -> None:
        self._drop(ident)

    def stop(self) -> None:
        """Cancel every timer and forget every challenge."""
        for _, challenge in self._entries.values():
            if challenge.timer is not None and challenge.timer.active():
                challenge.timer.cancel()
        self._entries.clear()
        self._pending.clear()
        self._byKey.clear()
        self._finished.clear()
