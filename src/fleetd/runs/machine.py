"""
The delivery lifecycle of one run, as an automat state machine [C1].

    restoring --restoreReady/Consumed/Lost/Superseded--> (that state)

    ready --request--> delivering --sent--> consumed
      ^                    |
      +--aborted/markFailed+--configVanished--> lost

    ready, consumed, lost --supersede--> superseded
    delivering --supersede--> supersededInFlight --sent/aborted--> superseded

C{request} in C{ready} writes the served-config mark to the vault before
it returns L{Outcome.DELIVER}, so the mark is in place (tmpfs) before the
first byte of the body goes out; C{aborted} withdraws it. While one
connection receives the run, others are told to come back (L{Outcome.BUSY})
without counting as a refetch. When the mark cannot be written (a full
tmpfs) nothing was sent and nothing is journaled: C{markFailed} returns
the run to C{ready}. Every state can be superseded by a newer run
of the same device; a delivery already in flight then finishes or fails on
its own and is journaled, but not released. A run restored after a restart
or reboot enters the state its stored evidence shows.
"""

from __future__ import annotations

import enum
from typing import Protocol

from automat import TypeMachineBuilder

from fleetd.automata import answer, ignore, indexed


class Outcome(enum.Enum):
    """What a request for a run's configuration gets."""

    DELIVER = "deliver"
    BUSY = "busy"  # 503: another connection is receiving it right now
    CONSUMED = "consumed"  # 410: delivered before [C2]
    LOST = "lost"  # 410: issued, but its configuration is gone [V4]
    SUPERSEDED = "superseded"  # 410: a newer run replaced it [V5][C3]
    UNAVAILABLE = "unavailable"  # 503: the vault refused the served mark


class RunInputs(Protocol):
    def restoreReady(self) -> None:
        "The vault holds the configuration and no served mark."

    def restoreConsumed(self) -> None:
        "A served mark is in the vault or was released to the inventory."

    def restoreLost(self) -> None:
        "Neither the configuration nor a released served record exists."

    def restoreSuperseded(self) -> None:
        "A newer run of the device exists."

    def request(self, peer: str) -> Outcome:
        "A node at C{peer} asks for this run's configuration."

    def sent(self) -> None:
        "The whole response was handed to the connection."

    def aborted(self) -> None:
        "The connection failed before the operating system had the whole body."

    def markFailed(self) -> None:
        "The served mark could not be written; nothing was sent."

    def configVanished(self, peer: str) -> None:
        "The vault no longer holds the configuration (tmpfs emptied under us)."

    def supersede(self) -> None:
        "The owner provisioned the device again."

    def deliverable(self) -> bool:
        "Whether a request now would be served."

    def configDelivered(self) -> bool:
        "Whether the configuration went out (the run is consumed)."

    def describe(self) -> str:
        "The state's name, for people (C{fleetctl status}, the console)."


class RunEffects(Protocol):
    """Side effects the machine asks of its run (the registry's run implements them)."""

    __slots__ = ()

    def markServed(self, peer: str) -> None:
        "Write the served mark for C{peer} to the vault (it may raise)."

    def withdrawServed(self) -> None:
        "The delivery failed: remove the served mark, note the abort."

    def dropMark(self) -> None:
        "Nothing was sent: remove a served mark that may be half written."

    def delivered(self) -> None:
        "The delivery completed: record it and release the device."

    def deliveredSuperseded(self) -> None:
        "A superseded run's delivery completed: record it, release nothing."

    def noteRefetch(self, peer: str) -> None:
        "C{peer} asked again for a configuration already delivered."

    def noteMissing(self, peer: str) -> None:
        "C{peer} asked for a configuration the vault no longer holds."

    def dropConfig(self) -> None:
        "Remove the configuration from the vault."

    def dropAll(self) -> None:
        "Remove the configuration and the served mark."


# A Protocol core: mypy wants a concrete class where automat takes any type.
builder = TypeMachineBuilder(RunInputs, RunEffects)  # type: ignore[type-abstract]
restoring = builder.state("restoring")
ready = builder.state("ready")
delivering = builder.state("delivering")
consumed = builder.state("consumed")
lost = builder.state("lost")
superseded = builder.state("superseded")
supersededInFlight = builder.state("supersededInFlight")

restoring.upon(RunInputs.restoreReady).to(ready).returns(None)
restoring.upon(RunInputs.restoreConsumed).to(consumed).returns(None)
restoring.upon(RunInputs.restoreLost).to(lost).returns(None)
restoring.upon(RunInputs.restoreSuperseded).to(superseded).returns(None)


@ready.upon(RunInputs.request).to(delivering)
def _deliver(inputs: RunInputs, effects: RunEffects, peer: str) -> Outcome:
    effects.markServed(peer)
    return Outcome.DELIVER


delivering.upon(RunInputs.request).loop().returns(Outcome.BUSY)


@delivering.upon(RunInputs.sent).to(consumed)
def _sent(inputs: RunInputs, effects: RunEffects) -> None:
    effects.delivered()


@delivering.upon(RunInputs.aborted).to(ready)
def _aborted(inputs: RunInputs, effects: RunEffects) -> None:
    effects.withdrawServed()


@delivering.upon(RunInputs.markFailed).to(ready)
def _markFailed(inputs: RunInputs, effects: RunEffects) -> None:
    effects.dropMark()


@delivering.upon(RunInputs.configVanished).to(lost)
def _vanished(inputs: RunInputs, effects: RunEffects, peer: str) -> None:
    # Nothing was sent: the mark goes, and the run is lost like after a
    # reboot [V4], with its alert, instead of aborting on every request.
    effects.dropMark()
    effects.noteMissing(peer)


@consumed.upon(RunInputs.request).loop()
def _refetch(inputs: RunInputs, effects: RunEffects, peer: str) -> Outcome:
    effects.noteRefetch(peer)
    return Outcome.CONSUMED


@lost.upon(RunInputs.request).loop()
def _missing(inputs: RunInputs, effects: RunEffects, peer: str) -> Outcome:
    effects.noteMissing(peer)
    return Outcome.LOST


answer(
    RunInputs.request,
    ((superseded, Outcome.SUPERSEDED), (supersededInFlight, Outcome.SUPERSEDED)),
)
ignore((superseded, supersededInFlight), RunInputs.supersede)


@ready.upon(RunInputs.supersede).to(superseded)
def _supersedeReady(inputs: RunInputs, effects: RunEffects) -> None:
    effects.dropAll()


@consumed.upon(RunInputs.supersede).to(superseded)
def _supersedeConsumed(inputs: RunInputs, effects: RunEffects) -> None:
    effects.dropAll()


lost.upon(RunInputs.supersede).to(superseded).returns(None)


@delivering.upon(RunInputs.supersede).to(supersededInFlight)
def _supersedeDelivering(inputs: RunInputs, effects: RunEffects) -> None:
    # The body is already in the producer; keep the mark until it settles.
    effects.dropConfig()


@supersededInFlight.upon(RunInputs.sent).to(superseded)
def _sentSuperseded(inputs: RunInputs, effects: RunEffects) -> None:
    effects.deliveredSuperseded()


@supersededInFlight.upon(RunInputs.aborted).to(superseded)
def _abortedSuperseded(inputs: RunInputs, effects: RunEffects) -> None:
    effects.dropAll()


_live = (ready, delivering, consumed, lost, superseded, supersededInFlight)
answer(RunInputs.deliverable, ((state, state is ready) for state in _live))
answer(RunInputs.configDelivered, ((state, state is consumed) for state in _live))
answer(
    RunInputs.describe,
    (
        (ready, "ready"),
        (delivering, "delivering"),
        (consumed, "consumed"),
        (lost, "lost"),
        (superseded, "superseded"),
        (supersededInFlight, "superseded"),
    ),
)

RunMachine = indexed(builder.build())
