"""
Disk encryption by fleetd's KMS, opted into per class (issue 30, item 6).

C{[provision.class.<name>] disk_encryption = "kms"} puts Talos's
C{machine.systemDiskEncryption} for STATE and EPHEMERAL, with a KMS key at
C{https://<enrollment name>:<kms port>}, where the template's
C{systemDiskEncryption: FLEETD-KMS} marker is; a plain class renders as
before. A class that opts in without C{[kms]}, or with a template that has
no place for the section, is refused: at start (one line: the file, the
line, the reason) and at each provision (nothing made).
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd import prepare as preparing
from fleetd.admin.provision import ProvisionResource
from fleetd.config import ConfigError, ProvisionClass, ProvisionSettings, loadSettings
from fleetd.config import load as loading
from fleetd.config.provision import kmsPort, listenPort
from fleetd.runs.diskencryption import MARKER, DiskEncryption
from fleetd.runs.placeholders import DevValues
from fleetd.runs.render import NodeFacts, RenderError, TemplateRenderer
from fleetd.runs.vaultnames import configName
from tests.fleetsupport import Fleet, device
from tests.support import filledTemplate, writeConfig

NAME = "enroll.lolwtf.ca"
ENDPOINT = f"https://{NAME}:4050"
MARKER_LINE = f"  systemDiskEncryption: {MARKER}\n"


def expectedSection(endpoint: str = ENDPOINT) -> dict[str, Any]:
    """What Talos reads: LUKS2, one key in slot 0 sealed by the KMS."""
    partition = {
        "provider": "luks2",
        "keys": [{"slot": 0, "kms": {"endpoint": endpoint}}],
    }
    return {"state": partition, "ephemeral": partition}


def withoutMarker(text: str) -> str:
    """C{text} with the marker's line and its comment lines taken out."""
    lines = text.splitlines(keepends=True)
    end = lines.index(MARKER_LINE)
    start = end
    while lines[start - 1].startswith("  #"):
        start -= 1
    return "".join(lines[:start] + lines[end + 1 :])


def machineLine(text: str) -> int:
    return text.splitlines().index("machine:") + 1


def machineOf(body: bytes) -> dict[str, Any]:
    docs = list(yaml.safe_load_all(body))
    (doc,) = [d for d in docs if d.get("version") == "v1alpha1"]
    machine: dict[str, Any] = doc["machine"]
    return machine


class RenderTests(SynchronousTestCase):
    """The section for an opting-in class; nothing changed for a plain one."""

    def setUp(self) -> None:
        self.directory = Path(self.mktemp())
        self.directory.mkdir()
        self.text = filledTemplate()
        self.assertIn(MARKER_LINE, self.text)  # the shipped example has it
        (self.directory / "default.yaml").write_text(self.text)
        self.encryption = DiskEncryption(["worker-g3"], NAME, 4050)
        self.renderer = TemplateRenderer(self.directory, diskEncryption=self.encryption)

    def node(self, cls: str) -> NodeFacts:
        return NodeFacts("w1", cls, run="r-1")

    def write(self, text: str, name: str = "default.yaml") -> Path:
        path = self.directory / name
        path.write_text(text)
        return path

    def test_optingClass_sectionForStateAndEphemeral(self) -> None:
        """
        [E4] A device of an opting-in class: machine.systemDiskEncryption is
        LUKS2 for STATE and EPHEMERAL, one KMS key in slot 0 whose
        endpoint is exactly https://<enrollment name>:<kms port>; written
        out without YAML anchors; the rest of the machine is the template's.
        """
        body = self.renderer.render(None, self.node("worker-g3"))
        machine = machineOf(body)
        self.assertEqual(machine["systemDiskEncryption"], expectedSection())
        self.assertNotIn(b"&id", body)
        self.assertNotIn(b"*id", body)
        self.assertNotIn(MARKER.encode(), body)
        plain = machineOf(self.renderer.render(None, self.node("worker")))
        del machine["systemDiskEncryption"]
        labels = "fleetd.io/class"
        self.assertEqual(machine["nodeLabels"][labels], "worker-g3")
        machine["nodeLabels"][labels] = "worker"
        self.assertEqual(machine, plain)

    def test_plainClass_byteIdenticalToBefore(self) -> None:
        """
        A device of a plain class renders exactly as before: the same bytes
        as without any disk encryption, as from the template without the
        marker line, and with no section.
        """
        node = self.node("worker")
        body = self.renderer.render(None, node)
        self.assertNotIn("systemDiskEncryption", machineOf(body))
        before = TemplateRenderer(self.directory).render(None, node)
        self.assertEqual(body, before)
        other = self.directory / "other"
        other.mkdir()
        (other / "default.yaml").write_text(withoutMarker(self.text))
        self.assertNotIn(MARKER, (other / "default.yaml").read_text())
        unmarked = TemplateRenderer(other, diskEncryption=self.encryption)
        self.assertEqual(unmarked.render(None, node), body)

    def test_endpoint_followsTheBoundPort(self) -> None:
        """The endpoint names the kms listener's port once it is bound."""

        class Port:
            def getHost(self) -> Any:
                return type("Address", (), {"port": 40123})()

        self.encryption.bound(Port())  # type: ignore[arg-type]
        body = self.renderer.render(None, self.node("worker-g3"))
        section = machineOf(body)["systemDiskEncryption"]
        self.assertEqual(section, expectedSection(f"https://{NAME}:40123"))

    def test_noPlace_refusedNamingFileAndLine(self) -> None:
        """
        Without the marker, an opting-in class is refused by check and by
        render, one line naming the file, the line of machine: and the
        reason; a plain class still renders.
        """
        path = self.write(withoutMarker(self.text))
        line = machineLine(withoutMarker(self.text))
        for attempt in (
            lambda: self.renderer.check(None, "worker-g3"),
            lambda: self.renderer.render(None, self.node("worker-g3")),
            self.renderer.checkAll,
        ):
            error = self.assertRaises(RenderError, attempt)
            self.assertEqual(
                str(error),
                f"{path} line {line}: no place for disk encryption: put"
                f" `systemDiskEncryption: {MARKER}` under machine: where fleetd"
                " is to write the section (class worker-g3 has disk_encryption"
                ' = "kms")',
            )
        self.renderer.check(None, "worker")
        self.renderer.render(None, self.node("worker"))
        TemplateRenderer(self.directory).checkAll()  # no class opts in

    def test_templatesOwnSection_refusedForOptingClassOnly(self) -> None:
        """
        A template with its own systemDiskEncryption is refused for an
        opting-in class (naming its line) and rendered as it is for others.
        """
        own = "  systemDiskEncryption:\n    ephemeral:\n      provider: luks2\n"
        text = self.text.replace(MARKER_LINE, own)
        path = self.write(text)
        line = text.splitlines().index("  systemDiskEncryption:") + 1
        error = self.assertRaises(RenderError, self.renderer.check, None, "worker-g3")
        self.assertTrue(
            str(error).startswith(
                f"{path} line {line}: machine.systemDiskEncryption is the"
                f' template\'s own; for a class with disk_encryption = "kms" it'
                f" must read {MARKER}"
            ),
            error,
        )
        plain = machineOf(self.renderer.render(None, self.node("worker")))
        self.assertEqual(
            plain["systemDiskEncryption"], {"ephemeral": {"provider": "luks2"}}
        )

    def test_volumeConfigWithEncryption_refused(self) -> None:
        """
        A VolumeConfig of STATE or EPHEMERAL with its own encryption (which
        Talos refuses beside machine.systemDiskEncryption) is no place.
        """
        volume = (
            "---\napiVersion: v1alpha1\nkind: VolumeConfig\nname: EPHEMERAL\n"
            "encryption:\n  provider: luks2\n"
        )
        text = self.text + volume
        path = self.write(text)
        line = text.splitlines().index("encryption:") + 1
        error = self.assertRaises(RenderError, self.renderer.check, None, "worker-g3")
        self.assertTrue(
            str(error).startswith(
                f"{path} line {line}: the VolumeConfig of EPHEMERAL sets its own"
                " encryption"
            ),
            error,
        )
        sized = self.text + volume.replace("encryption:\n  provider: luks2\n", "")
        self.write(sized + "provisioning:\n  maxSize: 10GiB\n")
        self.renderer.check(None, "worker-g3")

    def test_misplacedMarker_refusedForEveryClass(self) -> None:
        """The marker anywhere but machine.systemDiskEncryption is refused."""
        text = self.text.replace(MARKER_LINE, "") + f"extra: {MARKER}\n"
        path = self.write(text)
        line = len(text.splitlines())
        plain = TemplateRenderer(self.directory)
        for attempt in (
            lambda: plain.render(None, self.node("worker")),
            plain.checkAll,
            lambda: self.renderer.check(None, "worker-g3"),
        ):
            error = self.assertRaises(RenderError, attempt)
            self.assertTrue(
                str(error).startswith(f"{path} line {line}: {MARKER} is out of place"),
                error,
            )

    def test_devValues_leaveTheMarker(self) -> None:
        """Dev values fill placeholders, never the marker."""
        example = Path(__file__).resolve().parent.parent / "conf/templates/default.yaml"
        self.write(example.read_text())
        renderer = TemplateRenderer(
            self.directory,
            values=DevValues(b"d" * 32),
            diskEncryption=self.encryption,
        )
        body = renderer.render(None, self.node("worker-g3"))
        self.assertEqual(machineOf(body)["systemDiskEncryption"], expectedSection())


class ConfigTests(SynchronousTestCase):
    """C{[provision.class.<name>]} and its refusals."""

    def load(self, overrides: dict[str, dict[str, Any]]) -> Any:
        directory = Path(self.mktemp())
        return loadSettings(writeConfig(directory, overrides))

    def refused(self, overrides: dict[str, dict[str, Any]]) -> str:
        return str(self.assertRaises(ConfigError, self.load, overrides))

    def withKMS(self, listen: str = "tcp:4050:interface=127.0.0.1") -> None:
        """Stand in for the [kms] table (the KMS listener's own work)."""
        self.patch(loading, "kmsListen", lambda settings: listen)
        self.patch(preparing, "kmsListen", lambda settings: listen)

    def test_optingInWithoutKMS_configError(self) -> None:
        """A class that opts in while fleetd is not the KMS stops the start."""
        line = self.refused({"provision.class.worker": {"disk_encryption": "kms"}})
        self.assertEqual(
            line,
            'provision.class.worker.disk_encryption: "kms" needs fleetd to be'
            " the site's KMS, and the [kms] table is absent",
        )

    def test_classTables_readAndChecked(self) -> None:
        """
        "none" (the default) opts out; another value, a class the site does
        not define, or an unknown key is one line naming it.
        """
        settings = self.load({"provision.class.worker": {"disk_encryption": "none"}})
        self.assertEqual(
            settings.provision.per_class, {"worker": ProvisionClass("none")}
        )
        self.assertEqual(settings.provision.diskEncryptionClasses(), ())
        for overrides, line in [
            (
                {"provision.class.worker": {"disk_encryption": "luks"}},
                "provision.class.worker.disk_encryption: 'luks' must be \"kms\"",
            ),
            (
                {"provision.class.wroker": {"disk_encryption": "none"}},
                "provision.class.wroker: unknown class: not one of"
                " provision.classes (did you mean worker?)",
            ),
            (
                {"provision.class.worker": {"disk_encrypt": "kms"}},
                "provision.class.worker.disk_encrypt: unknown key",
            ),
        ]:
            self.assertTrue(self.refused(overrides).startswith(line), line)

    def test_kmsPort(self) -> None:
        """The port of listen.kms, or a line naming why there is none."""
        opting = ProvisionSettings(
            classes=("worker",), per_class={"worker": ProvisionClass("kms")}
        )
        self.assertIsNone(kmsPort(ProvisionSettings(), None))
        self.assertEqual(kmsPort(opting, "tcp:4050:interface=127.0.0.1"), 4050)
        error = self.assertRaises(ConfigError, kmsPort, opting, "unix:/run/kms")
        self.assertEqual(error.key, "listen.kms")
        for description, port in [
            ("tcp:4050", 4050),
            ("tcp6:port=4051:interface=\\:\\:", 4051),
            ("tcp:interface=10.0.0.1:port=77", 77),
            ("unix:/run/fleetd/kms.sock", None),
        ]:
            self.assertEqual(listenPort(description), port, description)

    def test_start_templateWithoutPlace_oneLine(self) -> None:
        """
        With [kms] and an opting-in class, a template without the marker
        stops the start with one line naming the file and the line, with
        dev values as without; with the marker, the start's check passes.
        """
        self.withKMS()
        for dev in (True, False):
            directory = Path(self.mktemp())
            overrides: dict[str, dict[str, Any]] = {
                "provision.class.worker": {"disk_encryption": "kms"},
                "dev": {"generate_pki": True, "generate_values": dev},
            }
            settings = loadSettings(writeConfig(directory, overrides))
            encryption = preparing.diskEncryptionOf(settings)
            assert encryption is not None
            self.assertEqual(
                (encryption.endpoint, encryption.classes),
                (ENDPOINT, frozenset({"worker"})),
            )
            folly = settings.provision.templates / "folly.yaml"
            for path in (folly, settings.provision.templates / "default.yaml"):
                path.write_text(filledTemplate())
            preparing.checkTemplates(settings)
            text = withoutMarker(filledTemplate())
            folly.write_text(text)
            error = self.assertRaises(ConfigError, preparing.checkTemplates, settings)
            self.assertEqual(
                str(error),
                f"provision.templates: {folly} line {machineLine(text)}: no place"
                f" for disk encryption: put `systemDiskEncryption: {MARKER}` under"
                " machine: where fleetd is to write the section (class worker"
                ' has disk_encryption = "kms")',
            )


class ProvisionTests(SynchronousTestCase):
    """A provision refused for want of a place makes nothing."""

    def setUp(self) -> None:
        self.templates = Path(self.mktemp())
        self.templates.mkdir()
        (self.templates / "default.yaml").write_text(filledTemplate())
        (self.templates / "folly.yaml").write_text(withoutMarker(filledTemplate()))
        self.fleet = Fleet(self)
        self.encryption = DiskEncryption(["worker-g3"], NAME, 4050)

    def provision(self, *names: str) -> tuple[int, str]:
        renderer = TemplateRenderer(self.templates, diskEncryption=self.encryption)
        resource = ProvisionResource(
            self.fleet.registry,
            self.fleet.inventory,
            renderer,
            self.fleet.journal,
            ownerName=lambda request: "jane",
        )
        request: Any = DummyRequest([])
        request.method = b"POST"
        request.content = io.BytesIO(json.dumps({"devices": list(names)}).encode())
        resource.render(request)
        return request.responseCode, b"".join(request.written).decode()

    def test_noPlace_refusedNothingMade(self) -> None:
        """
        A rack with an opting-in device on a template without the marker:
        409, one line naming the device, its cluster, the file and line;
        journaled as provision.refused (reason template); no run, no vault
        file, for any device of the request.
        """
        self.fleet.add(device("w1", "SER1", cls="worker"))
        self.fleet.add(replace(device("w2", "SER2", cls="worker-g3"), cluster="folly"))
        code, body = self.provision("w1", "w2")
        self.assertEqual(code, 409, body)
        where = self.templates / "folly.yaml"
        line = machineLine(where.read_text())
        self.assertEqual(body.count("\n"), 1, body)
        self.assertTrue(
            body.startswith(
                f"template: w2 (cluster folly): {where} line {line}: no place"
            ),
            body,
        )
        self.assertIn("nothing was provisioned", body)
        self.assertEqual(self.fleet.events(), ["provision.refused"])
        (entry,) = self.fleet.test.successResultOf(self.fleet.journal.query())
        self.assertEqual((entry.device, entry.fields["reason"]), ("w2", "template"))
        self.assertEqual(self.fleet.vault.names(), [])
        self.assertIsNone(self.fleet.registry.readyRun("w1"))
        self.assertIsNone(self.fleet.registry.readyRun("w2"))

    def test_place_configurationCarriesTheSection(self) -> None:
        """
        On the marked template, the opting-in device's stored configuration
        has the section and the plain device's has none.
        """
        self.fleet.add(device("w1", "SER1", cls="worker"))
        self.fleet.add(device("w2", "SER2", cls="worker-g3"))
        code, body = self.provision("w1", "w2")
        self.assertEqual(code, 201, body)
        sections = {}
        for name in ("w1", "w2"):
            run = self.fleet.registry.readyRun(name)
            assert run is not None
            stored = self.fleet.vault.get(configName(run))
            assert stored is not None
            sections[name] = machineOf(stored).get("systemDiskEncryption")
        self.assertEqual(sections, {"w1": None, "w2": expectedSection()})

    def test_plainClass_templateWithoutPlace_provisioned(self) -> None:
        """
        A device of a plain class is provisioned from a template without
        the marker, though another class opts in: only the device's own
        class is checked.
        """
        self.fleet.add(replace(device("w1", "SER1", cls="worker"), cluster="folly"))
        code, body = self.provision("w1")
        self.assertEqual(code, 201, body)
        run = self.fleet.registry.readyRun("w1")
        assert run is not None
        stored = self.fleet.vault.get(configName(run))
        assert stored is not None
        self.assertNotIn("systemDiskEncryption", machineOf(stored))
