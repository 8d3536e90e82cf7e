"""
One API step for one row (L{fleetd.tinkerbell.store}), and what it came
to: the row's next state and the journal entry that records it, as a
L{Step} the caller commits [J1]. Each step reads before it writes, so a
step run again after a restart (its answer lost, or its record not
committed) finds what the first run did and never makes a second object:

  - create a Workflow: absent, create it; there and fleetd's for this
    device and run, take it as made; there and anything else, refused;
  - delete a Workflow: absent, nothing to do; fleetd's and the uid it
    made, delete it (with that uid as the precondition); else left alone;
  - apply the Hardware: absent, create it; fleetd's, update it (its
    other fields kept); anything else, refused;
  - turn network boot off: fleetd's, set C{allowPXE} and C{allowWorkflow}
    false; absent or not fleetd's, nothing.

A 409 (the object changed between the read and the write) reads again,
a few times; a 422 or 400 (the API refuses the object) ends the row as
C{failed}. Every other L{KubeError} is raised: the caller retries later.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from fleetd.k8s.errors import Conflict, Invalid, KubeUnavailable
from fleetd.store.entries import Entry
from fleetd.store.fields import MAX_STRING
from fleetd.tinkerbell import objects
from fleetd.tinkerbell.api import TinkerbellAPI
from fleetd.tinkerbell.store import (
    ABSENT,
    APPLIED,
    CREATED,
    DELETED,
    DISOWNED,
    FAILED,
    NETBOOT_OFF,
    REFUSED,
    HardwareRecord,
    WorkflowRecord,
    moved,
)

ATTEMPTS = 5  # reads again after a 409
ACTOR = "fleetd"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Step:
    """What one step came to: a row's next state and its entry."""

    entry: Entry
    workflow: WorkflowRecord | None = None
    hardware: HardwareRecord | None = None


def _entry(event: str, device: str, run: str | None, **fields: Any) -> Entry:
    return Entry(event, ACTOR, device, run, fields)


def _problem(error: Exception) -> str:
    return str(error)[:MAX_STRING]


async def _again(attempt: Callable[[], Awaitable[_T]], what: str) -> _T:
    """C{attempt()}, read-modify-write, again after each 409."""
    for _ in range(ATTEMPTS):
        try:
            return await attempt()
        except Conflict:
            continue
    raise KubeUnavailable(f"{what}: still conflicting after {ATTEMPTS} attempts")


def _failed(record: WorkflowRecord | HardwareRecord, error: Invalid, at: float) -> Step:
    """The API refused C{record}'s object (422, 400): the row ends C{failed}."""
    failed = replace(record, state=FAILED, changed_at=at, problem=_problem(error))
    workflow = failed if isinstance(failed, WorkflowRecord) else None
    hardware = failed if isinstance(failed, HardwareRecord) else None
    entry = _entry(
        "tinkerbell.object-failed",
        failed.device,
        None if workflow is None else workflow.run,
        **{"hardware" if workflow is None else "workflow": failed.path},
        problem=failed.problem,
    )
    return Step(entry, workflow=workflow, hardware=hardware)


async def createWorkflow(
    api: TinkerbellAPI, record: WorkflowRecord, clock: Callable[[], float]
) -> Step:
    """Make C{record}'s Workflow, unless it is there already."""
    wanted = record.manifest()

    async def attempt() -> Step:
        found = await api.get("workflows", record.name)
        adopted = found is not None
        if found is None:
            found = await api.create("workflows", wanted)
        elif not objects.owned(found, record.device, record.run):
            refused = moved(
                record,
                REFUSED,
                clock(),
                problem=f"workflow {record.path} exists and is not fleetd's",
            )
            entry = _entry(
                "tinkerbell.object-refused",
                record.device,
                record.run,
                workflow=record.path,
                reason="name taken by an object fleetd did not make",
            )
            return Step(entry, workflow=refused)
        made = moved(
            record,
            CREATED,
            clock(),
            uid=objects.uidOf(found),
            digest=objects.specDigest(found),
            problem=None,
        )
        entry = _entry(
            "tinkerbell.workflow-created",
            record.device,
            record.run,
            workflow=record.path,
            template=wanted["spec"]["templateRef"],
            hardware=f"{record.namespace}/{record.device}",
            adopted=adopted,
        )
        return Step(entry, workflow=made)

    try:
        return await _again(attempt, f"create workflow {record.path}")
    except Invalid as e:
        return _failed(record, e, clock())


async def deleteWorkflow(
    api: TinkerbellAPI, record: WorkflowRecord, clock: Callable[[], float]
) -> Step:
    """Delete C{record}'s Workflow: the one fleetd made, if it is there."""

    async def attempt() -> Step:
        found = await api.get("workflows", record.name)
        if found is not None and not objects.owned(found, record.device, record.run):
            left = moved(record, DISOWNED, clock())
            entry = _entry(
                "tinkerbell.object-left-alone",
                record.device,
                record.run,
                workflow=record.path,
                reason="not fleetd's: its labels are not fleetd's for this run",
            )
            return Step(entry, workflow=left)
        if found is not None and record.uid and objects.uidOf(found) != record.uid:
            left = moved(record, DISOWNED, clock())
            entry = _entry(
                "tinkerbell.object-left-alone",
                record.device,
                record.run,
                workflow=record.path,
                reason="another object has its name now",
            )
            return Step(entry, workflow=left)
        deleted = found is not None and await api.delete(
            "workflows", record.name, objects.uidOf(found)
        )
        done = moved(record, DELETED if deleted else ABSENT, clock())
        entry = _entry(
            "tinkerbell.workflow-deleted",
            record.device,
            record.run,
            workflow=record.path,
            found=deleted,
        )
        return Step(entry, workflow=done)

    return await _again(attempt, f"delete workflow {record.path}")


def _refusedHardware(record: HardwareRecord, at: float, why: str) -> Step:
    refused = replace(record, state=REFUSED, changed_at=at, problem=why)
    entry = _entry(
        "tinkerbell.object-refused",
        record.device,
        None,
        hardware=record.path,
        reason=why,
    )
    return Step(entry, hardware=refused)


async def applyHardware(
    api: TinkerbellAPI, record: HardwareRecord, clock: Callable[[], float]
) -> Step:
    """Create or update the device's Hardware: its MACs, netboot allowed."""
    device, macs = record.device, record.macs

    async def attempt() -> Step:
        found = await api.get("hardware", device)
        if found is None:
            wanted = objects.hardware(api.namespace, device, macs, record.address)
            await api.create("hardware", wanted)
            created, changed = True, True
        elif not objects.owned(found, device):
            return _refusedHardware(
                record, clock(), f"hardware {record.path} exists and is not fleetd's"
            )
        else:
            wanted = objects.updatedHardware(found, device, macs, record.address)
            created, changed = False, wanted != found
            if changed:
                await api.replace("hardware", wanted)
        applied = replace(record, state=APPLIED, changed_at=clock(), problem=None)
        entry = _entry(
            "tinkerbell.hardware-applied",
            device,
            None,
            hardware=record.path,
            macs=" ".join(macs),
            created=created,
            changed=changed,
        )
        return Step(entry, hardware=applied)

    try:
        return await _again(attempt, f"apply hardware {record.path}")
    except Invalid as e:
        return _failed(record, e, clock())


async def turnNetbootOff(
    api: TinkerbellAPI, record: HardwareRecord, clock: Callable[[], float]
) -> Step:
    """Set C{allowPXE} and C{allowWorkflow} false on fleetd's Hardware."""
    device = record.device

    async def attempt() -> Step:
        found = await api.get("hardware", device)
        if found is not None and not objects.owned(found, device):
            left = replace(record, state=DISOWNED, changed_at=clock())
            entry = _entry(
                "tinkerbell.object-left-alone",
                device,
                None,
                hardware=record.path,
                reason="not fleetd's: network boot left as it is",
            )
            return Step(entry, hardware=left)
        if found is not None and not objects.netbootIsOff(found):
            await api.replace("hardware", objects.netbootOff(found))
        state = NETBOOT_OFF if found is not None else ABSENT
        done = replace(record, state=state, changed_at=clock(), problem=None)
        entry = _entry(
            "tinkerbell.hardware-netboot-off",
            device,
            None,
            hardware=record.path,
            found=found is not None,
        )
        return Step(entry, hardware=done)

    return await _again(attempt, f"turn network boot off on {record.path}")


def workflowBody(obj: dict[str, Any]) -> str:
    """A Workflow as a row's C{body}."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
