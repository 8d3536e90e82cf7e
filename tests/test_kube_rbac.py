"""
[K3] The auto-approve check: which bindings would let the controller
manager's C{csrapproving} approve a kubelet client certificate for an
identity that anyone, any bootstrap token or any service account can hold,
read from the strict fake API (L{fleetd.testing.kube}), and the fake's own
RBAC rules.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.kube.rbac import NODECLIENT_ROLE, RBACCheck
from fleetd.testing.kube import ApiError, FakeKube
from fleetd.testing.kube_rbac import binding, group, serviceAccount, user

SELFNODECLIENT_ROLE = (
    "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"
)


def rule(resources: list[str], verbs: list[str], **extra: list[str]) -> dict[str, Any]:
    return {
        "apiGroups": extra.pop("apiGroups", ["certificates.k8s.io"]),
        "resources": resources,
        "verbs": verbs,
        **extra,
    }


class Site:
    def __init__(self, test: SynchronousTestCase) -> None:
        self.test = test
        self.clock = Clock()
        self.fake = FakeKube(self.clock)
        self.client = self.fake.client()
        self.registry = CollectorRegistry()
        self.check = RBACCheck(self.clock, self.client, self.registry, 600)

    def found(self) -> list[str] | None:
        d = Deferred.fromCoroutine(self.check.check())
        self.fake.flush()
        result: list[str] | None = self.test.successResultOf(d)
        return result

    def gauge(self, name: str) -> float | None:
        return self.registry.get_sample_value(name)


class SubjectTests(SynchronousTestCase):
    """[K3] Subjects beyond the bootstrappers groups that auto-approve."""

    def test_systemAuthenticated_found(self) -> None:
        """[K3] nodeclient for Group system:authenticated: every bootstrap
        token (and everyone else) is auto-approved."""
        site = Site(self)
        site.fake.addBinding("everyone", NODECLIENT_ROLE, ["system:authenticated"])
        self.assertEqual(site.found(), ["everyone"])
        self.assertEqual(site.gauge("fleetd_kube_autoapprove_bindings"), 1.0)

    def test_bootstrapUser_found(self) -> None:
        """[K3] nodeclient for a User system:bootstrap:<token id> (any name
        starting system:bootstrap:)."""
        site = Site(self)
        site.fake.addBinding(
            "one-token", NODECLIENT_ROLE, subjects=[user("system:bootstrap:abc123")]
        )
        self.assertEqual(site.found(), ["one-token"])

    def test_serviceAccount_customSelfnodeclientRole_found(self) -> None:
        """[K3] A ServiceAccount bound to a ClusterRole of its own granting
        create on certificatesigningrequests/selfnodeclient."""
        site = Site(self)
        site.fake.addRole(
            "renewer", [rule(["certificatesigningrequests/selfnodeclient"], ["create"])]
        )
        site.fake.addBinding(
            "sa-renews", "renewer", subjects=[serviceAccount("ci", "tools")]
        )
        self.assertEqual(site.found(), ["sa-renews"])

    def test_serviceAccountSpellings_found(self) -> None:
        """[K3] The same identities spelled as a User
        system:serviceaccount:<ns>:<name> or the Group system:serviceaccounts
        (or one namespace's), and the anonymous ones."""
        site = Site(self)
        for name, subject in (
            ("u", user("system:serviceaccount:tools:ci")),
            ("g", group("system:serviceaccounts")),
            ("gns", group("system:serviceaccounts:tools")),
            ("anon", group("system:unauthenticated")),
            ("anonuser", user("system:anonymous")),
        ):
            site.fake.addBinding(name, NODECLIENT_ROLE, subjects=[subject])
        self.assertEqual(site.found(), ["anon", "anonuser", "g", "gns", "u"])

    def test_wildcardRules_found(self) -> None:
        """[K3] Rules that grant it through wildcards, as RBAC matches them:
        C{*/nodeclient}, resource C{*}, verb C{*}, apiGroup C{*}."""
        site = Site(self)
        grants = {
            "sub": rule(["*/nodeclient"], ["create"]),
            "all": rule(["*"], ["create"]),
            "verbs": rule(["certificatesigningrequests/nodeclient"], ["*"]),
            "groups": rule(["*/selfnodeclient"], ["create"], apiGroups=["*"]),
        }
        for name, granting in grants.items():
            site.fake.addRole(f"r-{name}", [granting])
            site.fake.addBinding(name, f"r-{name}", ["system:authenticated"])
        self.assertEqual(site.found(), sorted(grants))

    def test_roleBindings_found(self) -> None:
        """[K3] RoleBindings too: a ServiceAccount of the binding's own
        namespace bound to the nodeclient ClusterRole, and a Role of that
        namespace granting it; named namespace/name."""
        site = Site(self)
        site.fake.addRoleBinding(
            "tools", "rb-cluster", NODECLIENT_ROLE, [serviceAccount("ci")]
        )
        site.fake.addRole(
            "local",
            [rule(["certificatesigningrequests/nodeclient"], ["create"])],
            "tools",
        )
        site.fake.addRoleBinding(
            "tools", "rb-local", "local", [user("system:bootstrap:abc123")], "Role"
        )
        site.fake.addRoleBinding(
            "other", "rb-elsewhere", "local", [serviceAccount("ci")], "Role"
        )  # names a Role of another namespace: grants nothing
        self.assertEqual(site.found(), ["tools/rb-cluster", "tools/rb-local"])

    def test_logNamesSubjectAndRole(self) -> None:
        """[K3] The warning names each binding, the subject and the role."""
        site = Site(self)
        site.fake.addBinding("everyone", NODECLIENT_ROLE, ["system:authenticated"])
        with capturedLogs() as events:
            site.found()
        (warning,) = [e for e in events if "kube.rbac.autoapprove" in e["log_format"]]
        self.assertEqual(warning["bindings"], "everyone")
        self.assertIn("Group system:authenticated", warning["why"])
        self.assertIn(NODECLIENT_ROLE, warning["why"])


class NotFlaggedTests(SynchronousTestCase):
    """[K3] What grants no auto-approval through these subjects stays quiet."""

    def test_harmless_notFound(self) -> None:
        """[K3] system:nodes' renewals (Talos's default), filing CSRs only
        (system:node-bootstrapper), other verbs or subresources, a rule
        limited to resourceNames (never matches a create), a person's own
        user, a name that only looks like a bootstrap user."""
        site = Site(self)
        site.fake.addBinding(
            "system-bootstrap-node-renewal", SELFNODECLIENT_ROLE, ["system:nodes"]
        )
        site.fake.addBinding(
            "file-csrs", "system:node-bootstrapper", ["system:authenticated"]
        )
        roles = {
            "get": rule(["certificatesigningrequests/nodeclient"], ["get"]),
            "approval": rule(["certificatesigningrequests/approval"], ["create"]),
            "named": rule(
                ["certificatesigningrequests/nodeclient"],
                ["create"],
                resourceNames=["x"],
            ),
            "othergroup": rule(
                ["certificatesigningrequests/nodeclient"], ["create"], apiGroups=[""]
            ),
        }
        for name, granting in roles.items():
            site.fake.addRole(name, [granting])
            site.fake.addBinding(f"b-{name}", name, ["system:authenticated"])
        site.fake.addBinding("alice", NODECLIENT_ROLE, subjects=[user("alice")])
        site.fake.addBinding(
            "lookalike", NODECLIENT_ROLE, subjects=[user("system:bootstrapper")]
        )
        self.assertEqual(site.found(), [])
        self.assertEqual(site.gauge("fleetd_kube_autoapprove_bindings"), 0.0)


class FailureTests(SynchronousTestCase):
    def test_namespacedUnreadable_clusterFindingsKept(self) -> None:
        """[K3] RoleBindings cannot be read (fleetd's RBAC not yet updated):
        the ClusterRoleBindings found are still reported, and the success
        gauge says the check was incomplete."""
        site = Site(self)
        site.fake.addBinding("everyone", NODECLIENT_ROLE, ["system:authenticated"])
        site.fake.failNext("GET", "v1/rolebindings", 403, "Forbidden")
        with capturedLogs() as events:
            self.assertEqual(site.found(), ["everyone"])
        self.assertEqual(site.gauge("fleetd_kube_rbac_check_success"), 0.0)
        self.assertEqual(site.gauge("fleetd_kube_autoapprove_bindings"), 1.0)
        failed = [e for e in events if "kube.rbac.check-failed" in e["log_format"]]
        self.assertEqual(len(failed), 1)
        site.found()  # readable again
        self.assertEqual(site.gauge("fleetd_kube_rbac_check_success"), 1.0)


class FakeRBACTests(SynchronousTestCase):
    """The fake API refuses bindings the real one refuses (pkg/apis/rbac
    validation), so tests cannot build a cluster that cannot exist."""

    def test_invalidBindings_refused(self) -> None:
        """422 for: a ServiceAccount without namespace in a
        ClusterRoleBinding, a User without the RBAC apiGroup, an unknown
        subject kind, a ClusterRoleBinding naming a Role, a name with '/'."""
        fake = FakeKube(Clock())
        cases = [
            binding("a", NODECLIENT_ROLE, [serviceAccount("ci")]),
            binding("b", NODECLIENT_ROLE, [{"kind": "User", "name": "x"}]),
            binding("c", NODECLIENT_ROLE, [{"kind": "Robot", "name": "x"}]),
            binding("d", NODECLIENT_ROLE, [group("g")])
            | {
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "r",
                }
            },
            binding("e/f", NODECLIENT_ROLE, [group("g")]),
        ]
        for body in cases:
            with self.assertRaises(ApiError) as caught:
                fake.createBinding(body, None)
            self.assertEqual(caught.exception.code, 422, body)
        self.assertEqual(fake.bindings, {})

    def test_roleBinding_serviceAccountDefaultsNamespace_listedOverHTTP(self) -> None:
        """A RoleBinding's ServiceAccount may omit its namespace; RoleBindings
        list over HTTP in all namespaces and in one."""
        site = Site(self)
        site.fake.addRoleBinding("ns1", "rb", "view", [serviceAccount("ci")])
        site.fake.addRoleBinding("ns2", "rb", "view", [group("g")])
        d = Deferred.fromCoroutine(site.client.listRoleBindings())
        site.fake.flush()
        items = self.successResultOf(d)
        self.assertEqual(
            sorted(i["metadata"]["namespace"] for i in items), ["ns1", "ns2"]
        )
