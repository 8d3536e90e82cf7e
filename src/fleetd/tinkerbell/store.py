"""
The rows behind Tinkerbell's objects (migration 13 in
L{fleetd.store.migrations}): one per run's Workflow, one per device's
Hardware. A row's C{state} is fleetd's intent, recorded in the change
that asks for it before any API call, then what the API did:

    Workflow:  create --> created --> delete --> deleted
                  |          |           \\--> absent    (not there)
                  |          |           \\--> disowned  (not fleetd's now)
                  |          +--> lost      (deleted by someone else first)
                  |          +--> changed   (edited by someone else; may
                  |          |               still be deleted: --> delete)
                  |          +--> disowned  (its labels taken off)
                  |          +--> removed   (deleted by someone else after
                  |                          its end: nothing was lost)
                  +--> delete (superseded or retired before it was made)
                  +--> refused  (its name is an object fleetd did not make)
                  +--> failed   (the API refused the object, 422)

    Hardware:  apply --> applied --> off --> netboot-off
                 |                     \\--> absent
                 +--> refused (not fleetd's), failed (422)

C{current} marks the Workflow of the device's current run; a new
provision or a retirement clears it on the older ones. C{body} is the
Workflow fleetd means to create (no secret is in it); C{uid} and
C{digest} (of its spec) are what the API made; C{seen} the last
C{status.state} the watch showed when the row ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from fleetd.store.db import Database

# Workflow states
CREATE, CREATED, DELETE = "create", "created", "delete"
DELETED, ABSENT, LOST, CHANGED = "deleted", "absent", "lost", "changed"
DISOWNED, REMOVED, REFUSED, FAILED = "disowned", "removed", "refused", "failed"
PENDING = frozenset({CREATE, DELETE})  # an API call is owed
# Reported to the owner: fleetd made it, someone else deleted or changed it.
LOST_STATES = frozenset({LOST, CHANGED, DISOWNED})

# Hardware states
APPLY, APPLIED, OFF, NETBOOT_OFF = "apply", "applied", "off", "netboot-off"
HARDWARE_PENDING = frozenset({APPLY, OFF})


@dataclass(frozen=True)
class WorkflowRecord:
    namespace: str
    name: str
    device: str
    run: str
    state: str
    current: bool
    body: str  # the Workflow to create, as JSON
    uid: str | None = None
    digest: str | None = None
    seen: str | None = None
    problem: str | None = None
    created_at: float = 0.0
    changed_at: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.name}"

    def manifest(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.body)
        return found


@dataclass(frozen=True)
class HardwareRecord:
    device: str
    namespace: str
    state: str
    macs: tuple[str, ...]
    address: str | None = None
    problem: str | None = None
    changed_at: float = 0.0

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.device}"


_WORKFLOW = (
    "namespace, name, device, run, state, current, body, uid, digest, seen,"
    " problem, created_at, changed_at"
)
_HARDWARE = "device, namespace, state, macs, address, problem, changed_at"


def _workflow(row: Any) -> WorkflowRecord:
    values = list(row)
    values[5] = bool(values[5])
    return WorkflowRecord(*values)


def _hardware(row: Any) -> HardwareRecord:
    device, namespace, state, macs, address, problem, at = row
    return HardwareRecord(
        device, namespace, state, tuple(macs.split()), address, problem, at
    )


def putWorkflow(db: Database, record: WorkflowRecord) -> None:
    """Insert or replace C{record} (its state, as of this change)."""
    db.execute(
        f"INSERT OR REPLACE INTO tinkerbell_workflows ({_WORKFLOW})"  # noqa: S608
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.namespace,
            record.name,
            record.device,
            record.run,
            record.state,
            int(record.current),
            record.body,
            record.uid,
            record.digest,
            record.seen,
            record.problem,
            record.created_at,
            record.changed_at,
        ),
    )


def putHardware(db: Database, record: HardwareRecord) -> None:
    db.execute(
        f"INSERT OR REPLACE INTO tinkerbell_hardware ({_HARDWARE})"  # noqa: S608
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            record.device,
            record.namespace,
            record.state,
            " ".join(record.macs),
            record.address,
            record.problem,
            record.changed_at,
        ),
    )


def workflowsOf(db: Database, device: str) -> list[WorkflowRecord]:
    """C{device}'s Workflow rows, oldest first."""
    rows = db.execute(
        f"SELECT {_WORKFLOW} FROM tinkerbell_workflows"  # noqa: S608
        " WHERE device = ? ORDER BY created_at, rowid",
        (device,),
    ).fetchall()
    return [_workflow(r) for r in rows]


def getWorkflow(db: Database, namespace: str, name: str) -> WorkflowRecord | None:
    row = db.execute(
        f"SELECT {_WORKFLOW} FROM tinkerbell_workflows"  # noqa: S608
        " WHERE namespace = ? AND name = ?",
        (namespace, name),
    ).fetchone()
    return None if row is None else _workflow(row)


def getHardware(db: Database, device: str) -> HardwareRecord | None:
    row = db.execute(
        f"SELECT {_HARDWARE} FROM tinkerbell_hardware WHERE device = ?",  # noqa: S608
        (device,),
    ).fetchone()
    return None if row is None else _hardware(row)


@dataclass(frozen=True)
class Loaded:
    """What a start needs: the Workflow rows still of interest (pending,
    or current, or made and not yet ended) and every Hardware row."""

    workflows: list[WorkflowRecord]
    hardware: list[HardwareRecord]


def loadRows(db: Database) -> Loaded:
    rows = db.execute(
        f"SELECT {_WORKFLOW} FROM tinkerbell_workflows"  # noqa: S608
        " WHERE current = 1 OR state IN ('create', 'delete', 'created', 'changed')"
        " ORDER BY created_at, rowid"
    ).fetchall()
    hardware = db.execute(
        f"SELECT {_HARDWARE} FROM tinkerbell_hardware ORDER BY device"  # noqa: S608
    ).fetchall()
    return Loaded([_workflow(r) for r in rows], [_hardware(r) for r in hardware])


def moved(
    record: WorkflowRecord, state: str, at: float, **changes: Any
) -> WorkflowRecord:
    """C{record} in C{state} as of C{at} (with other C{changes})."""
    return replace(record, state=state, changed_at=at, **changes)
