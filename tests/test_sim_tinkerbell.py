"""
C{fleetd-sim} with C{[tinkerbell]} (issue 28 item 7): HookOS plays the
Workflow fleetd made, read from the Kubernetes fake as tink-controller
reads it (L{fleetd.sim.hookos}); the tink-server stand-in moves its state
as it is played; and the C{workflow-deleted} fault on a whole rack.
"""

from __future__ import annotations

import grpc
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config.tinkerbell import TinkerbellClass
from fleetd.sim import hookos
from fleetd.sim.node import PHASES
from fleetd.sim.tpm import RM_AVAILABLE
from fleetd.testing.kube import FakeKube
from fleetd.testing.tinkagent import getAction, report
from fleetd.testing.tinkserver import FakeTinkServer, Workflows
from fleetd.tinkerbell import objects
from fleetd.tinkerbell.api import TinkerbellAPI
from tests.support import missingPeer
from tests.test_sim import runSim

MAC = "52:54:00:00:01:07"
NS = hookos.NAMESPACE


class PlayTests(SynchronousTestCase):
    """The Workflow fleetd made, rendered with the enrollment Template."""

    def setUp(self) -> None:
        self.fake = FakeKube(Clock())
        hookos.applyTemplate(self.fake)

    def made(self, image: str = hookos.IMAGE) -> dict[str, object]:
        cls = TinkerbellClass("fleetd-talos-install", image, True)
        body = objects.workflow(NS, "w1", "r-1", MAC, cls)
        d = Deferred.fromCoroutine(
            TinkerbellAPI(self.fake.client(), NS).create("workflows", body)
        )
        self.fake.flush()
        made: dict[str, object] = self.successResultOf(d)
        return made

    def test_play_theTemplatesActions(self) -> None:
        """The agent is served fleetd's Workflow (its id) and the
        Template's six actions, as the node's phases."""
        played = hookos.playOf(self.fake, self.made(), MAC)
        self.assertEqual(played.workflow, f"{NS}/w1-r-1")
        self.assertEqual(
            played.phases, ("attest", "disks", "plan", "install", "meta", "reboot")
        )
        self.assertTrue(set(played.phases) - {"meta", "reboot"} <= set(PHASES))

    def test_play_refusesAnotherImageOrAgent(self) -> None:
        """A Workflow whose image or agent is not the node's cannot be played."""
        other = self.made("https://elsewhere.invalid/x.raw.zst")
        self.assertRaises(hookos.WorkflowError, hookos.playOf, self.fake, other, MAC)
        self.fake.workflows.clear()
        self.assertRaises(
            hookos.WorkflowError,
            hookos.playOf,
            self.fake,
            self.made(),
            "52:54:00:00:09:09",
        )

    def test_render_missingKey_refused(self) -> None:
        """As tink-controller (missingkey=error): a value the map lacks."""
        self.assertRaises(
            hookos.WorkflowError, hookos.render, "{{.device_1}} {{.x}}", {"x": "1"}
        )
        self.assertEqual(hookos.render("{{ .x }}", {"x": "1"}), "1")


class StateTests(SynchronousTestCase):
    def test_stateMoves_asPlayed(self) -> None:
        """The stand-in tells RUNNING at the first report, POST and SUCCESS
        once the last action succeeded."""
        server = FakeTinkServer()
        self.addCleanup(server.stop, None)
        moves: list[tuple[str, str]] = []
        workflows = Workflows(server, onState=lambda w, s: moves.append((w, s)))
        workflows.add(MAC, f"{NS}/w1-r-1", ["attest", "plan"])
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        self.addCleanup(channel.close)
        while (action := getAction(channel, MAC)) is not None:
            report(channel, MAC, action, True)
            report(channel, MAC, action, False)
        self.assertEqual(
            moves,
            [
                (f"{NS}/w1-r-1", "RUNNING"),
                (f"{NS}/w1-r-1", "POST"),
                (f"{NS}/w1-r-1", "SUCCESS"),
            ],
        )


class TinkerbellRackTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not RM_AVAILABLE:
            raise missingPeer("swtpm, tpm2-abrmd, dbus-daemon or tpm2-openssl missing")

    def test_rack_workflowDeleted(self) -> None:
        """
        [V3] A rack of 3 on the sim's own fleetd, with [tinkerbell]: the
        clean nodes ran the Workflows fleetd made (the sim checks the id
        served against fleetd's journal, and fleetd's status shows their
        SUCCESS); the node whose Workflow someone else deleted stays
        C{planned}, reported once (journal, status, FleetTinkerbellWorkflowLost),
        its Workflow not made again; the retired node's Workflow is deleted
        and its Hardware no longer network boots.
        """
        code, document, stderr = runSim(
            "--nodes", "3", "--parallel", "3", "--faults", "workflow-deleted,retire"
        )
        self.assertEqual(code, 0, stderr[-3000:])
        states = {(n["fault"], n["state"]) for n in document["nodes"]}
        self.assertEqual(
            states,
            {
                ("workflow-deleted", "planned"),
                ("retire", "decommissioning"),
                (None, "active"),
            },
        )
        deleted = next(n for n in document["nodes"] if n["fault"])
        self.assertEqual(deleted["alerts"], ["FleetTinkerbellWorkflowLost"])
