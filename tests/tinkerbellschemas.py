"""
Tinkerbell's own CRD schemas, to check the objects fleetd writes (issue 28,
item 6).

The manifests are Tinkerbell's, copied with their repository, path and
commit in C{tests/data/tinkerbell/README.md}. Generation C{"tinkerbell"} is
the monorepo C{tinkerbell/tinkerbell} (C{crd/bases/v1alpha1/}); C{"tink"}
is the last release of C{tinkerbell/tink}, v0.12.2 (C{config/crd/bases/}).
L{validate} checks one object against one generation as the API server
would (C{apiVersion}, C{kind}, C{metadata}, then C{spec} and C{status}
against the served version's C{openAPIV3Schema}: L{tests.kubeschema}, which
also says where this is stricter than the server: unknown fields are
refused, not pruned) and raises L{SchemaError}, one line naming each
failing path. The object is checked as the server stores it:
C{metadata.namespace} must be set (the server fills it from the request
path; L{stored} does the same).

The hook for the strict Kubernetes fake (L{fleetd.testing.kube}, which
cannot import C{tests/}): before it stores a C{Hardware}, C{Workflow} or
C{Template} (create or update), the fake calls, if it was given one::

    checkObject(kind: str, obj: dict[str, Any]) -> str | None

with the object as it would store it (namespace filled from the path). The
answer is L{None}, or one line the fake returns as the message of a 422
C{Invalid} Status. L{checkObject} checks both generations (an object
fleetd writes must suit a site on either); L{checkerFor} makes one for the
generations given; any other kind is not its business (L{None}).
L{validating} sets the hook on a fake whose attribute is C{validator}
(L{fleetd.testing.kube.FakeKube}).

L{sampleHardware} and L{sampleWorkflow} build objects in the shape issue 28
describes, for tests to start from.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from jsonschema.protocols import Validator

from tests.kubeschema import (
    UnsupportedSchema,
    compileSchema,
    metadataProblems,
    schemaProblems,
    show,
)

DATA = Path(__file__).resolve().parent / "data" / "tinkerbell"
GROUP = "tinkerbell.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
GENERATIONS = ("tinkerbell", "tink")
KINDS = ("Hardware", "Workflow", "Template")
_PLURALS = {"Hardware": "hardware", "Workflow": "workflows", "Template": "templates"}
# tink v0.12.2's Template schema is the monorepo's (the README): not kept twice.
_FOLDERS = {"tinkerbell": dict.fromkeys(KINDS, "tinkerbell")} | {
    "tink": {"Hardware": "tink", "Workflow": "tink", "Template": "tinkerbell"}
}

Checker = Callable[[str, dict[str, Any]], str | None]


class SchemaError(Exception):
    """An object Tinkerbell's API server would refuse or change; one line."""

    def __init__(self, kind: str, name: str, generation: str, problems: list[str]):
        self.problems = problems
        super().__init__(
            f'{kind}.{GROUP} "{name}" is invalid ({generation} schema): '
            + "; ".join(problems)
        )


@dataclass(frozen=True)
class CRD:
    """One kind of one generation: its manifest and its served schema."""

    kind: str
    generation: str
    path: Path
    namespaced: bool
    schema: dict[str, Any]
    validator: Validator


@functools.cache
def crd(kind: str, generation: str = "tinkerbell") -> CRD:
    """The C{v1alpha1} definition of C{kind} in C{generation}."""
    if generation not in GENERATIONS or kind not in KINDS:
        raise ValueError(f"no {kind} CRD of generation {generation!r}")
    path = DATA / _FOLDERS[generation][kind] / f"{GROUP}_{_PLURALS[kind]}.yaml"
    manifest = yaml.safe_load(path.read_text())
    spec = manifest["spec"]
    if (manifest["kind"], spec["group"], spec["names"]["kind"]) != (
        "CustomResourceDefinition",
        GROUP,
        kind,
    ):
        raise UnsupportedSchema(f"{path}: not the {kind}.{GROUP} CRD")
    served = [v for v in spec["versions"] if v["name"] == VERSION and v["served"]]
    if len(served) != 1:
        raise UnsupportedSchema(f"{path}: {VERSION} is not served")
    schema = served[0]["schema"]["openAPIV3Schema"]
    namespaced = spec["scope"] == "Namespaced"
    return CRD(kind, generation, path, namespaced, schema, compileSchema(schema))


def problems(kind: str, obj: Any, generation: str = "tinkerbell") -> list[str]:
    """Each reason the API server of C{generation} would refuse or change C{obj}."""
    definition = crd(kind, generation)
    if not isinstance(obj, dict):
        return [f"<root>: Invalid value: {show(obj)}: must be an object"]
    out = []
    if obj.get("apiVersion") != API_VERSION:
        out.append(
            f"apiVersion: Invalid value: {show(obj.get('apiVersion'))}:"
            f" must be {API_VERSION}"
        )
    if obj.get("kind") != kind:
        out.append(f"kind: Invalid value: {show(obj.get('kind'))}: must be {kind}")
    out += metadataProblems(obj.get("metadata"), definition.namespaced)
    body = {key: value for key, value in obj.items() if key != "metadata"}
    return out + schemaProblems(definition.validator, body)


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def validate(kind: str, obj: Any, generation: str = "tinkerbell") -> None:
    """
    Check C{obj} against the C{kind} CRD of C{generation} (C{"tinkerbell"}
    or C{"tink"}).

    @raise SchemaError: one line naming each failing path.
    """
    found = problems(kind, obj, generation)
    if found:
        raise SchemaError(kind, _name(obj), generation, found)


def checkerFor(*generations: str) -> Checker:
    """A L{checkObject} for C{generations} (all of them when none are named)."""
    chosen = generations or GENERATIONS
    unknown = set(chosen) - set(GENERATIONS)
    if unknown:
        raise ValueError(f"unknown generations: {sorted(unknown)}")

    def check(kind: str, obj: dict[str, Any]) -> str | None:
        if kind not in KINDS:
            return None
        for generation in chosen:
            found = problems(kind, obj, generation)
            if found:
                return str(SchemaError(kind, _name(obj), generation, found))
        return None

    return check


_BOTH = checkerFor(*GENERATIONS)


def checkObject(kind: str, obj: dict[str, Any]) -> str | None:
    """
    The fake's hook: L{None} if C{obj} (a C{kind} as stored) suits both
    generations' schemas, else the first generation's line of problems.
    Kinds other than Tinkerbell's are not checked.
    """
    return _BOTH(kind, obj)


class Checkable(Protocol):
    """A Kubernetes fake that calls C{validator} before storing, when set."""

    validator: Checker | None


F = TypeVar("F", bound=Checkable)


def validating(fake: F, checker: Checker = checkObject) -> F:
    """C{fake}, refusing (422) every Tinkerbell object C{checker} refuses."""
    fake.validator = checker
    return fake


def stored(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """
    C{obj} as the API server stores it when posted to C{namespace}'s path
    (as C{kubectl apply -n} does with a manifest naming no namespace).
    """
    copied: dict[str, Any] = copy.deepcopy(dict(obj))
    copied.setdefault("metadata", {}).setdefault("namespace", namespace)
    return copied


def loadManifests(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of a manifest file (empty ones skipped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


# Samples in the shape issue 28 describes, for tests to start from.

NAMESPACE = "tink-system"
TEMPLATE = "fleetd-talos-install"
SAMPLE_MAC = "3c:ec:ef:00:00:01"
SAMPLE_IMAGE = "https://images.example/talos/v1.9.0/metal-amd64.raw.zst"


def fleetdLabels(device: str) -> dict[str, str]:
    """Labels naming fleetd and the device (the feature may choose other keys)."""
    return {"app.kubernetes.io/managed-by": "fleetd", "fleetd/device": device}


def sampleHardware(
    device: str = "node-01",
    macs: Sequence[str] = (SAMPLE_MAC,),
    *,
    namespace: str = NAMESPACE,
    address: str | None = None,
    allow: bool = True,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """
    A device's C{Hardware}: one interface per MAC (lowercase, colons: the
    schema's pattern), C{netboot.allowPXE}/C{allowWorkflow} C{allow} (false
    after retirement; both are C{*bool} upstream, so false is kept), the
    inventory C{address} on the first interface where known.
    """
    interfaces: list[dict[str, Any]] = []
    for mac in macs:
        dhcp: dict[str, Any] = {"mac": mac}
        if address is not None and not interfaces:
            dhcp["ip"] = {"address": address, "family": 4}
        netboot = {"allowPXE": allow, "allowWorkflow": allow}
        interfaces.append({"dhcp": dhcp, "netboot": netboot})
    return {
        "apiVersion": API_VERSION,
        "kind": "Hardware",
        "metadata": {
            "name": device,
            "namespace": namespace,
            "labels": dict(fleetdLabels(device) if labels is None else labels),
        },
        "spec": {"interfaces": interfaces},
    }


def sampleWorkflow(
    device: str = "node-01",
    run: str = "r1",
    *,
    mac: str = SAMPLE_MAC,
    image: str = SAMPLE_IMAGE,
    template: str = TEMPLATE,
    namespace: str = NAMESPACE,
    toggleAllowNetboot: bool = True,
    bootMode: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """
    The C{Workflow} of one run: named after the device and the run,
    C{templateRef} the class's Template, C{hardwareRef} the device's
    Hardware, C{hardwareMap} with C{device_1} (the MAC) and C{talos_image},
    and C{bootOptions} (C{bootMode} only when given: C{netboot} and C{iso}
    suit both generations).
    """
    bootOptions: dict[str, Any] = {"toggleAllowNetboot": toggleAllowNetboot}
    if bootMode is not None:
        bootOptions["bootMode"] = bootMode
    return {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": f"{device}-{run}",
            "namespace": namespace,
            "labels": dict(fleetdLabels(device) if labels is None else labels),
        },
        "spec": {
            "templateRef": template,
            "hardwareRef": device,
            "hardwareMap": {"device_1": mac, "talos_image": image},
            "bootOptions": bootOptions,
        },
    }
