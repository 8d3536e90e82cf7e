"""
[K3] Does the cluster still auto-approve bootstrap CSRs?

The controller manager's C{csrapproving} controller approves a kubelet
client certificate when a SubjectAccessReview for the CSR's requester
allows C{create} on C{certificatesigningrequests/nodeclient} (any first
certificate) or C{.../selfnodeclient} (a renewal whose requester is the
certificate's CN) (C{pkg/controller/certificates/approver/sarapprove.go};
notes kube-netbox.md section 2.5); Talos binds the first to
C{system:bootstrappers:nodes}. fleetd cannot read the controller
manager's flags through the API, so it checks what it can: every binding
of a role granting either (the built-in C{...:nodeclient} and
C{...:selfnodeclient} ClusterRoles, or any ClusterRole or Role whose rules
allow it, wildcards matched as RBAC matches them) to an identity that a
bootstrap token, a service account or anyone can hold:

  - Groups C{system:bootstrappers}, C{system:bootstrappers:*},
    C{system:authenticated}, C{system:unauthenticated},
    C{system:serviceaccounts} and C{system:serviceaccounts:*};
  - Users C{system:bootstrap:*}, C{system:serviceaccount:*} and
    C{system:anonymous};
  - any ServiceAccount.

ClusterRoleBindings and RoleBindings (named C{namespace/name}) both count
(docs/decisions.md: a RoleBinding does not reach csrapproving's cluster-wide
review today, but shows the intent). C{system:nodes} renewing its own
certificates (Talos's C{system-bootstrap-node-renewal}) is not flagged.
Found at start-up and every C{interval}: gauge
C{fleetd_kube_autoapprove_bindings} and a warning naming each binding, its
subject and its role; C{fleetd_kube_rbac_check_success} says whether the
last check could read all of RBAC (0 when RoleBindings or Roles could not
be read: the cluster-wide findings are still reported).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Gauge
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from fleetd.k8s.client import KubeClient, KubeError

NODECLIENT_ROLE = "system:certificates.k8s.io:certificatesigningrequests:nodeclient"
SELFNODECLIENT_ROLE = (
    "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"
)
BOOTSTRAPPERS = "system:bootstrappers"
_SUBRESOURCES = ("nodeclient", "selfnodeclient")  # the two SARs csrapproving asks
# Groups every bootstrap token, every service account or anyone holds.
_GROUPS = ("system:authenticated", "system:unauthenticated", "system:serviceaccounts")
# User names a bootstrap token or a service account authenticates as.
_USER_PREFIXES = ("system:bootstrap:", "system:serviceaccount:")


class Finding(NamedTuple):
    """One binding that auto-approves: its name (C{namespace/name} for a
    RoleBinding), and why (the subject and the role)."""

    name: str
    why: str


def _grantsNodeclient(role: dict[str, Any]) -> bool:
    """Whether a rule allows C{create} on C{certificatesigningrequests/
    nodeclient} or C{/selfnodeclient}, matched as RBAC matches
    (C{pkg/apis/rbac/v1/evaluation_helpers.go}): apiGroup C{*}, resource
    C{*} or C{*/<subresource>}, verb C{*}; a rule limited to resourceNames
    never matches the nameless SubjectAccessReview csrapproving asks."""
    for rule in role.get("rules") or []:
        groups = set(rule.get("apiGroups") or [])
        resources = set(rule.get("resources") or [])
        verbs = set(rule.get("verbs") or [])
        if rule.get("resourceNames"):
            continue
        if not ({"certificates.k8s.io", "*"} & groups):
            continue
        if not ({"create", "*"} & verbs):
            continue
        for sub in _SUBRESOURCES:
            if {f"certificatesigningrequests/{sub}", f"*/{sub}", "*"} & resources:
                return True
    return False


def _auto(subject: dict[str, Any]) -> bool:
    """Whether a binding's subject is an identity that a bootstrap token,
    a service account or anyone at all can hold."""
    kind, name = subject.get("kind"), str(subject.get("name", ""))
    if kind == "ServiceAccount":
        return True
    if kind == "Group":
        return (
            name in _GROUPS
            or name.startswith(BOOTSTRAPPERS + ":")
            or name == BOOTSTRAPPERS
            or name.startswith("system:serviceaccounts:")
        )
    if kind == "User":
        return name == "system:anonymous" or name.startswith(_USER_PREFIXES)
    return False


def _describe(subject: dict[str, Any]) -> str:
    name = str(subject.get("name", ""))
    if subject.get("kind") == "ServiceAccount" and subject.get("namespace"):
        name = f"{subject['namespace']}/{name}"
    return f"{subject.get('kind')} {name}"


def autoApproveBindings(
    bindings: list[dict[str, Any]],
    roles: list[dict[str, Any]],
    roleBindings: Sequence[dict[str, Any]] = (),
    namespacedRoles: Sequence[dict[str, Any]] = (),
) -> list[Finding]:
    """The bindings (ClusterRoleBindings, then RoleBindings as
    C{namespace/name}) that give a bootstrap token, a service account or
    anyone a role granting C{nodeclient} or C{selfnodeclient}, by name."""
    granting = {NODECLIENT_ROLE, SELFNODECLIENT_ROLE}  # built in, maybe not listed
    granting |= {_name(r) for r in roles if _grantsNodeclient(r)}
    local = {(_namespace(r), _name(r)) for r in namespacedRoles if _grantsNodeclient(r)}
    found = []
    for binding in [*bindings, *roleBindings]:
        ref = binding.get("roleRef") or {}
        namespace = _namespace(binding)
        if ref.get("kind") == "ClusterRole":
            grants = ref.get("name") in granting
        else:  # a Role: of the RoleBinding's own namespace
            grants = namespace is not None and (namespace, ref.get("name")) in local
        if not grants:
            continue
        for subject in binding.get("subjects") or []:
            if _auto(subject):
                name = _name(binding)
                if namespace is not None:
                    name = f"{namespace}/{name}"
                role = f"{ref.get('kind')} {ref.get('name')}"
                found.append(Finding(name, f"{_describe(subject)} -> {role}"))
                break
    return sorted(found)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _namespace(obj: dict[str, Any]) -> str | None:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return str(namespace) if namespace else None


class RBACCheck:
    """The [K3] check, at start and every C{interval} seconds."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        client: KubeClient,
        registry: CollectorRegistry | None,
        interval: float,
    ) -> None:
        self.client = client
        self.interval = interval
        self.found: list[str] | None = None
        self.gauge = Gauge(
            "fleetd_kube_autoapprove_bindings",
            "Bindings that let bootstrap tokens, service accounts or anyone be"
            " auto-approved [K3].",
            registry=registry,
        )
        self.success = Gauge(
            "fleetd_kube_rbac_check_success",
            "1 when the last [K3] check could read the cluster's RBAC.",
            registry=registry,
        )
        self._loop = LoopingCall(self._check)
        self._loop.clock = clock

    def start(self) -> None:
        self._loop.start(self.interval, now=True).addErrback(
            lambda f: self.log.failure("kube.rbac.check-crashed", f)
        )

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def _check(self) -> Deferred[list[str] | None]:
        return Deferred.fromCoroutine(self.check())

    async def check(self) -> list[str] | None:
        try:
            bindings = await self.client.listClusterRoleBindings()
            roles = await self.client.listClusterRoles()
        except KubeError as e:
            self.success.set(0)
            self.log.warn("kube.rbac.check-failed {reason}", reason=str(e))
            return None
        complete = True
        try:
            roleBindings = await self.client.listRoleBindings()
            namespacedRoles = await self.client.listRoles()
        except KubeError as e:
            # Still report what the cluster-wide bindings show.
            complete, roleBindings, namespacedRoles = False, [], []
            self.log.warn(
                "kube.rbac.check-failed {reason}: RoleBindings not checked",
                reason=str(e),
            )
        findings = autoApproveBindings(bindings, roles, roleBindings, namespacedRoles)
        found = [f.name for f in findings]
        self.found = found
        self.success.set(1 if complete else 0)
        self.gauge.set(len(found))
        if found:
            self.log.warn(
                "kube.rbac.autoapprove {bindings}: bootstrap tokens, service"
                " accounts or anyone can still be auto-approved ({why}); remove"
                " these bindings and set -csrapproving [K3]",
                bindings=",".join(found),
                why="; ".join(f"{f.name}: {f.why}" for f in findings),
            )
        return found
