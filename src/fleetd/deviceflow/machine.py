"""
The life of one device authorization request (RFC 8628), as an automat
state machine.

    pending --decide--> deciding --approved--> approved --poll--> issuing
       ^                  |   |                   ^                  |
       +----undecided-----+   +--denied--> denied +----notIssued-----+
                                                                     |
                                                 issued <--issued----+

    pending, approved, denied --expire--> expired

C{decide} takes the request out of the owner's hands while the decision's
journal entry is written [J1]: the node keeps hearing
C{authorization_pending}, a second owner hears L{Outcome.BUSY}, and only
once the entry is durable does C{approved} or C{denied} change what the
node's next poll gets (C{undecided} when the journal refused it). The
first poll after an approval moves to C{issuing} and gets
L{Outcome.ISSUE}: the caller journals the token before it hands it out,
then says C{issued} (or C{notIssued}, and the next poll tries again).
C{look} answers what C{decide} would, and changes nothing (the owner's
lookup before deciding). C{deciding} and C{issuing} ignore C{expire}: an
entry being written settles first. The sweep has by then taken the
request out of the live queue, so whoever settles a decision checks the
request's lifetime and says C{expire} when it is over: an approval
recorded too late never yields a token.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from automat import TypeMachineBuilder

from fleetd.automata import answer, ignore, indexed
from fleetd.deviceflow.model import Grant, RequestView, displayUserCode
from fleetd.ratelimit import PollPacer


class Outcome(enum.Enum):
    """What a poll or a decision on a request gets."""

    PENDING = "authorization_pending"
    SLOW_DOWN = "slow_down"  # polled faster than the interval [F1]
    ISSUE = "issue"  # approved: journal and hand out a token now
    SPENT = "invalid_grant"  # the token was handed out already
    DENIED = "access_denied"
    EXPIRED = "expired_token"
    DECIDE = "decide"  # the caller may record its decision now
    BUSY = "being-decided"  # another decision is being recorded
    DECIDED = "already-decided"


class RequestInputs(Protocol):
    def poll(self, now: float) -> Outcome:
        "The node asks for its token at C{now}."

    def decide(self) -> Outcome:
        "An owner wants to approve or deny; L{Outcome.DECIDE} lets them."

    def look(self) -> Outcome:
        "An owner looks the request up: what C{decide} would answer, unchanged."

    def approved(self, grant: Grant) -> None:
        "The approval's journal entry is durable; C{grant} is what it allows."

    def denied(self) -> None:
        "The denial's journal entry is durable."

    def undecided(self) -> None:
        "The decision was not recorded (or not made): nothing changed."

    def issued(self) -> None:
        "The token's journal entry is durable and the token handed out."

    def notIssued(self) -> None:
        "The token could not be recorded; the next poll tries again."

    def expire(self) -> None:
        "The request's lifetime is over."

    def awaitsDecision(self) -> bool:
        "The owner lists pending requests: whether this one belongs there."

    def status(self) -> str:
        "How the owner's listing names the request's state."


@dataclass(eq=False)
class RequestCore:
    """What a request keeps between inputs: its pacing and its grant."""

    interval: int
    pacer: PollPacer = field(init=False)
    grant: Grant | None = None

    def __post_init__(self) -> None:
        self.pacer = PollPacer(self.interval)


builder = TypeMachineBuilder(RequestInputs, RequestCore)
pending = builder.state("pending")
deciding = builder.state("deciding")
approved = builder.state("approved")
issuing = builder.state("issuing")
issued = builder.state("issued")
denied = builder.state("denied")
expired = builder.state("expired")


def _paced(inputs: RequestInputs, core: RequestCore, now: float) -> Outcome:
    return Outcome.SLOW_DOWN if core.pacer.tooFast(now) else Outcome.PENDING


pending.upon(RequestInputs.poll).loop()(_paced)
deciding.upon(RequestInputs.poll).loop()(_paced)
approved.upon(RequestInputs.poll).to(issuing).returns(Outcome.ISSUE)
answer(
    RequestInputs.poll,
    (
        # The probe pair's second poll, while the first one's token is journaled.
        (issuing, Outcome.PENDING),
        (issued, Outcome.SPENT),
        (denied, Outcome.DENIED),
        (expired, Outcome.EXPIRED),
    ),
)

# What a decision meets once the request is out of pending; a look answers
# the same, and DECIDE while pending (where decide moves it to deciding).
_DECIDED = (
    (deciding, Outcome.BUSY),
    (approved, Outcome.DECIDED),
    (issuing, Outcome.DECIDED),
    (issued, Outcome.DECIDED),
    (denied, Outcome.DECIDED),
    (expired, Outcome.EXPIRED),
)
pending.upon(RequestInputs.decide).to(deciding).returns(Outcome.DECIDE)
answer(RequestInputs.decide, _DECIDED)
answer(RequestInputs.look, ((pending, Outcome.DECIDE), *_DECIDED))


@deciding.upon(RequestInputs.approved).to(approved)
def _approved(inputs: RequestInputs, core: RequestCore, grant: Grant) -> None:
    core.grant = grant


deciding.upon(RequestInputs.denied).to(denied).returns(None)
deciding.upon(RequestInputs.undecided).to(pending).returns(None)
issuing.upon(RequestInputs.issued).to(issued).returns(None)
issuing.upon(RequestInputs.notIssued).to(approved).returns(None)

for _live in (pending, approved, denied):
    _live.upon(RequestInputs.expire).to(expired).returns(None)
ignore((deciding, issuing, issued, expired), RequestInputs.expire)
_all = (pending, deciding, approved, issuing, issued, denied, expired)
answer(
    RequestInputs.awaitsDecision,
    ((state, state in (pending, deciding)) for state in _all),
)
answer(
    RequestInputs.status,
    (
        (pending, "pending"),
        (deciding, "pending"),
        (approved, "approved"),
        (issuing, "approved"),
        (issued, "issued"),
        (denied, "denied"),
        (expired, "expired"),
    ),
)

RequestMachine = indexed(builder.build())


@dataclass(eq=False)
class Held:
    """One held request: its secrets' digests, what it reported, its machine."""

    digest: bytes = field(repr=False)
    letters: str = field(repr=False)
    id: str
    reported: Mapping[str, str] = field(repr=False)
    peer: str
    source: str
    client_id: str
    created_at: float
    expires_at: float
    known: str | None
    machine: RequestInputs
    core: RequestCore = field(repr=False)
    device: str | None = None
    decided_by: str | None = None

    def view(self) -> RequestView:
        return RequestView(
            id=self.id,
            user_code=displayUserCode(self.letters),
            reported=self.reported,
            peer=self.peer,
            client_id=self.client_id,
            created_at=self.created_at,
            expires_at=self.expires_at,
            known=self.known,
            state=self.machine.status(),
            device=self.device,
            decided_by=self.decided_by,
        )
