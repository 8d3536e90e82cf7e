"""
Contract tests of the Kubernetes API as fleetd uses it, run against the
strict fake (L{fleetd.testing.kube}) through fleetd's own client. The
behaviours are the documented ones listed in the fake's docstring (notes
kube-netbox.md sections 1, 2.2, 2.3); a subclass providing C{makeCluster}
for a real API server would run the same assertions.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.k8s.client import (
    Conflict,
    Gone,
    Invalid,
    KubeClient,
    KubeError,
    KubeUnavailable,
    NotFound,
)
from fleetd.testing.kube import ApiError, FakeKube, csrPEM
from tests.kubesupport import bootstrapSecret


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object


class KubeContractMixin(_Base):
    """The assertions; C{makeCluster} gives a client and the cluster's controls."""

    clock: Clock
    fake: FakeKube
    client: KubeClient

    def makeCluster(self) -> None:
        raise NotImplementedError

    def call(self, coroutine: Any) -> Any:
        d = Deferred.fromCoroutine(coroutine)
        self.fake.flush()
        return self.successResultOf(d)

    def failure(self, coroutine: Any, *kinds: type[Exception]) -> Any:
        d = Deferred.fromCoroutine(coroutine)
        self.fake.flush()
        return self.failureResultOf(d, *kinds).value

    def setUp(self) -> None:
        self.makeCluster()

    def test_secret_createGetDelete(self) -> None:
        """Secrets: create (stringData into data), get, delete, then 404."""
        created = self.call(self.client.createSecret(bootstrapSecret()))
        self.assertNotIn("stringData", created)
        got = self.call(self.client.getSecret("bootstrap-token-abcdef"))
        self.assertEqual(got["data"]["token-id"], _b64("abcdef"))
        self.assertTrue(self.call(self.client.deleteSecret("bootstrap-token-abcdef")))
        self.assertFalse(self.call(self.client.deleteSecret("bootstrap-token-abcdef")))
        self.assertIsNone(self.call(self.client.getSecret("bootstrap-token-abcdef")))

    def test_secret_nameTaken_alreadyExists(self) -> None:
        """Creating a Secret whose name is taken is a 409 AlreadyExists."""
        self.call(self.client.createSecret(bootstrapSecret()))
        error = self.failure(self.client.createSecret(bootstrapSecret()), Conflict)
        self.assertEqual(error.reason, "AlreadyExists")

    def test_secret_badFields_invalid(self) -> None:
        """Bad base64 data, bad keys, bad names and a foreign namespace are refused."""
        bad = bootstrapSecret()
        bad["data"] = {"x": "not base64!"}
        self.failure(self.client.createSecret(bad), Invalid)
        bad = bootstrapSecret()
        bad["stringData"]["bad key"] = "1"
        self.failure(self.client.createSecret(bad), Invalid)
        bad = bootstrapSecret()
        bad["metadata"]["name"] = "Bootstrap_Token"
        self.failure(self.client.createSecret(bad), Invalid)
        bad = bootstrapSecret()
        bad["metadata"]["namespace"] = "default"
        self.failure(self.client.createSecret(bad), Invalid)

    def test_bootstrapAuthenticator(self) -> None:
        """
        A bootstrap token authenticates as system:bootstrap:<id> with its
        extra groups only while its Secret is well formed, unexpired, for
        authentication, and not deleted (notes section 1).
        """
        self.call(self.client.createSecret(bootstrapSecret()))
        who = self.fake.authenticate("abcdef.0123456789abcdef")
        assert who is not None
        self.assertEqual(who.username, "system:bootstrap:abcdef")
        self.assertEqual(
            who.groups, ["system:bootstrappers", "system:bootstrappers:fleetd"]
        )
        self.assertIsNone(self.fake.authenticate("abcdef.0123456789abcdeX"))
        self.call(
            self.client.createSecret(
                bootstrapSecret("old000", expiration="1970-01-01T00:00:10Z")
            )
        )
        self.clock.advance(20)
        self.assertIsNone(self.fake.authenticate("old000.0123456789abcdef"))
        self.call(self.client.createSecret(bootstrapSecret("nouse0", usage=False)))
        self.assertIsNone(self.fake.authenticate("nouse0.0123456789abcdef"))
        self.call(
            self.client.createSecret(bootstrapSecret("badgrp", groups="system:nodes"))
        )
        self.assertIsNone(self.fake.authenticate("badgrp.0123456789abcdef"))
        self.call(self.client.deleteSecret("bootstrap-token-abcdef"))
        self.assertIsNone(self.fake.authenticate("abcdef.0123456789abcdef"))

    def fileCSR(self, cn: str = "system:node:w1") -> dict[str, Any]:
        self.call(self.client.createSecret(bootstrapSecret()))
        return self.fake.fileCSR("abcdef.0123456789abcdef", csrPEM(cn))

    def test_csr_serverSetsRequester(self) -> None:
        """spec.username and groups come from the credential, not the client."""
        csr = self.fileCSR()
        self.assertEqual(csr["spec"]["username"], "system:bootstrap:abcdef")
        items, rv = self.call(self.client.listCSRs())
        self.assertEqual(
            [i["metadata"]["name"] for i in items], [csr["metadata"]["name"]]
        )
        self.assertTrue(rv)

    def staleApproval(self) -> tuple[str, Conflict]:
        """A CSR's name and the error of its approval from a stale
        resourceVersion (the CSR changed meanwhile)."""
        csr = self.fileCSR()
        name = csr["metadata"]["name"]
        stale = self.call(self.client.getCSR(name))
        self.fake.csrs[name]["metadata"]["resourceVersion"] = "1"  # changed meanwhile
        stale["status"] = {"conditions": [{"type": "Approved", "status": "True"}]}
        error: Conflict = self.failure(
            self.client._call(
                "PUT",
                f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/approval",
                "x",
                stale,
            ),
            Conflict,
        )
        return name, error

    def test_approval_staleVersion_conflict(self) -> None:
        """[K2] An approval with a stale resourceVersion is a 409."""
        _, error = self.staleApproval()
        self.assertEqual(error.code, 409)

    def test_refusals_inTheServersWords(self) -> None:
        """As the API server words them: a Secret in another namespace
        than kube-system is 400 BadRequest saying so; a stale approval is
        409 Conflict naming the CSR, "modified"."""
        bad = bootstrapSecret()
        bad["metadata"]["namespace"] = "default"
        error = self.failure(self.client.createSecret(bad), Invalid)
        self.assertEqual((error.code, error.reason), (400, "BadRequest"))
        self.assertIn(
            "the namespace of the provided object does not match the namespace"
            " sent on the request",
            str(error),
        )
        name, stale = self.staleApproval()
        self.assertEqual(stale.reason, "Conflict")
        self.assertIn(
            "Operation cannot be fulfilled on"
            f' certificatesigningrequests.certificates.k8s.io "{name}": the object'
            " has been modified",
            str(stale),
        )

    def test_approval_conflictRetried(self) -> None:
        """A 409 during approveCSR reads the CSR again and succeeds."""
        csr = self.fileCSR()
        name = csr["metadata"]["name"]
        self.fake.failNext("PUT", "/approval", 409, "Conflict")
        result = self.call(self.client.approveCSR(name, lambda c: True, "m"))
        self.assertEqual(
            [c["type"] for c in result["status"]["conditions"]], ["Approved"]
        )

    def test_approval_exclusiveAndOnce(self) -> None:
        """Approved and Denied are exclusive; a duplicate Approved is rejected."""
        name = self.fileCSR()["metadata"]["name"]
        self.call(self.client.approveCSR(name, lambda c: True, "m"))
        self.failure(self.client.approveCSR(name, lambda c: True, "m"), Invalid)
        current = self.call(self.client.getCSR(name))
        current["status"]["conditions"].append({"type": "Denied", "status": "True"})
        self.failure(
            self.client._call(
                "PUT",
                f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/approval",
                "x",
                current,
            ),
            Invalid,
        )

    def test_watch_eventsBookmarksAndEnd(self) -> None:
        """A watch replays from its version, stays open, bookmarks only if allowed."""
        _, rv = self.call(self.client.listCSRs())
        events: list[dict[str, Any]] = []
        watch = self.client.watchCSRs(rv, events.append, timeoutSeconds=30)
        self.fake.flush()
        csr = self.fileCSR()
        self.fake.flush()
        self.assertEqual([e["type"] for e in events], ["ADDED"])
        self.fake.bookmark()
        self.assertEqual(events[-1]["type"], "BOOKMARK")
        self.assertEqual(set(events[-1]["object"]["metadata"]), {"resourceVersion"})
        self.clock.advance(30)  # timeoutSeconds: the server ends it
        self.fake.flush()
        self.successResultOf(watch.done)
        self.assertEqual(
            events[0]["object"]["metadata"]["name"], csr["metadata"]["name"]
        )

    def test_watch_tooOld_error410(self) -> None:
        """A watch from a compacted version gets one ERROR event with code 410."""
        _, rv = self.call(self.client.listCSRs())
        self.fileCSR()
        self.fake.compact()
        events: list[dict[str, Any]] = []
        watch = self.client.watchCSRs(rv, events.append)
        self.fake.flush()
        self.successResultOf(watch.done)
        self.assertEqual(events[0]["type"], "ERROR")
        self.assertEqual(events[0]["object"]["code"], 410)

    def test_nodes_deleteAndMissing(self) -> None:
        """Deleting a Node; deleting it again says it was not there."""
        self.fake.addNode("w1")
        self.assertTrue(self.call(self.client.deleteNode("w1")))
        self.assertFalse(self.call(self.client.deleteNode("w1")))

    def test_bindings_list(self) -> None:
        """ClusterRoleBindings list with their subjects and roleRef."""
        self.fake.addBinding(
            "b", "system:node-bootstrapper", ["system:bootstrappers:x"]
        )
        (binding,) = self.call(self.client.listClusterRoleBindings())
        self.assertEqual(binding["roleRef"]["name"], "system:node-bootstrapper")

    def test_faults_typed(self) -> None:
        """5xx and 429 are unavailable, refused connections too, 404 NotFound."""
        self.fake.failNext("GET", "/secrets", 503)
        self.failure(
            self.client.listClusterRoleBindings()
            if False
            else self.client.getSecret("x"),
            KubeUnavailable,
        )
        self.fake.failNext("GET", "/clusterrolebindings", 429, "TooManyRequests")
        self.failure(self.client.listClusterRoleBindings(), KubeUnavailable)
        self.fake.reachable = False
        self.failure(self.client.deleteNode("w1"), KubeUnavailable)
        self.fake.reachable = True
        self.failure(self.client.getCSR("nope"), NotFound)

    def test_hungServer_timesOut(self) -> None:
        """A call the server never answers fails as unavailable at its deadline."""
        self.fake.hangNext("DELETE", "/nodes/")
        d = Deferred.fromCoroutine(self.client.deleteNode("w1"))
        self.fake.flush()
        self.assertNoResult(d)
        self.clock.advance(self.client.timeout)
        self.fake.flush()
        self.failureResultOf(d, KubeUnavailable)

    def test_close_cancelsCallsInFlight(self) -> None:
        """Closing the client (the daemon stops) ends a call still in flight
        as unavailable, so its connection cannot return to a pool that is
        already closed."""
        self.fake.hangNext("DELETE", "/nodes/")
        d = Deferred.fromCoroutine(self.client.deleteNode("w1"))
        self.fake.flush()
        self.assertNoResult(d)
        self.client.close()
        self.failureResultOf(d, KubeUnavailable)

    def test_unauthenticated_refused(self) -> None:
        """A wrong bearer is a 401, not a success."""
        other = self.fake.client(bearer="wrong")
        error = self.failure(other.listClusterRoleBindings(), KubeError)
        self.assertEqual(error.code, 401)

    def test_workflows_listNamespacedOrAll(self) -> None:
        """Workflows (tinkerbell.org/v1alpha1) list in one namespace or in
        all, with the list's resourceVersion; either state spelling kept."""
        self.fake.addWorkflow("tink", "a", "52:54:00:00:00:01", state="RUNNING")
        self.fake.addWorkflow("other", "b", "52:54:00:00:00:02", v012=True)
        items, rv = self.call(self.client.listWorkflows("tink"))
        self.assertEqual([i["metadata"]["name"] for i in items], ["a"])
        self.assertEqual(items[0]["status"]["state"], "RUNNING")
        self.assertEqual(items[0]["status"]["agentID"], "52:54:00:00:00:01")
        self.assertTrue(rv)
        items, _ = self.call(self.client.listWorkflows(None))
        self.assertEqual(
            sorted(i["status"]["state"] for i in items), ["RUNNING", "STATE_PENDING"]
        )
        self.assertEqual(self.call(self.client.listWorkflows("none")), ([], rv))

    def test_workflows_watchNamespaceOnly(self) -> None:
        """A Workflow watch replays from its version and delivers status
        changes and deletions in its namespace only."""
        _, rv = self.call(self.client.listWorkflows("tink"))
        events: list[dict[str, Any]] = []
        watch = self.client.watchWorkflows("tink", rv, events.append, 30)
        self.fake.flush()
        self.fake.addWorkflow("tink", "a", "52:54:00:00:00:01", state="RUNNING")
        self.fake.addWorkflow("other", "b", "52:54:00:00:00:02")
        self.fake.setWorkflowState("tink", "a", "POST")
        self.fake.deleteWorkflow("tink", "a")
        self.assertEqual(
            [(e["type"], e["object"]["status"]["state"]) for e in events],
            [("ADDED", "RUNNING"), ("MODIFIED", "POST"), ("DELETED", "POST")],
        )
        self.clock.advance(30)
        self.fake.flush()
        self.successResultOf(watch.done)

    def test_workflows_watchTooOld_error410(self) -> None:
        """A Workflow watch from a compacted version gets the 410 ERROR event."""
        _, rv = self.call(self.client.listWorkflows("tink"))
        self.fake.addWorkflow("tink", "a", "52:54:00:00:00:01")
        self.fake.compact()
        events: list[dict[str, Any]] = []
        watch = self.client.watchWorkflows("tink", rv, events.append)
        self.fake.flush()
        self.successResultOf(watch.done)
        self.assertEqual(events[0]["object"]["code"], 410)

    def test_workflows_noCRD_notFound(self) -> None:
        """Without the Workflow CRD the group answers 404."""
        self.fake.workflowsInstalled = False
        self.failure(self.client.listWorkflows("tink"), NotFound)

    def test_gone_typed(self) -> None:
        """An HTTP 410 answer is Gone."""
        self.fake.failNext("GET", "/certificatesigningrequests", 410, "Expired")
        self.failure(self.client.listCSRs(), Gone)


class FakeKubeContractTests(KubeContractMixin, SynchronousTestCase):
    """The contract against L{FakeKube} through C{StubTreq}."""

    def makeCluster(self) -> None:
        self.clock = Clock()
        self.fake = FakeKube(self.clock)
        self.client = self.fake.client()


class FakeStrictnessTests(SynchronousTestCase):
    def test_workflowFieldsChecked(self) -> None:
        """Workflow names, namespaces and states are checked (422)."""
        fake = FakeKube(Clock())
        for args, state in (
            (("Bad_NS", "a"), "PENDING"),
            (("ns", "Bad_Name"), "PENDING"),
            (("ns", "a"), "DONE"),
        ):
            error = self.assertRaises(
                ApiError, fake.addWorkflow, *args, "m", state=state
            )
            self.assertEqual(error.code, 422)

    def test_csrRequestMustBePEM(self) -> None:
        """A CSR whose request is not a PEM CERTIFICATE REQUEST is 422."""
        fake = FakeKube(Clock())
        error = self.assertRaises(
            ApiError,
            fake.postCSR,
            {"spec": {"request": _b64("junk"), "signerName": "s", "usages": ["x"]}},
            fake.authenticate(fake.adminToken),
        )
        self.assertEqual(error.code, 422)

    def test_csrSignatureChecked_otherExtensionsNot(self) -> None:
        """
        The API server checks a CSR's signature (422 when it fails) but,
        as Go parses only a CSR's SAN extension, accepts a re-signed
        request whose basicConstraints value is malformed (issue 17).
        """
        from fleetd.testing.kube import malformedBasicConstraintsPEM

        fake = FakeKube(Clock())
        pem = csrPEM("system:node:w1")
        der = base64.b64decode(b"".join(pem.splitlines()[1:-1]))
        forged = der[:-4] + bytes(b ^ 0xFF for b in der[-4:])  # spoil the signature
        body = base64.encodebytes(forged).replace(b"\n", b"")
        spoiled = (
            b"-----BEGIN CERTIFICATE REQUEST-----\n"
            + body
            + b"\n-----END CERTIFICATE REQUEST-----\n"
        )
        error = self.assertRaises(ApiError, fake.fileCSR, fake.adminToken, spoiled)
        self.assertEqual(error.code, 422)
        csr = fake.fileCSR(
            fake.adminToken, malformedBasicConstraintsPEM("system:node:w1")
        )
        self.assertIn(csr["metadata"]["name"], fake.csrs)
