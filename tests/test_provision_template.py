"""
A provision that fails on a template names the device and is journaled
(issue 19 item 4): a 409 line with the device and its cluster, and a
C{provision.refused} entry (reason C{template}); no run, no vault file.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd.admin.provision import ProvisionResource
from fleetd.runs.placeholders import DevValues
from fleetd.runs.render import TemplateRenderer
from fleetd.store.entries import JournalEntry
from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import fleetctlAgainst
from tests.fleetsupport import Fleet, device
from tests.support import REPO


class ResourceTests(SynchronousTestCase):
    """C{POST /v1/admin/provision} when a device's template fails."""

    def setUp(self) -> None:
        self.templates = Path(self.mktemp())
        self.templates.mkdir()
        shipped = REPO / "conf" / "templates" / "default.yaml"
        (self.templates / "default.yaml").write_bytes(shipped.read_bytes())
        self.fleet = Fleet(self)

    def provision(self, *names: str) -> tuple[int, str]:
        resource = ProvisionResource(
            self.fleet.registry,
            self.fleet.inventory,
            TemplateRenderer(self.templates, values=DevValues(b"k" * 32)),
            self.fleet.journal,
            ownerName=lambda request: "jane",
        )
        request: Any = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(json.dumps({"devices": list(names)}).encode())
        resource.render(request)
        return request.responseCode, b"".join(request.written).decode()

    def refusals(self) -> list[JournalEntry]:
        entries = self.fleet.test.successResultOf(self.fleet.journal.query())
        return [e for e in entries if e.event == "provision.refused"]

    def test_missingTemplate_409NamesDeviceJournaled(self) -> None:
        """
        A device whose cluster has no template: one 409 line naming the
        device and the cluster; journaled as the owner with the reason and
        what went wrong; no run starts, for it or the rack's other device.
        """
        self.fleet.add(device("w1", "SER1"))
        self.fleet.add(replace(device("w2", "SER2"), cluster="gone"))
        code, body = self.provision("w1", "w2")
        self.assertEqual(code, 409)
        self.assertEqual(body.count("\n"), 1, body)
        self.assertTrue(body.startswith("template: w2 (cluster gone): "), body)
        self.assertIn("no template gone.yaml", body)
        self.assertIn("nothing was provisioned", body)
        (entry,) = self.refusals()
        self.assertEqual((entry.device, entry.actor), ("w2", "owner:jane"))
        self.assertEqual(entry.fields["reason"], "template")
        self.assertEqual(entry.fields["cluster"], "gone")
        self.assertIn("no template gone.yaml", str(entry.fields["problem"]))
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertIsNone(self.fleet.registry.readyRun("w2"))
        self.assertEqual(self.fleet.vault.names(), [])

    def test_brokenDefaultTemplate_namesDeviceAndDefault(self) -> None:
        """A device without a cluster whose default template is not YAML."""
        (self.templates / "default.yaml").write_text("machine: [unclosed\n")
        self.fleet.add(device("w1", "SER1"))
        code, body = self.provision("w1")
        self.assertEqual(code, 409)
        self.assertTrue(body.startswith("template: w1 (cluster default): "), body)
        self.assertIn("not valid YAML", body)
        (entry,) = self.refusals()
        self.assertEqual((entry.device, entry.fields["cluster"]), ("w1", "default"))


class CommandTests(DaemonTestMixin, TestCase):
    """fleetctl provision against the daemon when a template is gone."""

    async def test_provision_templateGone_oneLineJournaled(self) -> None:
        """
        fleetctl provision exits 1 with one line naming the device and its
        cluster; fleetctl journal --device shows the refusal.
        """
        _, fleetctl = await self.daemonWithDevice(cluster="folly")
        config = fleetctl.config
        (self.directory / "templates" / "folly.yaml").unlink()
        code, out, err = await fleetctlAgainst(config, "provision", "w1")
        self.assertEqual((code, out, err.count("\n")), (1, "", 1))
        self.assertIn("template: w1 (cluster folly): no template folly.yaml", err)
        code, out, err = await fleetctlAgainst(
            config, "--json", "journal", "--device", "w1"
        )
        self.assertEqual(code, 0, err)
        events = [(e["event"], e["fields"].get("reason")) for e in json.loads(out)]
        self.assertEqual(
            events, [("device.added", None), ("provision.refused", "template")]
        )
