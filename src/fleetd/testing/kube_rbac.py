"""
The API server's rules for the RBAC objects the fake serves (pure
functions): ClusterRoles, Roles, ClusterRoleBindings and RoleBindings, as
C{pkg/apis/rbac/validation} checks them (notes kube-netbox.md section 2.5;
kubernetes/kubernetes C{pkg/apis/rbac/validation/validation.go}):

  - names are path segment names (not C{.} or C{..}, no C{/} or C{%}), so
    C{system:...} names are fine;
  - a binding's C{roleRef} names C{apiGroup: rbac.authorization.k8s.io}, a
    C{ClusterRole} (ClusterRoleBindings) or a C{Role} or C{ClusterRole}
    (RoleBindings), and a name;
  - each subject has a name and a kind among C{User}, C{Group},
    C{ServiceAccount}; users and groups carry C{apiGroup:
    rbac.authorization.k8s.io}, service accounts an empty apiGroup and,
    in a ClusterRoleBinding, a namespace (a RoleBinding's defaults to its
    own).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Sequence
from typing import Any

from twisted.internet.interfaces import IReactorTime

from fleetd.testing.kube_rules import ApiError, invalid, rfc3339

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_VERSION = f"{RBAC_GROUP}/v1"


def checkName(name: object, field: str = "metadata.name") -> str:
    """A path segment name, as RBAC objects' names and roleRefs are."""
    if not isinstance(name, str) or not name:
        raise invalid(f"{field}: Required value: name is required")
    if name in (".", "..") or "/" in name or "%" in name:
        raise invalid(f"{field}: Invalid value: {name!r}: not a path segment name")
    return name


def checkBinding(obj: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """A ClusterRoleBinding (C{namespace} L{None}) or a RoleBinding in
    C{namespace}, as the API server accepts it; raises 422 otherwise."""
    checkName((obj.get("metadata") or {}).get("name"))
    ref = obj.get("roleRef") or {}
    kinds = ("ClusterRole",) if namespace is None else ("Role", "ClusterRole")
    if ref.get("apiGroup") != RBAC_GROUP:
        raise invalid(f"roleRef.apiGroup: Unsupported value: {ref.get('apiGroup')!r}")
    if ref.get("kind") not in kinds:
        raise invalid(f"roleRef.kind: Unsupported value: {ref.get('kind')!r}")
    checkName(ref.get("name"), "roleRef.name")
    for i, subject in enumerate(obj.get("subjects") or []):
        where = f"subjects[{i}]"
        kind = subject.get("kind")
        if not subject.get("name"):
            raise invalid(f"{where}.name: Required value")
        if kind == "ServiceAccount":
            if subject.get("apiGroup"):
                raise invalid(f"{where}.apiGroup: Unsupported value")
            if namespace is None and not subject.get("namespace"):
                raise invalid(f"{where}.namespace: Required value")
        elif kind in ("User", "Group"):
            if subject.get("apiGroup") != RBAC_GROUP:
                raise invalid(f"{where}.apiGroup: Unsupported value")
        else:
            raise invalid(f"{where}.kind: Unsupported value: {kind!r}")
    return obj


def binding(
    name: str,
    role: str,
    subjects: list[dict[str, str]],
    *,
    namespace: str | None = None,
    roleKind: str = "ClusterRole",
) -> dict[str, Any]:
    """A ClusterRoleBinding, or with C{namespace} a RoleBinding."""
    metadata = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": RBAC_VERSION,
        "kind": "ClusterRoleBinding" if namespace is None else "RoleBinding",
        "metadata": metadata,
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": roleKind, "name": role},
        "subjects": subjects,
    }


def role(
    name: str, rules: list[dict[str, Any]], namespace: str | None = None
) -> dict[str, Any]:
    """A ClusterRole, or with C{namespace} a Role."""
    checkName(name)
    metadata = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    kind = "ClusterRole" if namespace is None else "Role"
    return {
        "apiVersion": RBAC_VERSION,
        "kind": kind,
        "metadata": metadata,
        "rules": rules,
    }


def group(name: str) -> dict[str, str]:
    return {"kind": "Group", "name": name, "apiGroup": RBAC_GROUP}


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "name": name, "apiGroup": RBAC_GROUP}


def serviceAccount(name: str, namespace: str | None = None) -> dict[str, str]:
    subject = {"kind": "ServiceAccount", "name": name}
    if namespace is not None:
        subject["namespace"] = namespace
    return subject


class FakeRBAC:
    """The RBAC part of L{fleetd.testing.kube.FakeKube}: its stores and the
    test controls that fill them."""

    clock: IReactorTime
    bindings: dict[str, dict[str, Any]]
    roles: dict[str, dict[str, Any]]
    roleBindings: dict[str, dict[str, Any]]  # "namespace/name"
    namespacedRoles: dict[str, dict[str, Any]]  # "namespace/name"

    def _store(
        self,
        store: dict[str, dict[str, Any]],
        name: str,
        obj: dict[str, Any],
        kind: str,
    ) -> None:
        raise NotImplementedError

    def addBinding(
        self,
        name: str,
        role: str,
        groups: Sequence[str] = (),
        *,
        subjects: Sequence[dict[str, str]] = (),
    ) -> None:
        """A ClusterRoleBinding of C{role} to C{groups} and C{subjects}
        (L{fleetd.testing.kube_rbac} C{user}, C{serviceAccount}...)."""
        everyone = [group(g) for g in groups] + list(subjects)
        self.createBinding(binding(name, role, everyone), None)

    def addRoleBinding(
        self,
        namespace: str,
        name: str,
        role: str,
        subjects: list[dict[str, str]],
        roleKind: str = "ClusterRole",
    ) -> None:
        """A RoleBinding in C{namespace} of a C{roleKind} to C{subjects}."""
        obj = binding(name, role, subjects, namespace=namespace, roleKind=roleKind)
        self.createBinding(obj, namespace)

    def addRole(
        self, name: str, rules: list[dict[str, Any]], namespace: str | None = None
    ) -> None:
        """A ClusterRole, or with C{namespace} a Role."""
        self.createRole(role(name, rules, namespace), namespace)

    def createBinding(
        self, body: dict[str, Any], namespace: str | None
    ) -> dict[str, Any]:
        """A ClusterRoleBinding (C{namespace} L{None}) or RoleBinding, checked
        as the API server does (L{fleetd.testing.kube_rbac})."""
        obj = checkBinding(body, namespace)
        if namespace is None:
            return self._createRBAC(self.bindings, obj["metadata"]["name"], obj)
        obj["metadata"]["namespace"] = namespace
        key = f"{namespace}/{obj['metadata']['name']}"
        return self._createRBAC(self.roleBindings, key, obj)

    def createRole(self, body: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        name = checkName((body.get("metadata") or {}).get("name"))
        if namespace is None:
            return self._createRBAC(self.roles, name, body)
        body["metadata"]["namespace"] = namespace
        return self._createRBAC(self.namespacedRoles, f"{namespace}/{name}", body)

    def _createRBAC(
        self, store: dict[str, dict[str, Any]], key: str, obj: dict[str, Any]
    ) -> dict[str, Any]:
        if key in store:
            raise ApiError(409, "AlreadyExists", f'"{key}" already exists')
        meta = obj["metadata"]
        meta["uid"] = str(uuidlib.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock.seconds())
        self._store(store, key, obj, "ADDED")
        return obj
