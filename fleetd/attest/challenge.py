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

Each challenge may carry a key (the EK digest): a new challenge for a key
replaces the older one (forgotten at once, its timer cancelled), so one
EK holds at most one entry and replaying an EK cannot fill the book. The
global C{limit} still caps keys.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from automat import TypeMachineBuilder
from twisted.internet.interfaces import IDelayedCall, IReactorTime


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


class ChallengeEffects:
    """Nothing to do yet: the book keeps timers; kept for symmetry and tests."""

    def consumed(self) -> None:
        pass


builder = TypeMachineBuilder(ChallengeInputs, ChallengeEffects)
pending = builder.state("pending")
used = builder.state("used")
expired = builder.state("expired")


@pending.upon(ChallengeInputs.present).to(used)
def _accept(inputs: ChallengeInputs, effects: ChallengeEffects) -> Presented:
    effects.consumed()
    return Presented.ACCEPT


pending.upon(ChallengeInputs.expire).to(expired).returns(None)
used.upon(ChallengeInputs.present).loop().returns(Presented.USED)
used.upon(ChallengeInputs.expire).loop().returns(None)
expired.upon(ChallengeInputs.present).loop().returns(Presented.EXPIRED)
expired.upon(ChallengeInputs.expire).loop().returns(None)

ChallengeMachine = builder.build()


@dataclass
class _Entry:
    machine: ChallengeInputs
    context: Any
    timer: IDelayedCall | None = field(default=None)
    key: str | None = None


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
        self._entries: dict[str, _Entry] = {}
        self._byKey: dict[str, str] = {}  # key -> id of its one entry

    def __len__(self) -> int:
        return len(self._entries)

    def full(self) -> bool:
        return len(self._entries) >= self.limit

    def holds(self, key: str) -> bool:
        """Whether C{key} has an entry (a new challenge for it replaces that)."""
        return key in self._byKey

    def issue(self, context: Any, key: str | None = None) -> str:
        """
        A new pending challenge for C{context}; returns its id. With
        C{key}, the older challenge of that key is forgotten.
        """
        if key is not None and key in self._byKey:
            self._drop(self._byKey[key])
        ident = secrets.token_urlsafe(18)
        entry = _Entry(ChallengeMachine(ChallengeEffects()), context, key=key)
        entry.timer = self._clock.callLater(self.ttl, self._expire, ident)
        self._entries[ident] = entry
        if key is not None:
            self._byKey[key] = ident
        return ident

    def _drop(self, ident: str) -> None:
        entry = self._entries.pop(ident, None)
        if entry is None:
            return
        if entry.timer is not None and entry.timer.active():
            entry.timer.cancel()
        if entry.key is not None and self._byKey.get(entry.key) == ident:
            del self._byKey[entry.key]

    def present(self, ident: str) -> tuple[Presented, Any] | None:
        """Present an answer: the outcome and the context, or L{None} if unknown."""
        entry = self._entries.get(ident)
        if entry is None:
            return None
        return entry.machine.present(), entry.context

    def _expire(self, ident: str) -> None:
        entry = self._entries[ident]
        entry.machine.expire()
        entry.timer = self._clock.callLater(self.ttl, self._forget, ident)

    def _forget(self, ident: str) -> None:
        self._drop(ident)

    def stop(self) -> None:
        """Cancel every timer and forget every challenge."""
        for entry in self._entries.values():
            if entry.timer is not None and entry.timer.active():
                entry.timer.cancel()
        self._entries.clear()
        self._byKey.clear()
