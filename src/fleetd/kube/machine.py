"""
The life of one bootstrap token fleetd created, as an automat machine [K4].

    restoring --restoreIssued--> issued
    restoring --restoreApproved--> approved

    issued --approved--> approved --deadline--> deleting --deleted--> deleted
      |                                          |    ^
      +--deadline (expiry backstop)---------->---+    | retry timer
      +--revoke (superseded, retired)-------->---+  retrying
                                                 <--failed--+

    every state but deleted --stop--> stopped

Every live token has a deletion deadline armed on the injected clock:
a per-node token's C{expiration} while it waits for its kubelet's CSR
(the Secret would be useless after it anyway), one minute after its
approval once approved, now when its run is superseded or its device
retired; the cluster-wide token has none until a rotation gives it one.
Deadlines are persisted with the change that sets them, so a restart
enters C{issued} or C{approved} with the stored deadline and an overdue
one fires at once. A failed delete (API down, 5xx) is retried with
backoff until it succeeds; C{stop} cancels every timer and the call in
flight.
"""

from __future__ import annotations

from typing import Protocol

from automat import TypeMachineBuilder

from fleetd.automata import answer, ignore, indexed


class TokenInputs(Protocol):
    def restoreIssued(self, deadline: float | None) -> None:
        "Stored: the token waits for its CSR; delete it at C{deadline}."

    def restoreApproved(self, deadline: float) -> None:
        "Stored: its CSR was approved; delete it at C{deadline}."

    def approved(self, deadline: float) -> None:
        "Its CSR's approval committed: delete it at C{deadline} [K4]."

    def revoke(self) -> None:
        "Delete it now (its run was superseded, its device retired)."

    def reschedule(self, deadline: float) -> None:
        "A rotation gave the cluster token a deletion deadline [K6]."

    def deadline(self) -> None:
        "Its deletion timer fired."

    def deleted(self) -> None:
        "The API says it is gone, and that is recorded."

    def failed(self) -> None:
        "Deleting or recording failed; try again later."

    def stop(self) -> None:
        "fleetd stops: cancel timers and the call in flight."

    def firstCSR(self) -> bool:
        """
        A kubelet's first CSR names this token: whether it may be approved
        [K2] (only an issued token's may; an approved, revoked or deleted
        one's is refused as C{token-revoked}).
        """

    def describe(self) -> str:
        "The state's name, for people (C{fleetctl status})."


class TokenEffects(Protocol):
    """What the machine asks of its token (the token book's token implements it)."""

    def arm(self, deadline: float) -> None:
        "Start the deletion timer for C{deadline}."

    def disarm(self) -> None:
        "Cancel the deletion timer, if any."

    def startDelete(self) -> None:
        "Delete the token's Secret and record it; say C{deleted} or C{failed}."

    def cancelDelete(self) -> None:
        "Cancel the delete in flight."

    def armRetry(self) -> None:
        "Start the retry timer (with backoff); it says C{deadline}."

    def forget(self) -> None:
        "The token is gone: drop it from the book."


# A Protocol core: mypy wants a concrete class where automat takes any type.
builder = TypeMachineBuilder(TokenInputs, TokenEffects)  # type: ignore[type-abstract]
restoring = builder.state("restoring")
issued = builder.state("issued")
approved = builder.state("approved")
deleting = builder.state("deleting")
retrying = builder.state("retrying")
deleted = builder.state("deleted")
stopped = builder.state("stopped")


@restoring.upon(TokenInputs.restoreIssued).to(issued)
def _restoreIssued(
    inputs: TokenInputs, effects: TokenEffects, deadline: float | None
) -> None:
    if deadline is not None:
        effects.arm(deadline)


@restoring.upon(TokenInputs.restoreApproved).to(approved)
def _restoreApproved(
    inputs: TokenInputs, effects: TokenEffects, deadline: float
) -> None:
    effects.arm(deadline)


@issued.upon(TokenInputs.approved).to(approved)
def _approved(inputs: TokenInputs, effects: TokenEffects, deadline: float) -> None:
    effects.disarm()
    effects.arm(deadline)


@issued.upon(TokenInputs.reschedule).loop()
def _reschedule(inputs: TokenInputs, effects: TokenEffects, deadline: float) -> None:
    effects.disarm()
    effects.arm(deadline)


ignore((approved,), TokenInputs.approved, TokenInputs.reschedule)


def _deleteNow(inputs: TokenInputs, effects: TokenEffects) -> None:
    effects.disarm()
    effects.startDelete()


for _waiting in (issued, approved, retrying):
    _waiting.upon(TokenInputs.deadline).to(deleting)(_deleteNow)
    _waiting.upon(TokenInputs.revoke).to(deleting)(_deleteNow)


@deleting.upon(TokenInputs.deleted).to(deleted)
def _deleted(inputs: TokenInputs, effects: TokenEffects) -> None:
    effects.forget()


@deleting.upon(TokenInputs.failed).to(retrying)
def _failed(inputs: TokenInputs, effects: TokenEffects) -> None:
    effects.armRetry()


ignore(
    (deleting, deleted, stopped),
    TokenInputs.revoke,
    TokenInputs.approved,
    TokenInputs.reschedule,
)
ignore((retrying,), TokenInputs.approved, TokenInputs.reschedule)
ignore((deleted, stopped), TokenInputs.deadline, TokenInputs.stop)
ignore((stopped,), TokenInputs.deleted, TokenInputs.failed)


for _live in (restoring, issued, approved, retrying):

    @_live.upon(TokenInputs.stop).to(stopped)
    def _stop(inputs: TokenInputs, effects: TokenEffects) -> None:
        effects.disarm()


@deleting.upon(TokenInputs.stop).to(stopped)
def _stopDeleting(inputs: TokenInputs, effects: TokenEffects) -> None:
    effects.cancelDelete()


_all = (restoring, issued, approved, deleting, retrying, deleted, stopped)
answer(TokenInputs.firstCSR, ((state, state is issued) for state in _all))
answer(
    TokenInputs.describe,
    (
        (restoring, "restoring"),
        (issued, "issued"),
        (approved, "approved"),
        (deleting, "deleting"),
        (retrying, "deleting"),
        (deleted, "deleted"),
        (stopped, "stopped"),
    ),
)

TokenMachine = indexed(builder.build())
