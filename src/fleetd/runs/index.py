"""
The boot path's index of runs, and its decisions.

Lookups on the boot listener are synchronous and in memory (a dict from
code digest to run), so deciding and marking a delivery happens in one
reactor turn: concurrent requests for one code cannot both be served [C1].
Superseded history stays in the database and is looked up only when a
code is not found in memory (L{BootIndex.retired}).

The boot listener asks one question per request: L{BootIndex.decide} for
a code, L{BootIndex.decideGrant} for a device-flow grant [F2]. The
answer names the run and, when delivering, carries the body; the run is
marked served in the vault before it returns [C1].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from prometheus_client import Counter
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from fleetd.runs.codes import codeDigest, wellFormedCode
from fleetd.runs.identities import IdentityIndex
from fleetd.runs.issued import IssuedDigests
from fleetd.runs.machine import Outcome
from fleetd.runs.run import Run
from fleetd.runs.store import RunRecord, latestRun, latestRuns, retiredRun
from fleetd.runs.vaultnames import configName
from fleetd.store.runner import IRunner
from fleetd.vault import IVault, VaultError


class Miss(Enum):
    """A boot request that reaches no run's machine (the values are counted)."""

    UNKNOWN = "unknown"  # no such code, or no run for the grant's device
    WRONG_MACHINE = "wrong_machine"  # the run is another machine's
    HISTORY = "history"  # not a current run: ask L{BootIndex.retired}


class Decision(NamedTuple):
    """
    What the boot path gets for one request: the verdict, the run it
    concerns (if any), and the body when delivering (the run is marked
    served then). Immutable; a named tuple because one is made per request
    of the boot storm, and that is the cheapest immutable record there is.
    """

    verdict: Outcome | Miss
    run: Run | None = None
    body: bytes | None = None


# The answers that concern no run are the same every time.
_UNKNOWN = Decision(Miss.UNKNOWN)
_HISTORY = Decision(Miss.HISTORY)  # superseded history is not in memory
_ELSEWHERE = Decision(Miss.WRONG_MACHINE)


@dataclass(frozen=True)
class RunView:
    """A run as people see it (C{fleetctl status}): no code, no body."""

    record: RunRecord
    state: str


class BootIndex:
    """Every current run, by code digest, id and device; the boot decisions."""

    log = Logger()

    def __init__(
        self,
        *,
        vault: IVault,
        runner: IRunner,
        codeKey: bytes,
        vaultFailures: Counter,
    ) -> None:
        self.vault = vault
        self.runner = runner
        self.codeKey = codeKey
        self.vaultFailures = vaultFailures
        self.runs: dict[str, Run] = {}
        self.byDigest: dict[str, Run] = {}
        self.currentRuns: dict[str, Run] = {}  # device -> its current run
        self.identities = IdentityIndex()
        self.issued = IssuedDigests()
        self.loaded = False

    def add(self, run: Run) -> Run:
        record = run.record
        self.runs[record.id] = run
        self.byDigest[record.digest] = run
        if record.superseded_by is None:
            self.currentRuns[record.device] = run
        return run

    def supersededCommitted(self, superseded: list[RunRecord]) -> None:
        """The commit that superseded these runs went through: memory follows."""
        for old in superseded:
            run = self.runs.get(old.id)
            if run is not None:
                run.record = old
                if self.currentRuns.get(old.device) is run:
                    self.currentRuns.pop(old.device)
                run.machine.supersede()

    # The boot path

    def decide(
        self,
        code: str,
        uuid: str | None,
        serial: str | None,
        peer: str,
    ) -> Decision:
        """
        A node at C{peer} with C{uuid} and C{serial} asks for the
        configuration of C{code}: the run must be that machine's (the
        inventory's uuid, and its serial case-insensitively).
        """
        if not wellFormedCode(code):
            return _UNKNOWN
        run = self.byDigest.get(codeDigest(self.codeKey, code))
        if run is None:
            return _HISTORY
        known = self.identities.get(run.record.device)
        if (
            known is None
            or (uuid or "").strip().lower() != known[0]
            # Serials are unique case-insensitively, as in the inventory.
            or (serial or "").strip().casefold() != known[1].casefold()
        ):
            return Decision(Miss.WRONG_MACHINE, run)
        return self._answer(run, peer)

    def decideGrant(
        self,
        device: str,
        delivered: str | None,
        inventory: tuple[str, str] | None,
        peer: str,
    ) -> Decision:
        """
        [F2] A device-flow grant for C{device}, approved while the inventory
        held C{inventory} for it: the run it delivered already
        (C{delivered}), else the device's run that is ready now, else its
        latest run as it stands.
        """
        if self.identities.get(device) != inventory:
            return _ELSEWHERE
        runId = delivered or self.readyRun(device)
        if runId is None:  # no ready run: answer as the latest one stands
            current = self.currentRuns.get(device)
            runId = None if current is None else current.record.id
        run = None if runId is None else self.runs.get(runId)
        if run is None:
            return _UNKNOWN
        return self._answer(run, peer)

    def request(self, run: Run, peer: str) -> tuple[Outcome, bytes | None]:
        """
        A node at C{peer} asks for C{run}'s configuration: decide, and when
        delivering, mark the vault before returning the body.
        """
        verdict, _, body = self._answer(run, peer)
        assert isinstance(verdict, Outcome)  # a run's machine answered
        return verdict, body

    def _answer(self, run: Run, peer: str) -> Decision:
        """L{request}, as the boot path's decision."""
        try:
            outcome = run.machine.request(peer)
        except VaultError:
            # The mark could not be written (tmpfs full?): nothing was sent,
            # nothing happened that the journal must know of.
            self.vaultFailures.labels("served-mark").inc()
            self.log.error(
                "runs.mark.failed {run}: the vault refused the served mark",
                run=run.record.id,
            )
            run.machine.markFailed()
            return Decision(Outcome.UNAVAILABLE, run)
        if outcome is not Outcome.DELIVER:
            return Decision(outcome, run)
        body = self.vault.get(configName(run.record.id))
        if body is None:  # the vault lost it under us
            run.machine.configVanished(peer)
            return Decision(Outcome.LOST, run)
        return Decision(outcome, run, body)

    def finished(self, run: Run, complete: bool) -> None:
        """
        The operating system has the whole response (C{complete}), or the
        connection failed before it did.
        """
        if complete:
            run.machine.sent()
        else:
            run.machine.aborted()

    def retired(self, code: str) -> Deferred[RunRecord | None]:
        """
        The superseded run a code belonged to, from the database; a code
        fleetd never issued is known not to be one without asking it.
        """
        digest = codeDigest(self.codeKey, code)
        if not self.issued.mayHold(digest):
            return succeed(None)
        return self.runner.run(lambda db: retiredRun(db, digest))

    # Lookups

    def byCode(self, code: str) -> Run | None:
        return self.byDigest.get(codeDigest(self.codeKey, code))

    def byId(self, run: str) -> Run | None:
        return self.runs.get(run)

    def current(self, device: str) -> RunRecord | None:
        run = self.currentRuns.get(device)
        return None if run is None else run.record

    def currentRun(self, device: str) -> Run | None:
        """C{device}'s current run, for the device flow's grants [F2]."""
        return self.currentRuns.get(device)

    async def view(self, device: str) -> RunView | None:
        """C{device}'s latest run and its state, for people."""
        run = self.currentRuns.get(device)
        if run is not None:
            return RunView(run.record, run.describe())
        record = await self.runner.run(lambda db: latestRun(db, device))
        return None if record is None else RunView(record, "superseded")

    async def views(self, devices: Sequence[str]) -> dict[str, RunView]:
        """
        L{view} of each of C{devices} that has a run: the current ones from
        memory, the others' latest (superseded) in one database read.
        """
        found: dict[str, RunView] = {}
        others: list[str] = []
        for device in devices:
            run = self.currentRuns.get(device)
            if run is None:
                others.append(device)
            else:
                found[device] = RunView(run.record, run.describe())
        if others:
            records = await self.runner.run(lambda db: latestRuns(db, others))
            for device, record in records.items():
                found[device] = RunView(record, "superseded")
        return found

    def identity(self, device: str) -> tuple[str, str] | None:
        """The (uuid, serial) the inventory holds for C{device}."""
        return self.identities.get(device)

    def deviceByIdentity(self, uuid: str, serial: str) -> str | None:
        """The device with this uuid and serial, if any (IRunLookup)."""
        return self.identities.deviceByIdentity(uuid, serial)

    def deviceBySerial(self, serial: str) -> str | None:
        """The device with this serial, if any (attest's L{KnownDevices})."""
        return self.identities.deviceBySerial(serial)

    def deviceByUUID(self, uuid: str) -> str | None:
        """The device with this uuid, if any (attest's L{KnownDevices})."""
        return self.identities.deviceByUUID(uuid)

    def readyRun(self, device: str) -> str | None:
        """The device's run that a request now would get (IRunLookup)."""
        run = self.currentRuns.get(device)
        if run is None or not run.deliverable():
            return None
        return run.record.id

    def configDelivered(self, run: str) -> bool:
        """Whether C{run}'s configuration went out (it counts as consumed)."""
        found = self.runs.get(run)
        return found is not None and found.configDelivered()
