"""
fleetctl cluster-token and retire: the admin API resources (with a fake
cluster, through StubTreq) and the commands against a running daemon
without [kubernetes] ([R1] still works; cluster-token refuses).
"""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.kube import clusterTokenResource, retireResource
from tests.daemonsupport import DaemonTestMixin
from tests.kubesupport import KubeFleet, device


class ResourceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"))
        owner = lambda request: "alice"  # noqa: E731
        from twisted.web.resource import Resource

        root = Resource()
        root.putChild(
            b"cluster-token", clusterTokenResource(self.fleet.kube.cluster, owner)
        )
        root.putChild(b"retire", retireResource(self.fleet.retirer, owner))
        self.http: Any = StubTreq(root)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        d = self.http.request(
            method,
            f"https://admin.test/{path}",
            data=data,
            headers={b"content-type": [b"application/json"]},
        )
        for _ in range(5):
            self.http.flush()
            self.fleet.fake.flush()
        response = self.successResultOf(d)
        content = self.http.content(response)
        self.http.flush()
        return response.code, self.successResultOf(content)

    def test_requestApproveRotate(self) -> None:
        """[K5][K6] The owner's commands over the admin API, journaled as the owner."""
        code, body = self.call(
            "POST", "cluster-token/request", {"node": "CP1", "reason": "control plane"}
        )
        self.assertEqual(code, 201, body)
        request = json.loads(body)["request"]
        code, body = self.call("GET", "cluster-token")
        self.assertEqual([r["request"] for r in json.loads(body)["pending"]], [request])
        code, body = self.call("POST", "cluster-token/approve", {"request": request})
        self.assertEqual(code, 200, body)
        doc = json.loads(body)
        self.assertRegex(doc["token"], r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
        self.assertEqual(doc["node"], "cp1")
        code, body = self.call("POST", "cluster-token/rotate", {})
        self.assertEqual(code, 200, body)
        rotated = json.loads(body)
        self.assertEqual(rotated["old_token_id"], doc["token_id"])
        self.assertTrue(rotated["steps"])
        actors = {e.actor for e in self.fleet.entries("cluster-token.approved")}
        self.assertEqual(actors, {"owner:alice"})

    def test_refusals_oneLine(self) -> None:
        """Bad bodies, unknown requests and a cluster that is down: one line each."""
        code, body = self.call("POST", "cluster-token/request", {"node": "cp1"})
        self.assertEqual((code, body.count(b"\n")), (400, 1))
        code, body = self.call("POST", "cluster-token/approve", {"request": "ctr-x"})
        self.assertEqual(code, 404)
        self.fleet.fake.reachable = False
        code, body = self.call("POST", "cluster-token/rotate", {})
        self.assertEqual(code, 503)
        self.assertIn(b"nothing changed", body)
        code, body = self.call("POST", "retire", {"device": "w1"})
        self.assertEqual(code, 503)
        code, body = self.call("POST", "retire", {"device": "nope"})
        self.assertEqual(code, 404)


class CommandTests(DaemonTestMixin, TestCase):
    """fleetctl against a running daemon with no [kubernetes] table."""

    async def test_retire_withoutCluster_thenProvisionRefused(self) -> None:
        """
        [R1] Without a cluster, retire still marks the device decommissioning
        and lists what cannot be revoked; a decommissioning device cannot be
        provisioned; cluster-token commands refuse in one line.
        """
        _, fleetctl = await self.daemonWithDevice()
        code, out, err = await fleetctl("retire", "w1", "--yes")
        self.assertEqual(code, 0, err)
        self.assertIn("decommissioning", out)
        self.assertIn("machine.token", out)
        self.assertIn("no cluster configured", out)
        code, out, err = await fleetctl("provision", "w1")
        self.assertEqual(code, 1)
        self.assertIn("409", err)
        self.assertIn("decommissioning", err)
        code, out, err = await fleetctl(
            "cluster-token", "request", "--node", "cp1", "--reason", "x"
        )
        self.assertEqual(code, 1)
        self.assertIn("no-cluster", err)
        code, out, err = await fleetctl("status", "w1")
        self.assertEqual(code, 0, err)
        self.assertIn("token:    none issued", out)
        self.assertIn("retired", out)
