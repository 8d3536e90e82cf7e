"""
[K3] Does the cluster still auto-approve bootstrap CSRs?

The controller manager's C{csrapproving} controller approves a first
kubelet certificate for any requester that RBAC allows
C{create} on C{certificatesigningrequests/nodeclient} (notes
kube-netbox.md section 2.5); Talos binds that to
C{system:bootstrappers:nodes}. fleetd cannot read the controller
manager's flags through the API, so it checks what it can: every
ClusterRoleBinding that gives a bootstrappers group (C{system:bootstrappers}
or C{system:bootstrappers:*}) the C{nodeclient} ClusterRole, or any
ClusterRole whose rules allow that subresource. Found at start-up and
every C{interval}: gauge C{fleetd_kube_autoapprove_bindings} and a
warning naming them; C{fleetd_kube_rbac_check_success} says whether the
last check could read RBAC at all.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from fleetd.kube.client import KubeClient, KubeError

NODECLIENT_ROLE = "system:certificates.k8s.io:certificatesigningrequests:nodeclient"
BOOTSTRAPPERS = "system:bootstrappers"


def _grantsNodeclient(role: dict[str, Any]) -> bool:
    for rule in role.get("rules") or []:
        groups = rule.get("apiGroups") or []
        resources = rule.get("resources") or []
        verbs = rule.get("verbs") or []
        if not ({"certificates.k8s.io", "*"} & set(groups)):
            continue
        if not ({"certificatesigningrequests/nodeclient", "*"} & set(resources)):
            continue
        if {"create", "*"} & set(verbs):
            return True
    return False


def autoApproveBindings(
    bindings: list[dict[str, Any]], roles: list[dict[str, Any]]
) -> list[str]:
    """Names of bindings that let a bootstrappers group get auto-approved."""
    granting = {NODECLIENT_ROLE}
    granting |= {
        str(r.get("metadata", {}).get("name")) for r in roles if _grantsNodeclient(r)
    }
    found = []
    for binding in bindings:
        ref = binding.get("roleRef") or {}
        if ref.get("kind") != "ClusterRole" or ref.get("name") not in granting:
            continue
        for subject in binding.get("subjects") or []:
            name = str(subject.get("name", ""))
            if subject.get("kind") == "Group" and (
                name == BOOTSTRAPPERS or name.startswith(BOOTSTRAPPERS + ":")
            ):
                found.append(str(binding.get("metadata", {}).get("name")))
                break
    return sorted(found)


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
            "ClusterRoleBindings that let bootstrap tokens be auto-approved [K3].",
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
        found = autoApproveBindings(bindings, roles)
        self.found = found
        self.success.set(1)
        self.gauge.set(len(found))
        if found:
            self.log.warn(
                "kube.rbac.autoapprove {bindings}: bootstrap tokens can still be"
                " auto-approved; remove these bindings and set -csrapproving [K3]",
                bindings=",".join(found),
            )
        return found
