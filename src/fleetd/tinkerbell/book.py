"""
The book of Tinkerbell's objects: the rows (L{fleetd.tinkerbell.store}) in
memory, and the changes that record intents [J1].

A provision records, in the transaction that starts its runs
(L{fleetd.runs.provision.IRunObjects}): for each device of a class of
C{[tinkerbell.classes]}, the Hardware to apply and the run's Workflow to
create; the device's earlier Workflows still made or to be made are to
be deleted first (C{superseded}). A retirement records, in its own
transaction (L{fleetd.fleet.retire.IRetirementPart}), the deletion of the
device's Workflows and network boot off on its Hardware. Every intent is
journaled (C{tinkerbell.*-requested}) with the change; memory follows the
commit; the API calls come after (L{fleetd.tinkerbell.worker}).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetd.config.tinkerbell import TinkerbellSettings
from fleetd.inventory.model import Device
from fleetd.store.db import Database
from fleetd.store.entries import Entry
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.tinkerbell import objects
from fleetd.tinkerbell.store import (
    APPLY,
    CHANGED,
    CREATE,
    CREATED,
    DELETE,
    HARDWARE_PENDING,
    LOST_STATES,
    OFF,
    PENDING,
    HardwareRecord,
    Loaded,
    WorkflowRecord,
    getHardware,
    putHardware,
    putWorkflow,
    workflowsOf,
)
from fleetd.tinkerbell.work import workflowBody

DELETABLE = frozenset({CREATE, CREATED, CHANGED})


@dataclass(frozen=True)
class Recorded:
    """The rows one change wrote, for memory once it committed."""

    workflows: list[WorkflowRecord] = field(default_factory=list)
    hardware: list[HardwareRecord] = field(default_factory=list)

    @property
    def devices(self) -> list[str]:
        found = [r.device for r in self.workflows] + [r.device for r in self.hardware]
        return list(dict.fromkeys(found))


class Book:
    """Every row of interest, by Workflow key and by device."""

    def __init__(self, settings: TinkerbellSettings, journal: AsyncJournal) -> None:
        self.settings = settings
        self.journal = journal
        self.workflows: dict[tuple[str, str], WorkflowRecord] = {}
        self.hardware: dict[str, HardwareRecord] = {}
        self.seen: dict[tuple[str, str], str] = {}  # the watch's last state
        self.loaded = False

    def load(self, loaded: Loaded) -> None:
        for record in loaded.workflows:
            self.workflows[record.key] = record
        for hardware in loaded.hardware:
            self.hardware[hardware.device] = hardware
        self.loaded = True

    def apply(self, recorded: Recorded) -> None:
        """A change committed: memory follows."""
        for record in recorded.workflows:
            self.workflows[record.key] = record
        for hardware in recorded.hardware:
            self.hardware[hardware.device] = hardware

    # Queries

    def workflowsOf(self, device: str) -> list[WorkflowRecord]:
        found = [r for r in self.workflows.values() if r.device == device]
        return sorted(found, key=lambda r: r.created_at)

    def current(self, device: str) -> WorkflowRecord | None:
        found = [r for r in self.workflowsOf(device) if r.current]
        return found[-1] if found else None

    def pending(self, device: str) -> WorkflowRecord | HardwareRecord | None:
        """The next row owing an API call: deletions, the Hardware, then
        creations (a Workflow names its Hardware)."""
        rows = self.workflowsOf(device)
        for record in rows:
            if record.state == DELETE:
                return record
        hardware = self.hardware.get(device)
        if hardware is not None and hardware.state in HARDWARE_PENDING:
            return hardware
        for record in rows:
            if record.state == CREATE:
                return record
        return None

    def devicesPending(self) -> list[str]:
        devices = {r.device for r in self.workflows.values() if r.state in PENDING}
        devices |= {
            h.device for h in self.hardware.values() if h.state in HARDWARE_PENDING
        }
        return sorted(devices)

    def pendingCount(self) -> int:
        count = sum(1 for r in self.workflows.values() if r.state in PENDING)
        return count + sum(
            1 for h in self.hardware.values() if h.state in HARDWARE_PENDING
        )

    def lost(self, readyRun: Callable[[str], str | None]) -> list[str]:
        """The devices whose current Workflow someone else deleted or
        changed before its end, and whose run still waits for its node."""
        return sorted(
            r.device
            for r in self.workflows.values()
            if r.current
            and r.state in LOST_STATES
            and not _ended(self.seen.get(r.key, r.seen))
            and readyRun(r.device) == r.run
        )

    # Changes, on the database thread, in the caller's transaction

    def recordProvision(
        self,
        db: Database,
        journal: Recorder,
        started: Sequence[tuple[Device, str]],
        actor: str,
        at: float,
    ) -> Recorded:
        """The intents of new runs (see the module docstring)."""
        recorded = Recorded()
        namespace = self.settings.namespace
        for device, run in started:
            cls = self.settings.forClass(device.device_class)
            if cls is None or not device.macs:
                continue
            name = device.name
            self._endWorkflows(db, journal, name, actor, at, "superseded", recorded)
            hardware = HardwareRecord(name, namespace, APPLY, device.macs, None)
            hardware = replace(hardware, changed_at=at)
            putHardware(db, hardware)
            recorded.hardware.append(hardware)
            journal(
                "tinkerbell.hardware-apply-requested",
                actor=actor,
                device=name,
                fields={"hardware": hardware.path, "macs": " ".join(device.macs)},
            )
            body = objects.workflow(namespace, name, run, device.macs[0], cls)
            record = WorkflowRecord(
                namespace=namespace,
                name=body["metadata"]["name"],
                device=name,
                run=run,
                state=CREATE,
                current=True,
                body=workflowBody(body),
                created_at=at,
                changed_at=at,
            )
            putWorkflow(db, record)
            recorded.workflows.append(record)
            journal(
                "tinkerbell.workflow-create-requested",
                actor=actor,
                device=name,
                run=run,
                fields={
                    "workflow": record.path,
                    "template": cls.template,
                    "image": cls.image,
                    "agent": device.macs[0],
                },
            )
        return recorded

    def recordRetirement(
        self, db: Database, journal: Recorder, device: str, actor: str, at: float
    ) -> Recorded:
        """A retirement's intents: its Workflows deleted, network boot off."""
        recorded = Recorded()
        self._endWorkflows(db, journal, device, actor, at, "retired", recorded)
        hardware = getHardware(db, device) or HardwareRecord(
            device, self.settings.namespace, OFF, ()
        )
        hardware = replace(hardware, state=OFF, changed_at=at, problem=None)
        putHardware(db, hardware)
        recorded.hardware.append(hardware)
        journal(
            "tinkerbell.hardware-netboot-off-requested",
            actor=actor,
            device=device,
            fields={"hardware": hardware.path, "reason": "retired"},
        )
        return recorded

    def _endWorkflows(
        self,
        db: Database,
        journal: Recorder,
        device: str,
        actor: str,
        at: float,
        reason: str,
        recorded: Recorded,
    ) -> None:
        for record in workflowsOf(db, device):
            if not record.current and record.state not in DELETABLE:
                continue
            ended = replace(record, current=False, changed_at=at)
            if record.state in DELETABLE:
                ended = replace(ended, state=DELETE)
                journal(
                    "tinkerbell.workflow-delete-requested",
                    actor=actor,
                    device=device,
                    run=record.run,
                    fields={"workflow": record.path, "reason": reason},
                )
            putWorkflow(db, ended)
            recorded.workflows.append(ended)

    async def commit(
        self,
        workflows: Iterable[WorkflowRecord] = (),
        hardware: Iterable[HardwareRecord] = (),
        entries: Iterable[Entry] = (),
    ) -> None:
        """Rows and their entries in one transaction [J1]; memory after."""
        recorded = Recorded(list(workflows), list(hardware))
        written = list(entries)

        def change(db: Database, journal: Recorder) -> None:
            for record in recorded.workflows:
                putWorkflow(db, record)
            for hardware in recorded.hardware:
                putHardware(db, hardware)
            for entry in written:
                journal.add(entry)

        await self.journal.change(change)
        self.apply(recorded)


def _ended(state: str | None) -> bool:
    return state is not None and state.upper().removeprefix("STATE_") in (
        "POST",
        "SUCCESS",
    )


def viewOf(book: Book, device: str) -> dict[str, Any] | None:
    """C{device}'s objects as C{fleetctl status} shows them (L{None}: none)."""
    rows = book.workflowsOf(device)
    record = book.current(device) or (rows[-1] if rows else None)
    hardware = book.hardware.get(device)
    if record is None and hardware is None:
        return None
    workflow = None
    if record is not None:
        workflow = {
            "name": record.path,
            "run": record.run,
            "made": record.state,
            "state": book.seen.get(record.key, record.seen),
            "problem": record.problem,
        }
    return {
        "workflow": workflow,
        "hardware": None
        if hardware is None
        else {
            "name": hardware.path,
            "made": hardware.state,
            "problem": hardware.problem,
        },
    }
