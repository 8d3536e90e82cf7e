"""
Writing one outbox entry to NetBox, as an automat state machine, and the
worker that takes entries from the outbox in order.

    idle --begin--> reading --toPatch--> patching --patched--> settled
                     ^  |  \\                |   |
                     |  |   +--upToDate------+---+---------> settled
                     |  |                    |
                     |  +--unreachable--> waiting <--unreachable--+
                     |                      |
                     +-------retry----------+
                     +-------changed (412)--------- patching
          reading, patching --refused--> settled
          every state --stop--> stopped

C{reading} finds the device by name and reads its detail (which carries
the ETag); the worker decides from what it read (L{decide}) and says
C{toPatch} or C{upToDate}. C{patching} PATCHes with C{If-Match}: a 412
(C{changed}) reads again and decides again, so an operator's edit made in
between survives. NetBox down, hung or refusing the token (C{unreachable})
waits with exponential backoff on the injected clock and reads again;
a refusal retrying cannot help (no such device, several of them, a 400)
settles the entry as refused, journaled for a human.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from automat import TypeMachineBuilder
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.automata import ignore, indexed
from fleetd.inventory.model import DeviceStatus, InventoryError
from fleetd.netbox.client import RETRY_FIRST, RETRY_MAX, NetBoxClient, NetBoxError
from fleetd.netbox.devices import detailPath, findByName, remote
from fleetd.netbox.outbox import DONE, REFUSED, SKIPPED, OutboxEntry, decide

FIRST_DELAY = RETRY_FIRST
MAX_DELAY = RETRY_MAX
MAX_CONFLICTS = 5


class PushInputs(Protocol):
    def begin(self) -> None:
        "Start writing the entry: read the device from NetBox."

    def toPatch(
        self, body: dict[str, Any], etag: str | None, leftAlone: str | None
    ) -> None:
        """
        The device was read; NetBox still lacks C{body}. C{leftAlone}: why
        the status is left as NetBox has it (the write is then journaled
        as skipped: the release's record still goes to NetBox).
        """

    def upToDate(self, state: str, outcome: str) -> None:
        "The device was read; nothing (more) is to be written."

    def patched(self) -> None:
        "NetBox accepted the PATCH."

    def changed(self) -> None:
        "The PATCH got 412: the device changed since it was read."

    def unreachable(self, reason: str) -> None:
        "NetBox is down, hung, overloaded, or refuses the token: retry later."

    def refused(self, reason: str) -> None:
        "NetBox refused the entry in a way retrying cannot fix."

    def retry(self) -> None:
        "The backoff timer fired."

    def stop(self) -> None:
        "fleetd is stopping: cancel the timer, drop late answers."


@dataclass(eq=False)
class PushCore:
    """The effects a push asks for (the worker supplies them) and its counts."""

    readDevice: Callable[[], None]
    patch: Callable[[dict[str, Any], str | None], None]
    settle: Callable[[str, str], None]
    schedule: Callable[[float], IDelayedCall]
    delay: float = FIRST_DELAY
    leftAlone: str | None = None
    conflicts: int = 0
    attempts: int = 0
    timer: IDelayedCall | None = None


builder = TypeMachineBuilder(PushInputs, PushCore)
idle = builder.state("idle")
reading = builder.state("reading")
patching = builder.state("patching")
waiting = builder.state("waiting")
settled = builder.state("settled")
stopped = builder.state("stopped")


@idle.upon(PushInputs.begin).to(reading)
def _begin(inputs: PushInputs, core: PushCore) -> None:
    core.attempts += 1
    core.readDevice()


@reading.upon(PushInputs.toPatch).to(patching)
def _toPatch(
    inputs: PushInputs,
    core: PushCore,
    body: dict[str, Any],
    etag: str | None,
    leftAlone: str | None,
) -> None:
    core.leftAlone = leftAlone
    core.patch(body, etag)


@reading.upon(PushInputs.upToDate).to(settled)
def _upToDate(inputs: PushInputs, core: PushCore, state: str, outcome: str) -> None:
    core.settle(state, outcome)


@patching.upon(PushInputs.patched).to(settled)
def _patched(inputs: PushInputs, core: PushCore) -> None:
    if core.leftAlone is not None:
        core.settle(SKIPPED, f"{core.leftAlone}; fleetd_release written")
    else:
        core.settle(DONE, "written")


@patching.upon(PushInputs.changed).to(reading)
def _changed(inputs: PushInputs, core: PushCore) -> None:
    core.conflicts += 1
    core.readDevice()


def _wait(inputs: PushInputs, core: PushCore, reason: str) -> None:
    delay, core.delay = core.delay, min(core.delay * 2, MAX_DELAY)
    core.timer = core.schedule(delay)


def _refuse(inputs: PushInputs, core: PushCore, reason: str) -> None:
    core.settle(REFUSED, reason)


for _busy in (reading, patching):
    _busy.upon(PushInputs.unreachable).to(waiting)(_wait)
    _busy.upon(PushInputs.refused).to(settled)(_refuse)


@waiting.upon(PushInputs.retry).to(reading)
def _retry(inputs: PushInputs, core: PushCore) -> None:
    core.timer = None
    core.attempts += 1
    core.readDevice()


def _cancel(inputs: PushInputs, core: PushCore) -> None:
    if core.timer is not None and core.timer.active():
        core.timer.cancel()
    core.timer = None


for _state in (idle, reading, patching, waiting, settled):
    _state.upon(PushInputs.stop).to(stopped)(_cancel)
ignore((stopped,), PushInputs.stop)
# Answers that arrive after a stop, or after the entry settled, change nothing.
ignore(
    (stopped, settled),
    PushInputs.toPatch,
    PushInputs.upToDate,
    PushInputs.patched,
    PushInputs.changed,
    PushInputs.unreachable,
    PushInputs.refused,
    PushInputs.retry,
)

PushMachine = indexed(builder.build())


class Push:
    """One outbox entry on its way to NetBox."""

    log = Logger()

    def __init__(
        self,
        entry: OutboxEntry,
        client: NetBoxClient,
        clock: IReactorTime,
        onSettled: Callable[[OutboxEntry, str, str, int, str | None], None],
        *,
        written: Callable[[], Deferred[DeviceStatus | None]] = lambda: succeed(None),
        onETag: Callable[[bool], None] = lambda present: None,
    ) -> None:
        """
        @param onSettled: called with the entry, how it settled, why, the
            attempts, and the status NetBox holds after it (when read).
        @param written: the status fleetd itself last wrote to the device
            (asked only when NetBox sends no ETag).
        @param onETag: whether the device's detail carried an ETag.
        """
        self.entry = entry
        self._client = client
        self._onSettled = onSettled
        self._written = written
        self._onETag = onETag
        self._found: str | None = None
        self.core = PushCore(
            self._read,
            self._patch,
            self._settle,
            lambda delay: clock.callLater(delay, self.machine.retry),
        )
        self.machine: PushInputs = PushMachine(self.core)
        self._path: str | None = None

    def _failure(self, failure: Failure) -> None:
        self._failed(failure.value or Exception(failure.getErrorMessage()))

    def _failed(self, error: BaseException) -> None:
        if isinstance(error, NetBoxError) and error.kind == "conflict":
            if self.core.conflicts >= MAX_CONFLICTS:
                self.machine.unreachable(f"{error} ({self.core.conflicts} times)")
            else:
                self.machine.changed()
            return
        if isinstance(error, NetBoxError) and error.kind in ("invalid", "not-found"):
            self.machine.refused(str(error))
        elif isinstance(error, InventoryError) and error.kind != "unavailable":
            self.machine.refused(str(error))
        elif isinstance(error, NetBoxError | InventoryError):
            self.log.warn(
                "netbox.push.retry {entry} {device}: {reason}",
                entry=self.entry.id,
                device=self.entry.device,
                reason=str(error),
            )
            self.machine.unreachable(str(error))
        else:
            self.log.failure("netbox.push.bug", failure=Failure(error))
            self.machine.unreachable(repr(error))

    def _read(self) -> None:
        async def read() -> None:
            data = await findByName(self._client, self.entry.device)
            if data is None:
                raise InventoryError(
                    f"NetBox has no device named {self.entry.device}", "not-found"
                )
            self._path = detailPath(remote(data).id)
            detail = await self._client.detail(self._path)
            current = remote(detail.data)
            self._found = current.status
            guarded = detail.etag is not None
            self._onETag(guarded)
            written = None if guarded else await self._written()
            decision = decide(self.entry, current, guarded=guarded, written=written)
            if decision.body:
                self.machine.toPatch(decision.body, detail.etag, decision.leftAlone)
            elif decision.leftAlone is not None:
                self.machine.upToDate(SKIPPED, decision.leftAlone)
            else:
                self.machine.upToDate(DONE, "already so")

        Deferred.fromCoroutine(read()).addErrback(self._failure)

    def _patch(self, body: dict[str, Any], etag: str | None) -> None:
        assert self._path is not None
        d = self._client.patch(self._path, body, etag)
        d.addCallbacks(self._patchedWith, self._failure)

    def _patchedWith(self, answer: dict[str, Any]) -> None:
        try:
            self._found = remote(answer).status or self._found
        except InventoryError:
            pass  # written all the same; the status is as last read
        self.machine.patched()

    def _settle(self, state: str, outcome: str) -> None:
        self._onSettled(self.entry, state, outcome, self.core.attempts, self._found)
