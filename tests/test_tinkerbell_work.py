"""
One API step of L{fleetd.tinkerbell.work} refused by the API server (422
or 400): the row ends C{failed} with the server's line as its problem,
and one C{tinkerbell.object-failed} entry names the object, for a
Workflow (its run too) as for a Hardware, created or updated.
"""

from __future__ import annotations

from typing import Any, cast

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.k8s.errors import Invalid
from fleetd.store.entries import Entry
from fleetd.store.fields import MAX_STRING
from fleetd.tinkerbell.api import TinkerbellAPI
from fleetd.tinkerbell.store import (
    APPLY,
    CREATE,
    FAILED,
    HardwareRecord,
    WorkflowRecord,
)
from fleetd.tinkerbell.work import Step, applyHardware, createWorkflow

NS = "tink"
LINE = "spec.interfaces[0].dhcp.mac: Invalid value: 'x'"


class Refusing:
    """The API refusing every object it is asked to write; C{found}, the
    object a read finds (L{None}: none)."""

    namespace = NS

    def __init__(self, found: dict[str, Any] | None = None, line: str = LINE):
        self.found, self.line = found, line

    async def get(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.found

    async def create(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        raise Invalid(self.line, 422, "Invalid")

    async def replace(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        raise Invalid(self.line, 422, "Invalid")


def workflow() -> WorkflowRecord:
    return WorkflowRecord(NS, "w1-r-1", "w1", "r-1", CREATE, True, "{}")


def hardware() -> HardwareRecord:
    return HardwareRecord("w1", NS, APPLY, ("52:54:00:00:00:01",))


class FailedStepTests(SynchronousTestCase):
    def step(self, made: Any) -> Step:
        step: Step = self.successResultOf(Deferred.fromCoroutine(made))
        return step

    def assertFailed(
        self,
        row: WorkflowRecord | HardwareRecord | None,
        at: float,
        entry: Entry,
        expected: Entry,
    ) -> None:
        """C{row} ended C{failed} at C{at} with the server's line, and the
        step's entry is C{expected}."""
        assert row is not None
        self.assertEqual((row.state, row.changed_at, row.problem), (FAILED, at, LINE))
        self.assertEqual(entry, expected)

    def test_workflow_failed(self) -> None:
        """A Workflow the API refuses: its row C{failed} at the clock's
        time with the server's line; the entry names the run and the
        Workflow."""
        api = cast(TinkerbellAPI, Refusing())
        step = self.step(createWorkflow(api, workflow(), lambda: 7.0))
        self.assertIsNone(step.hardware)
        self.assertFailed(
            step.workflow,
            7.0,
            step.entry,
            Entry(
                "tinkerbell.object-failed",
                "fleetd",
                "w1",
                "r-1",
                {"workflow": f"{NS}/w1-r-1", "problem": LINE},
            ),
        )

    def test_hardware_failed_createdOrUpdated(self) -> None:
        """A Hardware the API refuses, made or updated: its row C{failed},
        the entry names the Hardware and no run."""
        fleetds = {
            "apiVersion": "tinkerbell.org/v1alpha1",
            "kind": "Hardware",
            "metadata": {
                "name": "w1",
                "namespace": NS,
                "resourceVersion": "3",
                "labels": {
                    "app.kubernetes.io/managed-by": "fleetd",
                    "fleetd.io/device": "w1",
                },
            },
            "spec": {"interfaces": []},
        }
        for found in (None, fleetds):
            api = cast(TinkerbellAPI, Refusing(found))
            step = self.step(applyHardware(api, hardware(), lambda: 9.0))
            self.assertIsNone(step.workflow)
            self.assertFailed(
                step.hardware,
                9.0,
                step.entry,
                Entry(
                    "tinkerbell.object-failed",
                    "fleetd",
                    "w1",
                    None,
                    {"hardware": f"{NS}/w1", "problem": LINE},
                ),
            )

    def test_longLine_cut(self) -> None:
        """The server's line is kept to the journal's longest string."""
        api = cast(TinkerbellAPI, Refusing(line="x" * (MAX_STRING + 50)))
        step = self.step(createWorkflow(api, workflow(), lambda: 1.0))
        assert step.workflow is not None
        self.assertEqual(step.workflow.problem, "x" * MAX_STRING)
        assert step.entry.fields is not None
        self.assertEqual(step.entry.fields["problem"], "x" * MAX_STRING)
