"""
Boot completion of one run, as an automat state machine [B1] [B2] [B3].

    waiting --running--> running --done--> rebooting --configFetched--> done
       |                                    |   |                        ^
       +-------------done-------------------+   +--returned--> returned -+
                                                +--netbooted-> netbooted-+

A workflow's SUCCESS seen through the proxy (or read from its Workflow
resource, when configured) means the reboot starts, not that the disk
boots [B1]: the run is then C{rebooting} until Talos fetches
its configuration on the boot listener (C{configFetched}, from the run
registry's delivery), which is the proof. If instead the node's agent
polls again from a fresh start in HookOS while the configuration is
unread (C{returned}), the machine PXE-booted first: the first time per run
is journaled and C{FleetNodeBootedHookOSAfterInstall} raised and held
while the agent keeps polling [B2] [V6]. A run whose desired_action asks
for a network boot expects exactly that (C{netbooted}): silent [B3]. A new
workflow starting in HookOS sends the run back to C{running}.

A run restored after a restart enters the state its journal shows
(C{boot.rebooting}, C{boot.hookos-after-install}), or C{done} once its
configuration was delivered.
"""

from __future__ import annotations

import enum
from typing import Protocol

from automat import TypeMachineBuilder

from fleetd.automata import answer, ignore, indexed


class WorkflowEnd(enum.Enum):
    """What a workflow's end, told and not yet journaled, means for the run."""

    RECORD = "record"  # it moves the run: journal it [B1], then say C{done}
    NOTHING = "nothing"  # the run is rebooting or done already


class BootInputs(Protocol):
    def restoreRebooting(self) -> None:
        "The journal says the workflow finished and nothing since."

    def restoreReturned(self) -> None:
        "The journal says the node came back to HookOS after its install."

    def restoreDone(self) -> None:
        "The run's configuration was delivered."

    def running(self) -> None:
        "An action of the device's workflow started."

    def done(self, workflow: str, signal: str) -> None:
        """The device's workflow finished (its last action succeeded), as
        C{signal} says: C{proxy} (the calls seen) or C{kubernetes} (the
        Workflow's state); the tracker passes each workflow once per run."""

    def returned(self) -> None:
        "The agent polls from a fresh start while the configuration is unread."

    def netbooted(self) -> None:
        "Like C{returned}, for a run whose desired_action is a network boot."

    def configFetched(self) -> None:
        "Talos fetched the run's configuration on the boot listener."

    def workflowEnded(self) -> WorkflowEnd:
        "A workflow's end was told: whether it is to be journaled."

    def describe(self) -> str:
        "The state's name, for people and logs."


class BootEffects(Protocol):
    """What the machine asks of its run's tracker (see L{fleetd.tink.completion})."""

    def rebooting(self, workflow: str, signal: str) -> None:
        "The run moved to C{rebooting}; log it (its entry is committed)."

    def inHookOS(self) -> None:
        "The node is (still) in HookOS, its configuration unread [B2] [V6]."

    def netbootExpected(self) -> None:
        "The node netbooted as its run asked [B3]: log it, no alert."

    def completed(self, afterHookOS: bool) -> None:
        "The configuration was fetched (C{afterHookOS}: after a return)."


# A Protocol core: mypy wants a concrete class where automat takes any type.
builder = TypeMachineBuilder(BootInputs, BootEffects)  # type: ignore[type-abstract]
waiting = builder.state("waiting")
running = builder.state("running")
rebooting = builder.state("rebooting")
returned = builder.state("returned")
netbooted = builder.state("netbooted")
done = builder.state("done")

waiting.upon(BootInputs.restoreRebooting).to(rebooting).returns(None)
waiting.upon(BootInputs.restoreReturned).to(returned).returns(None)
waiting.upon(BootInputs.restoreDone).to(done).returns(None)

for _state in (waiting, running, rebooting, returned, netbooted):
    _state.upon(BootInputs.running).to(running).returns(None)
# Polls during a workflow are the agent's normal life.
ignore((waiting, running), BootInputs.returned, BootInputs.netbooted)


def _rebooting(
    inputs: BootInputs, effects: BootEffects, workflow: str, signal: str
) -> None:
    effects.rebooting(workflow, signal)


for _state in (waiting, running, returned, netbooted):
    _state.upon(BootInputs.done).to(rebooting)(_rebooting)
ignore((rebooting,), BootInputs.done)  # another workflow's end
answer(
    BootInputs.workflowEnded,
    (
        (waiting, WorkflowEnd.RECORD),
        (running, WorkflowEnd.RECORD),
        (returned, WorkflowEnd.RECORD),
        (netbooted, WorkflowEnd.RECORD),
        (rebooting, WorkflowEnd.NOTHING),
        (done, WorkflowEnd.NOTHING),
    ),
)


@rebooting.upon(BootInputs.returned).to(returned)
def _returned(inputs: BootInputs, effects: BootEffects) -> None:
    effects.inHookOS()


@returned.upon(BootInputs.returned).loop()
def _stillReturned(inputs: BootInputs, effects: BootEffects) -> None:
    effects.inHookOS()  # holds the alert series while polls continue [V6]


@rebooting.upon(BootInputs.netbooted).to(netbooted)
def _netbooted(inputs: BootInputs, effects: BootEffects) -> None:
    effects.netbootExpected()


ignore((returned,), BootInputs.netbooted)
ignore((netbooted,), BootInputs.netbooted, BootInputs.returned)


@returned.upon(BootInputs.configFetched).to(done)
def _fetchedAfterHookOS(inputs: BootInputs, effects: BootEffects) -> None:
    effects.completed(True)


for _state in (waiting, running, rebooting, netbooted):

    @_state.upon(BootInputs.configFetched).to(done)
    def _fetched(inputs: BootInputs, effects: BootEffects) -> None:
        effects.completed(False)


ignore(
    (done,),
    BootInputs.running,
    BootInputs.done,
    BootInputs.returned,
    BootInputs.netbooted,
    BootInputs.configFetched,
)
answer(
    BootInputs.describe,
    (
        (waiting, "waiting"),
        (running, "running"),
        (rebooting, "rebooting"),
        (returned, "returned-to-hookos"),
        (netbooted, "netbooted"),
        (done, "done"),
    ),
)

BootMachine = indexed(builder.build())
