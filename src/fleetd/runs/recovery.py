"""
Restart recovery: every current run's state rebuilt from the database,
the vault and the inventory, and what a crash left in the vault settled.

A served mark means the body may have gone out: the run is consumed,
whatever else is there [C1], and a delivery not recorded before fleetd
stopped is recorded now. Files no current run accounts for are removed,
after the deliveries their marks stand for are recorded [J1].
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred, FirstError, gatherResults
from twisted.python.failure import Failure

from fleetd.inventory.model import IInventory
from fleetd.runs.alerts import AlertTracker, loadAlerts
from fleetd.runs.index import BootIndex
from fleetd.runs.run import Run, RunCore
from fleetd.runs.store import RunRecord, issuedDigests, loadRuns
from fleetd.runs.vaultnames import RUN_FILE, configName, readServed, servedName
from fleetd.store.runner import IRunner


async def recover(
    core: RunCore,
    index: BootIndex,
    runner: IRunner,
    inventory: IInventory,
    alerts: AlertTracker,
    checkVault: Callable[[], None] | None = None,
) -> int:
    """
    Fill C{index} with every current run; how many are ready.

    @param checkVault: checks the vault's entries (the daemon's vault is
        opened unchecked, L{fleetd.vault.store.DirectoryVault.inspect});
        called while the database reads, before the vault is asked for a
        name. The runs are restored while the rest is read; the boot path
        waits for the whole load (L{BootIndex.loaded}).
    """
    # Every read is asked for at once: the database thread answers them in
    # turn while this thread checks the vault (100,000 lstats at 50,000
    # runs) and then restores the runs while the rest is read.
    first = _gather([inventory.releasedRuns(), runner.run(loadRuns)])
    rest = _gather(
        [runner.run(issuedDigests), inventory.identities(), runner.run(loadAlerts)]
    )
    try:
        if checkVault is not None:
            checkVault()
        released, records = await first
        ready = _restore(core, index, records, released)
    except BaseException:
        rest.addErrback(lambda _: None)  # the first failure is the one
        raise
    index.issued, identities, alertRows = await rest
    index.identities.restore(identities)
    for name, kind, first_, last in alertRows:
        alerts.restore(name, kind, first_, last)
    strays = _strayFiles(core, index)
    _recordStrayMarks(core, index, strays)
    _dropOrphans(core, index, strays)
    return ready


def _gather(reads: list[Deferred[Any]]) -> Deferred[list[Any]]:
    """All of C{reads}, or the first failure itself (not L{FirstError})."""
    return gatherResults(reads, consumeErrors=True).addErrback(_firstError)


def _restore(
    core: RunCore, index: BootIndex, records: list[RunRecord], released: set[str]
) -> int:
    """Add every current run to C{index} in its state; how many are ready."""
    vault, releaser = core.vault, core.releaser
    ready = 0
    for record in records:
        run = index.add(Run(core, record))
        if servedName(record.id) in vault:
            # The mark reached the vault, so the body may have gone out:
            # consumed, whatever else is there [C1].
            run.machine.restoreConsumed()
            if record.id not in released:
                # Delivered, but not recorded before we stopped.
                releaser.release(
                    run.servedRecord(), onRecorded=run.dropConfig, recovering=True
                )
            else:
                run.dropConfig()
        elif record.id in released:
            run.machine.restoreConsumed()
        elif configName(record.id) in vault:
            run.restoredReady()
            ready += record.superseded_by is None
        else:
            run.machine.restoreLost()
    return ready


def _firstError(f: Failure) -> Failure:
    """The failure itself, not L{FirstError}: the load's reason names it."""
    f.trap(FirstError)
    first = f.value
    assert isinstance(first, FirstError)
    sub: Failure = first.subFailure
    return sub


def _strayFiles(core: RunCore, index: BootIndex) -> set[str]:
    """
    The vault's names that no loaded run accounts for, in one pass:
    at start-up every name is looked at once (100,000 at 50,000 runs),
    and nearly all of them belong to a run.
    """
    runs = index.runs
    return {name for name in core.vault if name.partition(".")[0] not in runs}


def _recordStrayMarks(core: RunCore, index: BootIndex, names: set[str]) -> None:
    """
    Served marks of runs that are no longer current: fleetd stopped
    after the provision that superseded them committed, before their
    delivery was recorded. Record them (as superseded, released to
    nobody) before their files go.
    """
    for name in sorted(names):
        match = RUN_FILE.match(name)
        if match is None or match.group(2) != "served":
            continue
        run = match.group(1)
        if run in index.runs:
            continue
        served = readServed(core.vault, run)
        if served is None:
            continue
        names.discard(name)
        core.releaser.release(
            served,
            superseded=True,
            recovering=True,
            onRecorded=partial(core.vault.delete, name),
        )


def _dropOrphans(core: RunCore, index: BootIndex, names: set[str]) -> None:
    """
    Remove run files no current run accounts for: a crash between
    rendering into the vault and storing the run, or between a
    supersede's commit and its file removal, leaves them behind.
    """
    for name in names:
        match = RUN_FILE.match(name)
        if match is not None and match.group(1) not in index.runs:
            core.vault.delete(name)
            core.log.warn("runs.vault.orphan-removed {name}", name=name)
