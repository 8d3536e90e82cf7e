"""
Tinkerbell's own CRD schemas check what fleetd writes (issue 28, item 6):
the manifests are the upstream files named in C{tests/data/tinkerbell/},
the enrollment Template and the sample Hardware and Workflow validate in
both generations, and broken objects fail, each naming its path
(L{tests.tinkerbellschemas}, L{tests.kubeschema}).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.kubeschema import (
    UnsupportedSchema,
    compileSchema,
    schemaProblems,
    strictSchema,
)
from tests.support import REPO
from tests.tinkerbellschemas import (
    DATA,
    GENERATIONS,
    KINDS,
    NAMESPACE,
    SAMPLE_MAC,
    Checker,
    SchemaError,
    checkerFor,
    checkObject,
    crd,
    loadManifests,
    problems,
    sampleHardware,
    sampleWorkflow,
    stored,
    validate,
    validating,
)

ENROLLMENT = REPO / "conf" / "tinkerbell" / "fleetd-install.yaml"
ROW = re.compile(r"^\| `([^`]+)` \| `[^`]+` \| `([0-9a-f]{40})` \|$")
SECTION = re.compile(r"^## `(\w+)/`")


def gitBlob(data: bytes) -> str:
    """The id git gives a file's content (C{git hash-object})."""
    return hashlib.sha1(
        b"blob %d\0" % len(data) + data, usedforsecurity=False
    ).hexdigest()


def refusal(test: SynchronousTestCase, kind: str, obj: Any, generation: str) -> str:
    """The one line L{validate} raises for C{obj}; fails if it raises nothing."""
    error = test.assertRaises(SchemaError, validate, kind, obj, generation)
    line = str(error)
    test.assertNotIn("\n", line)
    return line


class SourcesTests(SynchronousTestCase):
    def test_manifests_areTheNamedUpstreamBlobs(self) -> None:
        """
        Each kept manifest is, byte for byte, the upstream blob its README
        names, and the README names every file kept.
        """
        named: dict[str, str] = {}
        folder = None
        for line in (DATA / "README.md").read_text().splitlines():
            if (section := SECTION.match(line)) is not None:
                folder = section.group(1)
            elif (row := ROW.match(line)) is not None and folder is not None:
                named[f"{folder}/{row.group(1)}"] = row.group(2)
        kept = {
            str(path.relative_to(DATA)): gitBlob(path.read_bytes())
            for path in DATA.rglob("*.yaml")
        }
        self.assertEqual(len(kept), 5)
        self.assertEqual(kept, named)

    def test_crd_servedV1alpha1Namespaced(self) -> None:
        """
        Every kind of both generations loads from a v1alpha1 CRD that
        is served and namespaced; tink's Template is the monorepo's
        schema (the README says why only one file is kept).
        """
        for generation in GENERATIONS:
            for kind in KINDS:
                definition = crd(kind, generation)
                self.assertTrue(definition.namespaced)
                self.assertEqual(definition.schema["type"], "object")
        self.assertEqual(crd("Template", "tink").path, crd("Template").path)
        self.assertNotEqual(crd("Workflow", "tink").path, crd("Workflow").path)
        self.assertRaises(ValueError, crd, "Task")
        self.assertRaises(ValueError, crd, "Hardware", "v1alpha2")

    def test_strictSchema_refusesWhatItDoesNotModel(self) -> None:
        """
        A keyword, extension, checked format or CEL rule not modelled
        stops the loading, naming where: a new manifest cannot pass by
        being half-read.
        """
        cases = {
            "spec.x: x-kubernetes-embedded-resource": {
                "x": {"type": "object", "x-kubernetes-embedded-resource": True}
            },
            "spec.x: format email": {"x": {"type": "string", "format": "email"}},
            "spec.x: x-kubernetes-list-type map": {
                "x": {"type": "array", "x-kubernetes-list-type": "map"}
            },
            "spec.x: CEL rule not modelled": {
                "x": {"type": "object", "x-kubernetes-validations": [{"rule": "true"}]}
            },
            "spec.x: $ref": {"x": {"$ref": "#/definitions/y"}},
        }
        for expected, properties in cases.items():
            schema = {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": properties}},
            }
            error = self.assertRaises(UnsupportedSchema, strictSchema, schema)
            self.assertIn(expected, str(error))


class StructuralSchemaTests(SynchronousTestCase):
    """Kubernetes' structural-schema rules, on small schemas."""

    def lines(self, schema: dict[str, Any], instance: Any) -> list[str]:
        return schemaProblems(compileSchema(schema), instance)

    def test_unknownField_refusedUnlessPreserved(self) -> None:
        """
        An object refuses a field its schema lacks (the server would
        prune it), an object without properties included, but not under
        x-kubernetes-preserve-unknown-fields, where known fields are still
        checked.
        """
        schema = {
            "type": "object",
            "properties": {
                "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
                "empty": {"type": "object"},
                "open": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"a": {"type": "string"}},
                },
            },
        }
        self.assertEqual(
            self.lines(
                schema, {"closed": {"b": 1}, "empty": {"c": 1}, "open": {"d": 1}}
            ),
            [
                "closed.b: unknown field (not in the schema)",
                "empty.c: unknown field (not in the schema)",
            ],
        )
        self.assertEqual(
            self.lines(schema, {"open": {"a": 1}}),
            ["open.a: Invalid value: 1: must be of type string"],
        )

    def test_intOrString_andNullable(self) -> None:
        """
        x-kubernetes-int-or-string takes an integer or a string (with or
        without controller-gen's anyOf); null only where nullable, and a
        nullable object still refuses unknown fields.
        """
        schema = {
            "type": "object",
            "properties": {
                "port": {"x-kubernetes-int-or-string": True},
                "name": {"type": "string"},
                "maybe": {"type": "string", "nullable": True},
                "ref": {
                    "type": "object",
                    "nullable": True,
                    "properties": {"name": {"type": "string"}},
                },
            },
        }
        self.assertEqual(self.lines(schema, {"port": 80, "maybe": None}), [])
        self.assertEqual(self.lines(schema, {"ref": None}), [])
        self.assertEqual(
            self.lines(schema, {"ref": {"nmae": "x"}}),
            ["ref.nmae: unknown field (not in the schema)"],
        )
        self.assertEqual(self.lines(schema, {"port": "http"}), [])
        self.assertEqual(
            self.lines(schema, {"port": True, "name": None}),
            [
                "name: Invalid value: null: must be of type string",
                "port: Invalid value: true: must be of type integer or string",
            ],
        )

    def test_formats_asKubernetesChecksThem(self) -> None:
        """
        uri is Go's url.ParseRequestURI (an absolute URI or path) and
        date-time RFC 3339; a format Kubernetes does not know (tink's
        url) and integer formats are not checked, as the server does not.
        """
        schema = {
            "type": "object",
            "properties": {
                "u": {"type": "string", "format": "uri"},
                "t": {"type": "string", "format": "date-time"},
                "loose": {"type": "string", "format": "url"},
                "n": {"type": "integer", "format": "int32"},
            },
        }
        for good in (
            "https://images.example/a.raw.zst",
            "/path",
            "mailto:a@b",
            "http://[::1]:8080/x",
        ):
            self.assertEqual(self.lines(schema, {"u": good}), [], good)
        for bad in (
            "not a uri",
            "images.example/a",
            "http://host:port/",
            "http://a b/",
            "",
        ):
            self.assertEqual(
                self.lines(schema, {"u": bad}),
                [f'u: Invalid value: "{bad}": must be of format uri'],
            )
        self.assertEqual(self.lines(schema, {"t": "2026-08-18T14:55:24.5+02:00"}), [])
        self.assertEqual(
            self.lines(schema, {"t": "2026-08-18 14:55"}),
            ['t: Invalid value: "2026-08-18 14:55": must be of format date-time'],
        )
        self.assertEqual(self.lines(schema, {"loose": "not a url", "n": 2**40}), [])


class EnrollmentTemplateTests(SynchronousTestCase):
    def test_enrollmentTemplate_validatesInBothGenerations(self) -> None:
        """
        conf/tinkerbell/fleetd-install.yaml holds the Template, and every
        object in it validates against both generations' schemas, as
        stored in the namespace it is applied to (it names none, so
        kubectl apply -n sets it).
        """
        documents = loadManifests(ENROLLMENT)
        self.assertEqual(
            [(d["kind"], d["metadata"]["name"]) for d in documents],
            [("Template", "fleetd-talos-install")],
        )
        for document in documents:
            for generation in GENERATIONS:
                validate(document["kind"], stored(document, NAMESPACE), generation)

    def test_enrollmentTemplate_brokenFails(self) -> None:
        """The Template schema is not vacuous: spec.data must be a string, alone."""
        (template,) = loadManifests(ENROLLMENT)
        broken = stored(template, NAMESPACE)
        broken["spec"]["data"] = {"version": "0.1"}
        broken["spec"]["version"] = "0.1"
        for generation in GENERATIONS:
            line = refusal(self, "Template", broken, generation)
            self.assertIn('spec.data: Invalid value: {"version": "0.1"}', line)
            self.assertIn("spec.version: unknown field", line)


class SampleObjectTests(SynchronousTestCase):
    def test_sampleHardware_validatesInBothGenerations(self) -> None:
        """
        A Hardware with the inventory MACs, netboot allowed (or not, after
        retirement), the address where known and fleetd's labels validates
        against both generations.
        """
        samples = [
            sampleHardware(),
            sampleHardware(
                "node-02",
                ["3c:ec:ef:00:00:02", "3c:ec:ef:00:00:03"],
                address="10.20.1.7",
            ),
            sampleHardware("node-03", allow=False),
        ]
        for sample in samples:
            for generation in GENERATIONS:
                validate("Hardware", sample, generation)

    def test_sampleWorkflow_validatesInBothGenerations(self) -> None:
        """
        A Workflow with templateRef, hardwareRef, hardwareMap (device_1,
        talos_image) and bootOptions.toggleAllowNetboot validates against
        both generations, with bootMode netboot or iso or none.
        """
        for bootMode in (None, "netboot", "iso"):
            for generation in GENERATIONS:
                validate("Workflow", sampleWorkflow(bootMode=bootMode), generation)
        validate("Workflow", sampleWorkflow(toggleAllowNetboot=False), "tink")

    def test_bootMode_isobootOnlyInTheMonorepo(self) -> None:
        """bootMode isoboot (and customboot) exist only in the monorepo."""
        for bootMode in ("isoboot", "customboot"):
            workflow = sampleWorkflow(bootMode=bootMode)
            validate("Workflow", workflow, "tinkerbell")
            self.assertIn(
                f'spec.bootOptions.bootMode: Unsupported value: "{bootMode}":'
                ' supported values: "netboot", "iso"',
                refusal(self, "Workflow", workflow, "tink"),
            )

    def test_status_eachGenerationItsOwnShape(self) -> None:
        """
        tink-controller's status differs between the generations: the
        monorepo's (agentID, tasks[].id, actions[].id required) and tink
        v0.12's (STATE_ states, tasks[].worker) each validate against
        their own schema only.
        """
        monorepo = sampleWorkflow()
        monorepo["status"] = {
            "state": "RUNNING",
            "agentID": SAMPLE_MAC,
            "tasks": [
                {
                    "id": "t0",
                    "name": "install",
                    "agentID": SAMPLE_MAC,
                    "actions": [
                        {"id": "a0", "name": "fleetd-agent attest", "state": "RUNNING"}
                    ],
                }
            ],
        }
        tink = sampleWorkflow()
        tink["status"] = {
            "state": "STATE_RUNNING",
            "tasks": [
                {
                    "name": "install",
                    "worker": SAMPLE_MAC,
                    "actions": [
                        {"name": "fleetd-agent attest", "status": "STATE_RUNNING"}
                    ],
                }
            ],
        }
        validate("Workflow", monorepo, "tinkerbell")
        validate("Workflow", tink, "tink")
        self.assertIn(
            "status.tasks[0].worker: Required value",
            refusal(self, "Workflow", monorepo, "tink"),
        )
        line = refusal(self, "Workflow", tink, "tinkerbell")
        self.assertIn("status.tasks[0].actions[0].id: Required value", line)
        self.assertIn("status.tasks[0].worker: unknown field", line)


class BrokenObjectTests(SynchronousTestCase):
    """Broken objects fail in both generations, each line naming its path."""

    def assertRefused(self, kind: str, obj: dict[str, Any], *expected: str) -> None:
        for generation in GENERATIONS:
            line = refusal(self, kind, obj, generation)
            for text in expected:
                self.assertIn(text, line, generation)

    def test_wrongType(self) -> None:
        """A string for a boolean, a number for a hardwareMap value."""
        hardware = sampleHardware()
        hardware["spec"]["interfaces"][0]["netboot"]["allowPXE"] = "true"
        self.assertRefused(
            "Hardware",
            hardware,
            'spec.interfaces[0].netboot.allowPXE: Invalid value: "true":'
            " must be of type boolean",
        )
        workflow = sampleWorkflow()
        workflow["spec"]["hardwareMap"]["talos_image"] = 1
        self.assertRefused(
            "Workflow",
            workflow,
            "spec.hardwareMap.talos_image: Invalid value: 1: must be of type string",
        )

    def test_unknownField(self) -> None:
        """A misspelt field, deep or at the top, is refused, not pruned."""
        workflow = sampleWorkflow()
        workflow["spec"]["bootOptions"]["toggleAllowNetBoot"] = True
        workflow["spec"]["hardwareReference"] = "node-01"
        workflow["sepc"] = {}
        self.assertRefused(
            "Workflow",
            workflow,
            "spec.bootOptions.toggleAllowNetBoot: unknown field",
            "spec.hardwareReference: unknown field",
            "sepc: unknown field",
        )
        hardware = sampleHardware()
        hardware["spec"]["interfaces"][0]["netboot"]["allowPxe"] = True
        self.assertRefused(
            "Hardware", hardware, "spec.interfaces[0].netboot.allowPxe: unknown field"
        )

    def test_missingRequired(self) -> None:
        """A bmcRef without its name; an object without name or namespace."""
        hardware = sampleHardware()
        hardware["spec"]["bmcRef"] = {"kind": "Machine"}
        self.assertRefused("Hardware", hardware, "spec.bmcRef.name: Required value")
        workflow = sampleWorkflow()
        del workflow["metadata"]["name"]
        del workflow["metadata"]["namespace"]
        self.assertRefused(
            "Workflow",
            workflow,
            "metadata.name: Required value",
            "metadata.namespace: Required value",
        )

    def test_macUppercase(self) -> None:
        """The schema's MAC pattern is lowercase with colons."""
        hardware = sampleHardware(macs=["3C:EC:EF:00:00:01"])
        self.assertRefused(
            "Hardware",
            hardware,
            'spec.interfaces[0].dhcp.mac: Invalid value: "3C:EC:EF:00:00:01":'
            " should match",
        )

    def test_null(self) -> None:
        """A null where the schema has no nullable (the server would drop it)."""
        workflow = sampleWorkflow()
        workflow["spec"]["templateRef"] = None
        self.assertRefused(
            "Workflow",
            workflow,
            "spec.templateRef: Invalid value: null: must be of type string",
        )

    def test_typeAndObjectMeta(self) -> None:
        """
        apiVersion and kind must be the CRD's; the name a DNS subdomain
        (a run name with "_" or capitals is not), the namespace a DNS
        label, labels valid; ObjectMeta has no other fields.
        """
        workflow = sampleWorkflow(run="Run_1", namespace="Tink")
        workflow["apiVersion"] = "tinkerbell.org/v1alpha2"
        workflow["kind"] = "Workflows"
        workflow["metadata"]["label"] = {}
        workflow["metadata"]["labels"]["fleetd/device"] = "x" * 64
        self.assertRefused(
            "Workflow",
            workflow,
            'apiVersion: Invalid value: "tinkerbell.org/v1alpha2": must be'
            " tinkerbell.org/v1alpha1",
            'kind: Invalid value: "Workflows": must be Workflow',
            'metadata.name: Invalid value: "node-01-Run_1"',
            'metadata.namespace: Invalid value: "Tink"',
            "metadata.label: unknown field (not in ObjectMeta)",
            "metadata.labels.fleetd/device: Invalid value",
        )

    def test_celRule(self) -> None:
        """
        The monorepo's CEL rule on dhcp: tftp_server_name and
        boot_file_name both or neither (tink has neither field).
        """
        hardware = sampleHardware()
        hardware["spec"]["interfaces"][0]["dhcp"]["tftp_server_name"] = "10.20.0.5"
        self.assertIn(
            "spec.interfaces[0].dhcp: Invalid value: TFTPServerName and BootFileName"
            " must both be specified or both be empty",
            refusal(self, "Hardware", hardware, "tinkerbell"),
        )
        hardware["spec"]["interfaces"][0]["dhcp"]["boot_file_name"] = "ipxe.efi"
        validate("Hardware", hardware, "tinkerbell")
        self.assertIn(
            "spec.interfaces[0].dhcp.tftp_server_name: unknown field",
            refusal(self, "Hardware", hardware, "tink"),
        )

    def test_formatChecked(self) -> None:
        """isoURL: a uri in the monorepo (checked); tink's url format is not."""
        workflow = sampleWorkflow(bootMode="iso")
        workflow["spec"]["bootOptions"]["isoURL"] = "hook.iso"
        self.assertIn(
            'spec.bootOptions.isoURL: Invalid value: "hook.iso": must be of format uri',
            refusal(self, "Workflow", workflow, "tinkerbell"),
        )
        validate("Workflow", workflow, "tink")

    def test_intOrString(self) -> None:
        """Hardware resources: quantities as integers or strings, nothing else."""
        hardware = sampleHardware()
        hardware["spec"]["resources"] = {"cpu": 16, "memory": "64Gi"}
        for generation in GENERATIONS:
            validate("Hardware", hardware, generation)
        hardware["spec"]["resources"] = {"cpu": [16], "memory": "lots"}
        self.assertRefused(
            "Hardware",
            hardware,
            "spec.resources.cpu: Invalid value: [16]:"
            " must be of type integer or string",
            'spec.resources.memory: Invalid value: "lots": should match',
        )


class CheckObjectTests(SynchronousTestCase):
    """The hook the Kubernetes fake calls before it stores an object."""

    def test_checkObject_validIsNone(self) -> None:
        """A valid Hardware, Workflow and Template get None."""
        (template,) = loadManifests(ENROLLMENT)
        self.assertIsNone(checkObject("Hardware", sampleHardware()))
        self.assertIsNone(checkObject("Workflow", sampleWorkflow()))
        self.assertIsNone(checkObject("Template", stored(template, NAMESPACE)))

    def test_checkObject_invalidIsOneLine(self) -> None:
        """
        An invalid object gets one line naming the kind, the object, the
        generation and the failing path: the fake's 422 message.
        """
        workflow = sampleWorkflow()
        workflow["spec"]["bootOptions"]["toggleAllowNetBoot"] = True
        self.assertEqual(
            checkObject("Workflow", workflow),
            'Workflow.tinkerbell.org "node-01-r1" is invalid (tinkerbell schema):'
            " spec.bootOptions.toggleAllowNetBoot: unknown field (not in the schema)",
        )

    def test_checkObject_bothGenerations(self) -> None:
        """
        checkObject needs both generations; checkerFor narrows it for an
        object meant for one.
        """
        workflow = sampleWorkflow(bootMode="isoboot")
        line = checkObject("Workflow", workflow)
        assert line is not None
        self.assertIn(
            "(tink schema): spec.bootOptions.bootMode: Unsupported value", line
        )
        monorepo: Checker = checkerFor("tinkerbell")
        self.assertIsNone(monorepo("Workflow", workflow))
        self.assertRaises(ValueError, checkerFor, "v0.12")

    def test_checkObject_otherKindsUnchecked(self) -> None:
        """Kinds that are not Tinkerbell's are not this hook's business."""
        self.assertIsNone(checkObject("Secret", {"kind": "Secret"}))

    def test_validating_setsTheHook(self) -> None:
        """validating(fake) gives the fake checkObject, or the checker given."""

        class Fake:
            validator: Checker | None = None

        fake = validating(Fake())
        self.assertIs(fake.validator, checkObject)
        monorepo = checkerFor("tinkerbell")
        self.assertIs(validating(Fake(), monorepo).validator, monorepo)

    def test_problems_listsEveryPath(self) -> None:
        """problems() lists every failing path, metadata first, then sorted."""
        hardware = sampleHardware(macs=["3C:EC:EF:00:00:01"])
        hardware["metadata"]["name"] = "Node 1"
        hardware["spec"]["interfaces"][0]["netboot"]["allowWorkflow"] = "yes"
        self.assertEqual(
            [line.split(":")[0] for line in problems("Hardware", hardware, "tink")],
            [
                "metadata.name",
                "spec.interfaces[0].dhcp.mac",
                "spec.interfaces[0].netboot.allowWorkflow",
            ],
        )


class ValidatingFakeTests(SynchronousTestCase):
    """The strict Kubernetes fake, given the hook, stores only what
    Tinkerbell's schemas accept (issue 28 item 6)."""

    def test_brokenObject_refused422_validStored(self) -> None:
        """A Workflow with a misspelt boot option is refused 422 naming the
        path, and nothing is stored; the same Workflow spelt right is."""
        from twisted.internet.task import Clock

        from fleetd.testing.kube import FakeKube
        from fleetd.testing.kube_rules import ApiError

        fake = validating(FakeKube(Clock()))
        broken = sampleWorkflow()
        broken["spec"]["bootOptions"] = {"toggleAllowNetbot": True}
        with self.assertRaises(ApiError) as caught:
            fake.createObject("workflows", NAMESPACE, broken)
        self.assertEqual(caught.exception.code, 422)
        self.assertIn("toggleAllowNetbot", str(caught.exception))
        self.assertEqual(fake.workflows, {})
        stored = fake.createObject("workflows", NAMESPACE, sampleWorkflow())
        self.assertEqual(stored["spec"], sampleWorkflow()["spec"])
