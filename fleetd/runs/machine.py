"""
The delivery lifecycle of one run, as an automat state machine [C1].

    ready --request--> delivering --sent--> consumed
      ^                    |
      +------aborted-------+

C{request} in C{ready} writes the served-config mark to the vault before
it returns L{Outcome.DELIVER}, so the mark is durable (in tmpfs) before the
first byte of the body goes out; C{aborted} withdraws it. Every state can
be superseded by a newer run of the same device. A run restored after a
restart or reboot enters the state its stored evidence shows.
"""

from __future__ import annotations

import enum
from typing import Protocol

from automat import TypeMachineBuilder


class Outcome(enum.Enum):
    """What a request for a run's configuration gets."""

    DELIVER = "deliver"
    CONSUMED = "consumed"  # 410: delivered before [C2]
    LOST = "lost"  # 410: issued, but its configuration is gone [V4]
    SUPERSEDED = "superseded"  # 410: a newer run replaced it [V5][C3]


class RunInputs(Protocol):
    def restoreReady(self) -> None:
        "The vault holds the configuration and no served mark."

    def restoreConsumed(self) -> None:
        "A served mark is in the vault or was released to the inventory."

    def restoreLost(self) -> None:
        "Neither the configuration nor a released served record exists."

    def restoreSuperseded(self) -> None:
        "A newer run of the device exists."

    def request(self) -> Outcome:
        "A node asks for this run's configuration."

    def sent(self) -> None:
        "The whole response was handed to the connection."

    def aborted(self) -> None:
        "The connection failed before the response was complete."

    def supersede(self) -> None:
        "The owner provisioned the device again."

    def deliverable(self) -> bool:
        "Whether a request now would be served."


class RunEffects:
    """Side effects the machine asks of its run (subclassed by the registry's)."""

    def markServed(self) -> None:
        raise NotImplementedError

    def withdrawServed(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def noteRefetch(self) -> None:
        raise NotImplementedError

    def noteMissing(self) -> None:
        raise NotImplementedError

    def dropConfig(self) -> None:
        raise NotImplementedError


builder = TypeMachineBuilder(RunInputs, RunEffects)
restoring = builder.state("restoring")
ready = builder.state("ready")
delivering = builder.state("delivering")
consumed = builder.state("consumed")
lost = builder.state("lost")
superseded = builder.state("superseded")

restoring.upon(RunInputs.restoreReady).to(ready).returns(None)
restoring.upon(RunInputs.restoreConsumed).to(consumed).returns(None)
restoring.upon(RunInputs.restoreLost).to(lost).returns(None)
restoring.upon(RunInputs.restoreSuperseded).to(superseded).returns(None)


@ready.upon(RunInputs.request).to(delivering)
def _deliver(inputs: RunInputs, effects: RunEffects) -> Outcome:
    effects.markServed()
    return Outcome.DELIVER


@delivering.upon(RunInputs.request).loop()
def _concurrent(inputs: RunInputs, effects: RunEffects) -> Outcome:
    # Another connection holds the run: to this one it is already consumed.
    effects.noteRefetch()
    return Outcome.CONSUMED


@delivering.upon(RunInputs.sent).to(consumed)
def _sent(inputs: RunInputs, effects: RunEffects) -> None:
    effects.release()


@delivering.upon(RunInputs.aborted).to(ready)
def _aborted(inputs: RunInputs, effects: RunEffects) -> None:
    effects.withdrawServed()


@consumed.upon(RunInputs.request).loop()
def _refetch(inputs: RunInputs, effects: RunEffects) -> Outcome:
    effects.noteRefetch()
    return Outcome.CONSUMED


@lost.upon(RunInputs.request).loop()
def _missing(inputs: RunInputs, effects: RunEffects) -> Outcome:
    effects.noteMissing()
    return Outcome.LOST


superseded.upon(RunInputs.request).loop().returns(Outcome.SUPERSEDED)


@ready.upon(RunInputs.supersede).to(superseded)
def _supersedeReady(inputs: RunInputs, effects: RunEffects) -> None:
    effects.dropConfig()


for _state in (consumed, lost, superseded):
    _state.upon(RunInputs.supersede).to(superseded).returns(None)


@delivering.upon(RunInputs.supersede).to(superseded)
def _supersedeDelivering(inputs: RunInputs, effects: RunEffects) -> None:
    # The response in flight finishes or fails on its own; neither matters now.
    effects.dropConfig()


superseded.upon(RunInputs.sent).loop().returns(None)
superseded.upon(RunInputs.aborted).loop().returns(None)

ready.upon(RunInputs.deliverable).loop().returns(True)
for _state in (delivering, consumed, lost, superseded):
    _state.upon(RunInputs.deliverable).loop().returns(False)

RunMachine = builder.build()
