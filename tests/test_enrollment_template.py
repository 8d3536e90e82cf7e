"""
The enrollment path in one place (issue 19, item 2): the Tinkerbell
Template in C{conf/tinkerbell/} parses as Tinkerbell parses it
(L{tests.tinkerbellsupport}, which cites Tinkerbell's source), its
actions call fleetd-agent's real commands (each command line goes
through the agent's own parser), in the order fleetd enforces [D1]; and
the agent image's Dockerfile installs what the agent's TPM path needs.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from fleetd.agent import attest, target
from fleetd.agent.client import Refusal
from fleetd.agent.main import ONLINE, buildParser
from fleetd.clitools import CLIError
from fleetd.trust.disks import NOT_REPORTED
from tests.support import REPO
from tests.tinkerbellsupport import (
    Action,
    TemplateError,
    Workflow,
    loadTemplate,
    parseNormalizedNamed,
)

TEMPLATES = sorted((REPO / "conf" / "tinkerbell").glob("*.yaml"))
DOCKERFILE = REPO / "conf" / "tinkerbell" / "agent" / "Dockerfile"
HARDWARE_MAP = {
    "device_1": "3c:ec:ef:00:00:01",
    "talos_image": "https://images.example/talos/v1.9.0/metal-amd64.raw.zst",
}
IMAGE2DISK = "quay.io/tinkerbell/actions/image2disk"
WAITDAEMON = "ghcr.io/jacobweinstock/waitdaemon"
ORDER = ("attest", "disks", "plan", "image2disk", "meta-write", "reboot")

# What each step needs before it runs and what it leaves, as fleetd and the
# tools enforce it: disks and plan present the LDevID attest stored;
# fleetd withholds the plan's code until the disks were reported
# (disks-not-reported) [D1]; image2disk needs the device path the plan
# linked and overwrites the whole disk, META included; META lives in the
# installed image; the reboot ends HookOS (and its in-memory state).
NEEDS = {
    "attest": set(),
    "disks": {"ldevid"},
    "plan": {"ldevid", "disks-reported"},
    "image2disk": {"target-link"},
    "meta-write": {"ldevid", "disks-reported", "target-link", "image"},
    "reboot": {"meta"},
}
LEAVES = {
    "attest": {"ldevid"},
    "disks": {"disks-reported"},
    "plan": {"target-link"},
    "image2disk": {"image"},
    "meta-write": {"meta"},
    "reboot": set(),
}
DESTROYS = {"image2disk": {"meta"}}


def agentArgs(action: Action) -> argparse.Namespace:
    """The action's command line through fleetd-agent's own parser, strictly."""
    parser = buildParser()
    try:
        args = parser.parse_args(action.command)
    except CLIError as e:
        raise TemplateError(f"{action.name}: {e}") from None
    if args.command in ONLINE and args.server is None:
        raise TemplateError(f"{action.name}: {args.command} needs --server")
    # argparse accepts a prefix of a long option; the Template must not.
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = {
        option
        for p in (parser, sub.choices[args.command])
        for a in p._actions
        for option in a.option_strings
    }
    for token in action.command:
        if token.startswith("--") and token.split("=", 1)[0] not in known:
            raise TemplateError(f"{action.name}: {token} is not a full option name")
    return args


def step(action: Action, agentImage: str) -> str:
    """Which step of the install C{action} is; refuses anything else."""
    repository = parseNormalizedNamed(action.image)
    if action.image == agentImage:
        args = agentArgs(action)
        if args.command == "plan" and args.write_meta is not None:
            return "meta-write"
        return str(args.command)
    if repository == IMAGE2DISK:
        return "image2disk"
    if repository == WAITDAEMON and action.command == ["reboot"]:
        return "reboot"
    raise TemplateError(f"{action.name}: not a step of the install ({action.image})")


def checkOrder(steps: list[str]) -> None:
    """Each step finds what it needs; nothing it needs was destroyed."""
    have: set[str] = set()
    for name in steps:
        missing = NEEDS[name] - have
        if missing:
            raise TemplateError(f"{name} runs before {sorted(missing)} exists")
        have = (have - DESTROYS.get(name, set())) | LEAVES[name]
    if tuple(steps) != ORDER:
        raise TemplateError(f"steps {steps}, not {list(ORDER)}")


def mounts(action: Action, workflow: Workflow) -> set[str]:
    task = workflow.tasks[0]
    return {volume.split(":")[1] for volume in task.volumes + action.volumes}


def check(text: str, hardwareMap: dict[str, str] = HARDWARE_MAP) -> Workflow:
    """Every rule above, on one Template's text; L{TemplateError} if one fails."""
    _name, workflow = loadTemplate(text, hardwareMap)
    actions = workflow.tasks[0].actions
    agentImage = actions[0].image
    steps = [step(action, agentImage) for action in actions]
    checkOrder(steps)
    byStep = dict(zip(steps, actions, strict=True))
    agents = [byStep[s] for s in ("attest", "disks", "plan", "meta-write")]
    parsed = [agentArgs(a) for a in agents]
    if len({(a.server, a.state) for a in parsed}) != 1:
        raise TemplateError("the agent actions differ in --server or --state")
    state = parsed[0].state
    for action in agents:
        if state not in mounts(action, workflow):
            raise TemplateError(f"{action.name}: {state} is not a shared volume")
    link = parsed[2].target_link
    if link is None or Path(link).parent != Path(state):
        raise TemplateError(f"plan links the target disk at {link}, not in {state}")
    image2disk = byStep["image2disk"]
    if image2disk.environment.get("DEST_DISK") != link or parsed[3].write_meta != link:
        raise TemplateError("image2disk and the META write do not use the plan's link")
    if state not in mounts(image2disk, workflow):
        raise TemplateError(f"image2disk does not mount {state}")
    url = image2disk.environment.get("IMG_URL", "")
    compressed = url.endswith((".gz", ".xz", ".zst", ".zs", ".bz2", ".bzip2"))
    if (image2disk.environment.get("COMPRESSED") == "true") != compressed:
        raise TemplateError(f"COMPRESSED does not match {url}")
    reboot = byStep["reboot"]
    if reboot.pid != "host" or not reboot.environment.get("IMAGE"):
        raise TemplateError("waitdaemon's reboot needs pid: host and IMAGE")
    if "/var/run/docker.sock" not in mounts(reboot, workflow):
        raise TemplateError("waitdaemon needs the Docker socket")
    return workflow


class TemplateTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.assertTrue(TEMPLATES, "no Template in conf/tinkerbell/")
        self.text = TEMPLATES[0].read_text()

    def refused(self, text: str, **hardwareMap: str) -> str:
        with self.assertRaises(TemplateError) as caught:
            check(text, {**HARDWARE_MAP, **hardwareMap})
        return str(caught.exception)

    def test_everyTemplate_parsesAndRunsTheAgentInFleetdsOrder(self) -> None:
        """Each Template parses as Tinkerbell's CRD and workflow; steps in order."""
        self.assertEqual(len(TEMPLATES), 1)
        for path in TEMPLATES:
            workflow = check(path.read_text())
            task = workflow.tasks[0]
            self.assertEqual(task.worker, HARDWARE_MAP["device_1"])
            self.assertEqual(len(task.actions), len(ORDER))

    def test_imageURL_fromTheWorkflowsHardwareMap(self) -> None:
        """IMG_URL is the Workflow's talos_image; without it Tinkerbell refuses."""
        workflow = check(self.text)
        env = workflow.tasks[0].actions[3].environment
        self.assertEqual(env["IMG_URL"], HARDWARE_MAP["talos_image"])
        with self.assertRaises(TemplateError) as caught:
            check(self.text, {"device_1": HARDWARE_MAP["device_1"]})
        self.assertIn('"talos_image"', str(caught.exception))

    def test_swappedSteps_refused(self) -> None:
        """Swapping two actions breaks the order fleetd enforces."""
        swaps = [
            ("fleetd-agent disks", "fleetd-agent plan", "plan runs before"),
            ("fleetd-agent attest", "fleetd-agent disks", "disks runs before"),
            ("image2disk", "fleetd-agent META 0x0b", "meta-write runs before"),
        ]
        for first, second, line in swaps:
            self.assertIn(line, self.refused(swapActions(self.text, first, second)))

    def test_misspelledFlag_refusedByTheAgentsParser(self) -> None:
        """A flag the agent does not have, or only a prefix of one, fails."""
        for old, new, line in [
            ("--target-link=", "--target-lnk=", "unrecognized arguments"),
            ("--target-link=", "--target=", "not a full option name"),
            ("--write-meta=", "--write-mta=", "unrecognized arguments"),
            ("- attest\n", "- atest\n", "invalid choice"),
        ]:
            self.assertIn(old, self.text)
            self.assertIn(line, self.refused(self.text.replace(old, new, 1)))

    def test_withoutServer_refused(self) -> None:
        """An online command without --server fails as fleetd-agent would."""
        server = "              - --server=https://enroll.lolwtf.ca:8444\n"
        self.assertIn(server, self.text)
        text = self.text.replace(server, "", 1)
        self.assertIn("attest needs --server", self.refused(text))

    def test_tinkerbellsRules_refuseWhatTinkerbellRefuses(self) -> None:
        """Duplicate names, bad images, an unknown key, a non-string value."""
        for old, new, line in [
            ("- name: \"fleetd-agent disks\"", "- name: \"fleetd-agent attest\"",
             "two actions cannot have same name"),
            ("image: quay.io/tinkerbell", "image: quay.io/Tinkerbell", "lowercase"),
            ("environment:\n   ", "enviroment:\n   ", "unknown keys"),
            ('COMPRESSED: "true"', "COMPRESSED: true", "not a Go map"),
            ("kind: Template", "kind: Workflow", "kind"),
            ('worker: "{{.device_1}}"', 'worker: "{{.Hardware.MAC}}"', "unsupported"),
        ]:  # fmt: skip
            self.assertIn(old, self.text)
            self.assertIn(line, self.refused(self.text.replace(old, new, 1)))
        with self.assertRaises(TemplateError):
            check(self.text, {**HARDWARE_MAP, "device_1": ""})


class FleetdEnforcesTheOrderTests(SynchronousTestCase):
    """The rules L{NEEDS} encodes are fleetd's own, not the Template's."""

    def test_planWithheldBeforeDisks_refused(self) -> None:
        """A plan whose code fleetd withheld stops the plan action [D1]."""
        self.assertEqual(NOT_REPORTED, "disks-not-reported")
        with self.assertRaises(Refusal) as caught:
            attest.installable({"meta_0x0b_withheld": f"{NOT_REPORTED}: none yet"})
        self.assertIn(NOT_REPORTED, caught.exception.line)

    def test_planWithoutCode_linksNothing(self) -> None:
        """No ready run: no link, so image2disk has no disk to write."""
        with self.assertRaises(target.TargetError) as caught:
            target.linkTarget({"target_disk_serial": "S1"}, Path("x"), Path("/sys"))
        self.assertIn("meta-code-missing", str(caught.exception))


class DockerfileTests(SynchronousTestCase):
    """
    The image is not built here (no registry reachable); its Dockerfile
    is checked against what the agent needs.
    """

    def setUp(self) -> None:
        self.text = DOCKERFILE.read_text()
        self.stages = self.text.split("\nFROM ")[1:]
        self.assertEqual(len(self.stages), 2, "a build stage and a runtime stage")

    def packages(self, stage: str) -> set[str]:
        found: set[str] = set()
        for run in re.findall(r"apt-get install ([^&]+)", stage.replace("\\\n", " ")):
            found.update(w for w in run.split() if not w.startswith("-"))
        return found

    def makeList(self, name: str) -> set[str]:
        makefile = (REPO / "Makefile").read_text().replace("\\\n", " ")
        match = re.search(rf"^{name} := (.*)$", makefile, re.MULTILINE)
        assert match is not None
        return set(match.group(1).split())

    def test_entrypoint_isTheAgent(self) -> None:
        """The action's command is fleetd-agent's argv."""
        self.assertIn('\nENTRYPOINT ["fleetd-agent"]\n', self.stages[1])

    def test_buildStage_hasWhatBuildsTpm2Pytss(self) -> None:
        """The Makefile's APT_BUILD (tpm2-pytss compiles against tss2)."""
        build = self.packages(self.stages[0])
        self.assertEqual(self.makeList("APT_BUILD") - build, set())
        self.assertIn("COPY dist/fleetd-", self.stages[0])

    def test_runtime_hasTheTPMPath(self) -> None:
        """tpm2-openssl (mTLS), the device TCTI (/dev/tpmrm0), CA roots."""
        runtime = self.packages(self.stages[1])
        self.assertIn("tpm2-openssl", self.makeList("APT_TEST"))
        needed = {"tpm2-openssl", "libtss2-tcti-device0", "ca-certificates", "python3"}
        self.assertEqual(needed - runtime, set())
        self.assertNotIn("libtss2-dev", runtime)

    def test_runtime_hasTheLibrariesTpm2PytssLinks(self) -> None:
        """Every libtss2 the built tpm2-pytss links, by its Debian package."""
        import tpm2_pytss

        if shutil.which("ldd") is None or shutil.which("dpkg") is None:
            raise self.skipTest("needs ldd and dpkg (Debian)")
        library = next(Path(tpm2_pytss.__file__).parent.glob("_libtpm2_pytss*.so"))
        linked = re.findall(r"=> (\S*libtss2-[^ ]+)", _run("ldd", str(library)))
        owners = {_dpkgOwner(Path(path).resolve()) for path in linked}
        self.assertTrue(owners)
        self.assertEqual(owners - self.packages(self.stages[1]), set())


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _dpkgOwner(path: Path) -> str:
    return _run("dpkg", "-S", str(path)).split(":")[0]


def swapActions(text: str, first: str, second: str) -> str:
    """C{text} with the actions named C{first} and C{second} swapped."""
    blocks = re.split(r"(?=\n          - name: )", text)
    names = [re.search(r'name: "?([^"\n]+)', b) for b in blocks]
    index = {m.group(1): i for i, m in enumerate(names) if m and i > 0}
    i, j = index[first], index[second]
    blocks[i], blocks[j] = blocks[j], blocks[i]
    return "".join(blocks)
