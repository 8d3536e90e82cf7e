"""
Tinkerbell's objects in the strict Kubernetes fake: C{Hardware} and
C{Workflow} (C{tinkerbell.org/v1alpha1}, namespaced custom resources with
a status subresource; notes tinkerbell.md section 3), as the API server
serves a custom resource (apiextensions-apiserver's C{customresource}
strategy):

  - POST into C{/namespaces/NS/PLURAL}: the body's namespace, when given,
    must be the path's (400 BadRequest); the name a DNS subdomain;
    labels valid (422 Invalid); a taken name 409 AlreadyExists; the
    status stanza dropped (the status subresource owns it); C{uid},
    C{creationTimestamp}, C{generation} 1 and a C{resourceVersion} set;
  - GET one (404 NotFound), LIST in one namespace or all, with an
    equality C{labelSelector} (C{k=v}, C{k==v}, C{k!=v}, C{k}, comma-joined);
  - PUT: 404 when absent; C{metadata.resourceVersion} required (422: a
    custom resource has no unconditional update), a stale one 409
    Conflict; a C{uid} that is not the object's 409; the status stanza
    kept as stored; C{generation} bumped when the spec changed;
  - DELETE: 404 when absent; C{preconditions} (C{uid}, C{resourceVersion})
    of the DeleteOptions body checked (409 Conflict); a DELETED event;
  - the whole group 404 while the CRDs are absent (C{workflowsInstalled}).

An optional C{validator(kind, obj)} (L{None} by default) is asked on every
create and update: a line it returns refuses the object with 422 Invalid
(the CRDs' OpenAPI schemas, wired by the tests).

The test plays everyone else: tink-controller (L{addWorkflow},
L{setWorkflowState}, which also fills a fleetd-made Workflow's
C{status.agentID} from its C{hardwareMap.device_1}), an operator's
hand-made objects (L{addHardware}), and someone deleting or editing a
Workflow (L{deleteWorkflow}, L{editWorkflow}).
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime

from fleetd.testing.kube_rules import (
    SUBDOMAIN,
    ApiError,
    checkLabels,
    invalid,
    modified,
    namespaceMismatch,
    rfc3339,
    selects,
)

GROUP_VERSION = "tinkerbell.org/v1alpha1"
KINDS = {"hardware": "Hardware", "workflows": "Workflow"}
MONOREPO_STATES = (
    "PREPARING",
    "PENDING",
    "RUNNING",
    "POST",
    "SUCCESS",
    "FAILED",
    "TIMEOUT",
)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
Store = dict[str, dict[str, Any]]
Validator = Callable[[str, dict[str, Any]], str | None]


def _notFound(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural}.tinkerbell.org "{name}" not found')


def _checkPlace(namespace: str, name: str | None) -> str:
    """A namespace and a name (L{None}: none given) the API server takes
    (422 Invalid); return the name."""
    if _NAMESPACE.fullmatch(namespace) is None:
        raise invalid(f"metadata.namespace: Invalid value: {namespace!r}")
    if name is None:
        raise invalid("metadata.name: Required value: name is required")
    if len(name) > 253 or SUBDOMAIN.fullmatch(name) is None:
        raise invalid(f"metadata.name: Invalid value: {name!r}")
    return name


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(obj))
    return copied


class FakeTinkerbell:
    """The Tinkerbell part of L{fleetd.testing.kube.FakeKube}."""

    clock: IReactorTime
    workflows: Store  # "namespace/name"
    hardware: Store  # "namespace/name"
    workflowsInstalled: bool  # both CRDs
    validator: Validator | None
    rv: int

    def _store(self, store: Store, name: str, obj: dict[str, Any], kind: str) -> None:
        raise NotImplementedError

    def deleteFrom(self, store: Store, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def _tinkStore(self, plural: str) -> Store:
        return self.hardware if plural == "hardware" else self.workflows

    # The API (routed by fleetd.testing.kube_http)

    def tinkerbellCall(
        self,
        method: str,
        plural: str,
        namespace: str | None,
        name: str | None,
        selector: str | None,
        body: dict[str, Any],
    ) -> Any:
        """One call on C{plural} (C{hardware} or C{workflows}), but a watch."""
        store = self._tinkStore(plural)
        if name is None and method == "GET":
            items = [
                _copy(o)
                for _, o in sorted(store.items())
                if namespace in (None, o["metadata"]["namespace"])
                and selects(selector, o["metadata"].get("labels") or {})
            ]
            return {
                "kind": f"{KINDS[plural]}List",
                "apiVersion": GROUP_VERSION,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        if namespace is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} needs a namespace")
        if name is None and method == "POST":
            return self.createObject(plural, namespace, body)
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not modelled here")
        if method == "GET":
            return _copy(self._existing(plural, namespace, name)[2])
        if method == "PUT":
            return self.updateObject(plural, namespace, name, body)
        if method == "DELETE":
            return self.deleteObject(plural, namespace, name, body)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not modelled here")

    def _existing(
        self, plural: str, namespace: str, name: str
    ) -> tuple[Store, str, dict[str, Any]]:
        """The stored object, its store and key; 404 NotFound when absent."""
        store = self._tinkStore(plural)
        key = f"{namespace}/{name}"
        current = store.get(key)
        if current is None:
            raise _notFound(plural, name)
        return store, key, current

    def _check(self, plural: str, namespace: str, obj: dict[str, Any]) -> None:
        """The body of a create or an update, its namespace the path's: its
        kind, metadata, labels and the validator's word."""
        if obj.get("apiVersion") != GROUP_VERSION or obj.get("kind") != KINDS[plural]:
            raise ApiError(
                400,
                "BadRequest",
                f"the body is not a {GROUP_VERSION} {KINDS[plural]}",
            )
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise invalid("metadata: Required value")
        meta["namespace"] = namespace  # from the path, as the server stores it
        checkLabels(meta.get("labels"))
        if self.validator is not None:
            problem = self.validator(KINDS[plural], _copy(obj))
            if problem is not None:
                raise invalid(f"{KINDS[plural]}.{GROUP_VERSION}: {problem}")

    def createObject(
        self, plural: str, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        obj = _copy(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            raise namespaceMismatch()
        given = meta.get("name")
        name = _checkPlace(
            namespace, given if isinstance(given, str) and given else None
        )
        self._check(plural, namespace, obj)
        store = self._tinkStore(plural)
        key = f"{namespace}/{name}"
        if key in store:
            raise ApiError(
                409, "AlreadyExists", f'{plural}.tinkerbell.org "{name}" already exists'
            )
        for server in ("uid", "resourceVersion", "creationTimestamp", "generation"):
            meta.pop(server, None)
        meta.update(
            namespace=namespace,
            uid=str(uuidlib.uuid4()),
            creationTimestamp=rfc3339(self.clock.seconds()),
            generation=1,
        )
        obj.pop("status", None)  # the status subresource's
        self._store(store, key, obj, "ADDED")
        return _copy(obj)

    def updateObject(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        store, key, current = self._existing(plural, namespace, name)
        obj = _copy(body)
        meta = obj.get("metadata") or {}
        if meta.get("name") != name or meta.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the name of the object does not match")
        version = meta.get("resourceVersion")
        if not version:
            raise invalid(
                "metadata.resourceVersion: Invalid value: 0x0: must be specified"
                " for an update"
            )
        was = current["metadata"]
        if meta.get("uid") not in (None, was["uid"]):
            raise ApiError(409, "Conflict", f"Precondition failed: UID of {name}")
        if version != was["resourceVersion"]:
            raise modified(f"{plural}.tinkerbell.org", name)
        self._check(plural, namespace, obj)
        for server in ("uid", "creationTimestamp", "namespace"):
            meta[server] = was[server]
        changed = obj.get("spec") != current.get("spec")
        meta["generation"] = was.get("generation", 1) + (1 if changed else 0)
        obj["metadata"] = meta
        obj.pop("status", None)
        if "status" in current:
            obj["status"] = current["status"]
        self._store(store, key, obj, "MODIFIED")
        return _copy(obj)

    def deleteObject(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        store, key, current = self._existing(plural, namespace, name)
        wanted = body.get("preconditions") or {}
        meta = current["metadata"]
        for field in ("uid", "resourceVersion"):
            if wanted.get(field) not in (None, meta[field]):
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: {field} in precondition:"
                    f" {wanted[field]}, {field} in object meta: {meta[field]}",
                )
        self.deleteFrom(store, key)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    # Everyone else (the test)

    def addWorkflow(
        self,
        namespace: str,
        name: str,
        agentID: str,
        *,
        state: str = "PENDING",
        hardwareRef: str = "",
        v012: bool = False,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """
        A Workflow for the agent C{agentID} (a MAC, usually), made by hand
        and as tink-controller leaves it once its template is rendered.
        C{v012}: tink v0.12's shape (states prefixed C{STATE_}, the worker
        id in C{status.tasks[].worker}, no C{status.agentID}).
        """
        _checkPlace(namespace, name)
        key = f"{namespace}/{name}"
        if key in self.workflows:
            raise ApiError(409, "AlreadyExists", f'"{name}" already exists')
        task: dict[str, Any] = {"name": "install", "actions": [{"name": "image"}]}
        status: dict[str, Any] = {}
        if v012:
            task["worker"] = agentID
        else:
            task["id"] = "t0"
            task["agentID"] = agentID
            status["agentID"] = agentID
        status["tasks"] = [task]
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": str(uuidlib.uuid4()),
            "creationTimestamp": rfc3339(self.clock.seconds()),
            "generation": 1,
        }
        if labels:
            meta["labels"] = dict(labels)
        obj: dict[str, Any] = {
            "apiVersion": GROUP_VERSION,
            "kind": "Workflow",
            "metadata": meta,
            "spec": {
                "templateRef": "talos",
                "hardwareRef": hardwareRef,
                "hardwareMap": {"device_1": agentID},
            },
            "status": status,
        }
        self._setState(obj, state, v012)
        self._store(self.workflows, key, obj, "ADDED")
        self.flush()
        return obj

    def setWorkflowState(self, namespace: str, name: str, state: str) -> None:
        """tink-controller (or tink-server) moves the Workflow to C{state};
        a Workflow it has not touched yet gets its agent id from
        C{hardwareMap.device_1}, as its template's worker."""
        key = f"{namespace}/{name}"
        current = self.workflows.get(key)
        if current is None:
            raise ApiError(404, "NotFound", f'"{name}" not found')
        updated = _copy(current)
        status = updated.setdefault("status", {})
        tasks = status.get("tasks") or []
        v012 = bool(tasks) and "worker" in tasks[0]
        if not tasks:
            agent = ((updated.get("spec") or {}).get("hardwareMap") or {}).get(
                "device_1", ""
            )
            status["agentID"] = agent
            status["tasks"] = [
                {"id": "t0", "name": "install", "agentID": agent, "actions": []}
            ]
        self._setState(updated, state, v012)
        self._store(self.workflows, key, updated, "MODIFIED")
        self.flush()

    def deleteWorkflow(self, namespace: str, name: str) -> None:
        """Someone (tink's user, kubectl) deletes the Workflow."""
        self.deleteFrom(self.workflows, f"{namespace}/{name}")
        self.flush()

    def editWorkflow(
        self, namespace: str, name: str, edit: Callable[[dict[str, Any]], None]
    ) -> None:
        """Someone edits the Workflow (C{edit} changes a copy in place)."""
        key = f"{namespace}/{name}"
        updated = _copy(self.workflows[key])
        edit(updated)
        if updated.get("spec") != self.workflows[key].get("spec"):
            meta = updated["metadata"]
            meta["generation"] = meta.get("generation", 1) + 1
        self._store(self.workflows, key, updated, "MODIFIED")
        self.flush()

    def addHardware(
        self,
        namespace: str,
        name: str,
        macs: list[str],
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A Hardware made by hand (by an operator, or another tool)."""
        body: dict[str, Any] = {
            "apiVersion": GROUP_VERSION,
            "kind": "Hardware",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {
                "interfaces": [
                    {
                        "dhcp": {"mac": mac},
                        "netboot": {"allowPXE": True, "allowWorkflow": True},
                    }
                    for mac in macs
                ]
            },
        }
        return self.createObject("hardware", namespace, body)

    @staticmethod
    def _setState(obj: dict[str, Any], state: str, v012: bool) -> None:
        bare = state.removeprefix("STATE_")
        if bare not in MONOREPO_STATES:
            raise invalid(f"status.state: Unsupported value: {state!r}")
        obj["status"]["state"] = f"STATE_{bare}" if v012 else bare
