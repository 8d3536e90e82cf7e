"""
A Tinkerbell Template read as Tinkerbell reads it, for
L{tests.test_enrollment_template}.

Reimplemented from tinkerbell/tinkerbell at commit
9111b51c992046ce14a9a57f612f9ef0ffb0d698:

  - C{crd/bases/v1alpha1/tinkerbell.org_templates.yaml} and
    C{api/v1alpha1/tinkerbell/template.go}: group C{tinkerbell.org},
    version C{v1alpha1}, kind C{Template}; C{spec} holds only C{data}, a
    string (a structural CRD prunes anything else);
  - C{tink/controller/internal/workflow/template_funcs.go},
    C{renderTemplate}: C{spec.data} is a Go C{text/template} executed with
    C{missingkey=error} over the Workflow's C{hardwareMap} (plus
    C{Hardware}, C{references}: C{reconciler.go}); here only C{{{.key}}}
    actions are supported, anything else is refused;
  - C{tink/controller/internal/workflow/types.go}: the workflow's fields
    and their Go types (C{yaml.v3} into typed structs);
  - C{tink/controller/internal/workflow/template_validator.go},
    C{parse}/C{validate}/C{renderTemplateHardware}: names 1 to 199
    characters, at least one task, task names unique, action names unique
    in their task, each image a reference
    C{reference.ParseNormalizedNamed} accepts, each task's worker not
    empty once rendered;
  - C{tink/controller/internal/workflow/convert.go}, C{YAMLToStatus}:
    "only support single Task Workflows" (the first task's worker is the
    agent).

Two rules are stricter than Tinkerbell on purpose: C{yaml.v3} ignores a
key it does not know (a misspelled C{enviroment} is dropped without a
word), and converts scalars into string fields; here both are errors.

The image reference grammar is distribution/reference's C{regexp.go} and
C{normalize.go} (C{ParseNormalizedNamed}: lowercase repository, no bare
64-hex identifier, name at most 255 characters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

GROUP_VERSION = "tinkerbell.org/v1alpha1"


class TemplateError(Exception):
    """One line: why Tinkerbell would refuse (or silently change) it."""


# distribution/reference regexp.go
_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|[-]+)"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = (
    rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[(?:[a-fA-F0-9:]+)\])"
    r"(?::[0-9]+)?"
)
_PATH = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"^({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?$")
_IDENTIFIER = re.compile(r"^[a-f0-9]{64}$")


def parseNormalizedNamed(image: str) -> str:
    """The repository name of C{image}, as Docker would pull it."""
    if _IDENTIFIER.match(image):
        raise TemplateError(f"invalid repository name ({image}): 64-byte hex")
    first, slash, rest = image.partition("/")
    isDomain = first == "localhost" or any(c in ".:" for c in first)
    if not slash:
        domain, remainder = "docker.io", "library/" + image
    elif isDomain or first.lower() != first:
        domain, remainder = first, rest
    else:
        domain, remainder = "docker.io", image
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        raise TemplateError(f"repository name ({remote}) must be lowercase")
    match = _REFERENCE.match(f"{domain}/{remainder}")
    if match is None:
        raise TemplateError(f"invalid reference format: {image}")
    if len(match.group(1)) > 255:
        raise TemplateError(f"repository name too long: {image}")
    return match.group(1)


_ACTION = re.compile(r"{{(.*?)}}", re.DOTALL)
_FIELD = re.compile(r"^-?\s*\.([A-Za-z_][A-Za-z0-9_]*)\s*-?$")


def render(data: str, hardwareMap: dict[str, str]) -> str:
    """
    C{data} executed as a Go template over C{hardwareMap} with
    C{missingkey=error}; only C{{{.key}}} is supported.
    """

    def field(match: re.Match[str]) -> str:
        key = _FIELD.match(match.group(1).strip())
        if key is None:
            raise TemplateError(f"unsupported template action {match.group(0)}")
        if key.group(1) not in hardwareMap:
            raise TemplateError(
                f'map has no entry for key "{key.group(1)}" (missingkey=error)'
            )
        return hardwareMap[key.group(1)]

    return _ACTION.sub(field, data)


@dataclass(frozen=True)
class Action:
    name: str
    image: str
    timeout: int
    command: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    volumes: list[str] = field(default_factory=list)
    pid: str = ""


@dataclass(frozen=True)
class Task:
    name: str
    worker: str
    actions: list[Action]
    volumes: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Workflow:
    version: str
    name: str
    globalTimeout: int
    tasks: list[Task]


# types.go: yaml key -> Go type (str, int, list of str, map of str).
_WORKFLOW = {
    "version": str, "name": str, "id": str, "global_timeout": int, "tasks": list,
}  # fmt: skip
_TASK = {
    "name": str, "worker": str, "actions": list, "volumes": "strings",
    "environment": "map",
}  # fmt: skip
_ACTION_KEYS = {
    "name": str, "image": str, "timeout": int, "command": "strings",
    "on-timeout": "strings", "on-failure": "strings", "volumes": "strings",
    "environment": "map", "pid": str, "namespaces": dict,
}  # fmt: skip


def _typed(where: str, raw: Any, schema: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TemplateError(f"{where}: not a mapping")
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise TemplateError(f"{where}: unknown keys {unknown} (yaml.v3 drops them)")
    for key, kind in schema.items():
        value = raw.get(key)
        if value is None:
            continue
        if kind == "strings":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif kind == "map":
            ok = isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            )
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise TemplateError(f"{where}: {key} is {value!r}, not a Go {kind}")
    return raw


def _validName(name: str) -> bool:
    return 0 < len(name) < 200


def parseWorkflow(rendered: str) -> Workflow:
    """template_validator.go's C{parse} and C{validate}, then one task."""
    try:
        loaded = yaml.safe_load(rendered)
    except yaml.YAMLError as e:
        raise TemplateError(f"parsing yaml data: {e}".splitlines()[0]) from None
    raw = _typed("workflow", loaded, _WORKFLOW)
    tasks = []
    for index, rawTask in enumerate(raw.get("tasks") or []):
        task = _typed(f"task {index}", rawTask, _TASK)
        actions = []
        for number, rawAction in enumerate(task.get("actions") or []):
            action = _typed(f"action {number}", rawAction, _ACTION_KEYS)
            actions.append(
                Action(
                    name=action.get("name") or "",
                    image=action.get("image") or "",
                    timeout=action.get("timeout") or 0,
                    command=list(action.get("command") or []),
                    environment=dict(action.get("environment") or {}),
                    volumes=list(action.get("volumes") or []),
                    pid=action.get("pid") or "",
                )
            )
        tasks.append(
            Task(
                name=task.get("name") or "",
                worker=task.get("worker") or "",
                actions=actions,
                volumes=list(task.get("volumes") or []),
                environment=dict(task.get("environment") or {}),
            )
        )
    workflow = Workflow(
        version=raw.get("version") or "",
        name=raw.get("name") or "",
        globalTimeout=raw.get("global_timeout") or 0,
        tasks=tasks,
    )
    _validate(workflow)
    return workflow


def _validate(workflow: Workflow) -> None:
    if not _validName(workflow.name):
        raise TemplateError(f"name cannot be empty or 200+ characters: {workflow.name}")
    if not workflow.tasks:
        raise TemplateError("template must have at least one task defined")
    seen: set[str] = set()
    for task in workflow.tasks:
        if not _validName(task.name):
            raise TemplateError(f"name cannot be empty or 200+ characters: {task.name}")
        if task.name in seen:
            raise TemplateError(f"two tasks cannot have same name ({task.name})")
        seen.add(task.name)
        names: set[str] = set()
        for action in task.actions:
            if not _validName(action.name):
                raise TemplateError(f"name cannot be empty: {action.name!r}")
            parseNormalizedNamed(action.image)
            if action.name in names:
                raise TemplateError(f"two actions cannot have same name: {action.name}")
            names.add(action.name)
        if not task.worker:
            raise TemplateError("failed to render template, empty hardware address")
    if len(workflow.tasks) != 1:
        raise TemplateError("Tinkerbell runs single-task workflows only")


def loadTemplate(text: str, hardwareMap: dict[str, str]) -> tuple[str, Workflow]:
    """
    The Template CR in C{text}: its C{metadata.name} and its workflow,
    rendered over C{hardwareMap} and validated.
    """
    document = yaml.safe_load(text)
    if not isinstance(document, dict):
        raise TemplateError("not a Kubernetes object")
    if document.get("apiVersion") != GROUP_VERSION:
        raise TemplateError(f"apiVersion {document.get('apiVersion')!r}")
    if document.get("kind") != "Template":
        raise TemplateError(f"kind {document.get('kind')!r}")
    name = (document.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not re.fullmatch(
        r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name
    ):
        raise TemplateError(f"metadata.name {name!r} is not a DNS subdomain")
    spec = document.get("spec")
    if not isinstance(spec, dict) or set(spec) != {"data"}:
        raise TemplateError("spec must hold only data (the CRD prunes the rest)")
    if not isinstance(spec["data"], str):
        raise TemplateError("spec.data must be a string")
    return name, parseWorkflow(render(spec["data"], hardwareMap))
