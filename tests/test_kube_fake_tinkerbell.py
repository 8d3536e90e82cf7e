"""
Contract tests of Tinkerbell's Hardware and Workflows as the Kubernetes API
serves them (custom resources, namespaced, with a status subresource;
L{fleetd.testing.kube_tink}), through fleetd's own client
(L{fleetd.tinkerbell.api}); a subclass giving C{makeCluster} for a real
API server would run the same assertions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config.tinkerbell import TinkerbellClass
from fleetd.k8s.client import Conflict, Invalid, KubeClient, KubeError, NotFound
from fleetd.testing.kube import FakeKube
from fleetd.tinkerbell import objects
from fleetd.tinkerbell.api import TinkerbellAPI

NS = "tink-system"
MAC = "52:54:00:00:00:01"
CLASS = TinkerbellClass("fleetd-talos-install", "https://images.test/t.raw.zst", True)

if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object


class TinkerbellContractMixin(_Base):
    clock: Clock
    fake: FakeKube
    client: KubeClient

    def makeCluster(self) -> None:
        raise NotImplementedError

    def setUp(self) -> None:
        self.makeCluster()
        self.api = TinkerbellAPI(self.client, NS)

    def call(self, coroutine: Any) -> Any:
        d = Deferred.fromCoroutine(coroutine)
        self.fake.flush()
        return self.successResultOf(d)

    def failure(self, coroutine: Any, *kinds: type[Exception]) -> Any:
        d = Deferred.fromCoroutine(coroutine)
        self.fake.flush()
        return self.failureResultOf(d, *kinds).value

    def test_create_serverFieldsSet_statusDropped(self) -> None:
        """A created Hardware gets uid, resourceVersion, creationTimestamp,
        generation 1 and the path's namespace; a status sent is dropped."""
        body = objects.hardware(NS, "w1", [MAC])
        body["status"] = {"state": "in_use"}
        made = self.call(self.api.create("hardware", body))
        meta = made["metadata"]
        self.assertEqual(meta["namespace"], NS)
        self.assertTrue(meta["uid"] and meta["resourceVersion"])
        self.assertEqual(meta["generation"], 1)
        self.assertNotIn("status", made)
        self.assertEqual(self.call(self.api.get("hardware", "w1")), made)

    def test_create_nameTaken_alreadyExists(self) -> None:
        """Creating a name taken in the namespace is 409 AlreadyExists."""
        body = objects.workflow(NS, "w1", "r-1", MAC, CLASS)
        self.call(self.api.create("workflows", body))
        error = self.failure(self.api.create("workflows", body), Conflict)
        self.assertEqual(error.reason, "AlreadyExists")

    def test_create_otherNamespace_refused(self) -> None:
        """A body naming another namespace than the path's is refused."""
        body = objects.hardware("elsewhere", "w1", [MAC])
        error = self.failure(self.api.create("hardware", body), KubeError)
        self.assertEqual(error.code, 400)

    def test_create_badLabel_invalid(self) -> None:
        """Labels are checked as metav1 checks them (422)."""
        body = objects.hardware(NS, "w1", [MAC])
        body["metadata"]["labels"]["fleetd.io/device"] = "not a value!"
        self.failure(self.api.create("hardware", body), Invalid)

    def test_update_staleVersion_conflict(self) -> None:
        """An update carrying an old resourceVersion is 409; none is 422;
        the current one succeeds and bumps the generation with the spec."""
        made = self.call(self.api.create("hardware", objects.hardware(NS, "w1", [MAC])))
        off = objects.netbootOff(made)
        done = self.call(self.api.replace("hardware", off))
        self.assertEqual(done["metadata"]["generation"], 2)
        self.assertNotEqual(
            done["metadata"]["resourceVersion"], made["metadata"]["resourceVersion"]
        )
        self.failure(self.api.replace("hardware", off), Conflict)
        del off["metadata"]["resourceVersion"]
        self.failure(self.api.replace("hardware", off), Invalid)

    def test_refusals_inTheServersWords(self) -> None:
        """As the API server words them: a stale update is 409 Conflict,
        the object named and "modified"; a body naming another namespace
        than the path's is 400 BadRequest, saying so."""
        made = self.call(self.api.create("hardware", objects.hardware(NS, "w1", [MAC])))
        off = objects.netbootOff(made)
        self.call(self.api.replace("hardware", off))
        error = self.failure(self.api.replace("hardware", off), Conflict)
        self.assertEqual(error.reason, "Conflict")
        self.assertIn(
            'Operation cannot be fulfilled on hardware.tinkerbell.org "w1": the'
            " object has been modified; please apply your changes to the latest"
            " version and try again",
            str(error),
        )
        body = objects.hardware("elsewhere", "w2", [MAC])
        error = self.failure(self.api.create("hardware", body), Invalid)
        self.assertEqual((error.code, error.reason), (400, "BadRequest"))
        self.assertIn(
            "the namespace of the provided object does not match the namespace"
            " sent on the request",
            str(error),
        )

    def test_update_keepsStatus(self) -> None:
        """The main resource's update leaves the status subresource's
        status as it was."""
        self.call(
            self.api.create("workflows", objects.workflow(NS, "w1", "r-1", MAC, CLASS))
        )
        self.fake.setWorkflowState(NS, "w1-r-1", "RUNNING")
        current = self.call(self.api.get("workflows", "w1-r-1"))
        current["status"] = {"state": "SUCCESS"}
        current["spec"]["disabled"] = True
        done = self.call(self.api.replace("workflows", current))
        self.assertEqual(done["status"]["state"], "RUNNING")
        self.assertEqual(done["status"]["agentID"], MAC)

    def test_update_absent_notFound(self) -> None:
        body = objects.hardware(NS, "w1", [MAC])
        body["metadata"]["resourceVersion"] = "1"
        self.failure(self.api.replace("hardware", body), NotFound)

    def test_delete_uidPrecondition(self) -> None:
        """A delete whose uid precondition is another object's is 409;
        the right one deletes; again, absent."""
        made = self.call(
            self.api.create("workflows", objects.workflow(NS, "w1", "r-1", MAC, CLASS))
        )
        self.failure(self.api.delete("workflows", "w1-r-1", "not-its-uid"), Conflict)
        uid = made["metadata"]["uid"]
        self.assertTrue(self.call(self.api.delete("workflows", "w1-r-1", uid)))
        self.assertFalse(self.call(self.api.delete("workflows", "w1-r-1", uid)))
        self.assertIsNone(self.call(self.api.get("workflows", "w1-r-1")))

    def test_list_namespaceAndLabels(self) -> None:
        """LIST in one namespace; a label selector picks by label."""
        self.call(self.api.create("hardware", objects.hardware(NS, "w1", [MAC])))
        self.fake.addHardware(NS, "hand", ["52:54:00:00:00:09"])
        self.fake.addHardware("other", "w9", ["52:54:00:00:00:08"])
        names = [h["metadata"]["name"] for h in self.call(self.api.list("hardware"))]
        self.assertEqual(names, ["hand", "w1"])
        doc = self.call(
            self.client.call(
                "GET",
                f"/apis/tinkerbell.org/v1alpha1/namespaces/{NS}/hardware",
                "list",
                query={"labelSelector": "app.kubernetes.io/managed-by=fleetd"},
            )
        )
        self.assertEqual([h["metadata"]["name"] for h in doc["items"]], ["w1"])

    def test_noCRDs_notFound(self) -> None:
        """Without Tinkerbell's CRDs the group answers 404 to a create."""
        self.fake.workflowsInstalled = False
        self.failure(
            self.api.create("hardware", objects.hardware(NS, "w1", [MAC])), NotFound
        )


class FakeTinkerbellContractTests(TinkerbellContractMixin, SynchronousTestCase):
    """The contract against L{FakeKube} through C{StubTreq}."""

    def makeCluster(self) -> None:
        self.clock = Clock()
        self.fake = FakeKube(self.clock)
        self.client = self.fake.client()


class ValidatorHookTests(SynchronousTestCase):
    """The fake's optional validator (the CRDs' schemas, wired by tests)."""

    def test_validator_refusesWith422(self) -> None:
        """A line from the validator refuses the create or update with 422;
        it is asked with the kind and the object."""
        fake = FakeKube(Clock())
        asked: list[tuple[str, str]] = []

        def validator(kind: str, obj: dict[str, Any]) -> str | None:
            asked.append((kind, obj["metadata"]["name"]))
            return "spec.bootOptions: bad" if obj["spec"].get("bootOptions") else None

        fake.validator = validator
        api = TinkerbellAPI(fake.client(), NS)
        d = Deferred.fromCoroutine(
            api.create("workflows", objects.workflow(NS, "w1", "r-1", MAC, CLASS))
        )
        fake.flush()
        error = self.failureResultOf(d, Invalid).value
        self.assertIn("spec.bootOptions: bad", str(error))
        d = Deferred.fromCoroutine(
            api.create("hardware", objects.hardware(NS, "w1", [MAC]))
        )
        fake.flush()
        self.successResultOf(d)
        self.assertEqual(asked, [("Workflow", "w1-r-1"), ("Hardware", "w1")])
        self.assertEqual(fake.workflows, {})
