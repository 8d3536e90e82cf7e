"""
A retired machine comes back as a new device record (issue 19, item 4):
C{POST /v1/admin/devices/NAME/forget-identity} frees a retired device's
serial, uuid and MACs on the embedded inventory, journaled with what they
were; the record, its runs' records and its journal stay.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import DeviceStatus
from tests.devicessupport import devicesTree
from tests.ownersupport import W1

BASE = "https://admin.test/devices"
FORGET = f"{BASE}/w1/forget-identity"


class ForgetIdentityTests(SynchronousTestCase):
    def setUp(self) -> None:
        tree = devicesTree(self)
        self.stub, self.inventory, self.journal = (
            tree.stub,
            tree.inventory,
            tree.journal,
        )
        self.assertEqual(self.call("POST", BASE, W1)[0], 201)

    def call(self, method: str, url: str, document: Any) -> tuple[int, bytes]:
        body = None if document is None else json.dumps(document).encode()
        d = self.stub.request(method, url, data=body)
        self.stub.flush()
        response = self.successResultOf(d)
        return response.code, self.successResultOf(response.content())

    def retire(self) -> None:
        self.successResultOf(
            self.inventory.setStatus("w1", DeviceStatus.DECOMMISSIONING, journal=[])
        )

    def events(self) -> list[str]:
        return [e.event for e in self.successResultOf(self.journal.query())]

    def test_retired_identityFreedForANewRecord(self) -> None:
        """
        The retired w1's serial, uuid and MAC can be added again under a new
        name once forgotten (refused as duplicates before); the entry keeps
        what they were.
        """
        self.retire()
        again = {**W1, "name": "w1b"}
        code, body = self.call("POST", BASE, again)
        self.assertEqual(code, 409, body)
        code, body = self.call("POST", FORGET, {"reason": "back from RMA"})
        self.assertEqual(code, 200, body)
        forgotten = json.loads(body)
        self.assertEqual(
            (forgotten["serial"], forgotten["uuid"], forgotten["macs"]),
            ("forgotten:w1", "forgotten:w1", []),
        )
        self.assertEqual(forgotten["status"], "decommissioning")
        self.assertEqual(self.call("POST", BASE, again)[0], 201)
        (entry,) = [
            e
            for e in self.successResultOf(self.journal.query())
            if e.event == "device.identity-forgotten"
        ]
        self.assertEqual(
            dict(entry.fields),
            {
                "serial": W1["serial"],
                "uuid": W1["uuid"],
                "macs": W1["macs"][0],
                "reason": "back from RMA",
            },
        )

    def test_notRetired_refusedNothingChanged(self) -> None:
        """Only a retired device's identity can be forgotten."""
        code, body = self.call("POST", FORGET, {"reason": "oops"})
        self.assertEqual(code, 400)
        self.assertIn(b"not retired", body)
        device = self.successResultOf(self.inventory.get("w1"))
        self.assertEqual(None if device is None else device.serial, "SN-1")
        self.assertNotIn("device.identity-forgotten", self.events())

    def test_reasonRequired_unknownDevice_twice(self) -> None:
        """No reason is a 400, an unknown device a 404, a second time a 400."""
        self.retire()
        self.assertEqual(self.call("POST", FORGET, {})[0], 400)
        self.assertEqual(self.call("POST", FORGET, None)[0], 400)
        unknown = f"{BASE}/w9/forget-identity"
        self.assertEqual(self.call("POST", unknown, {"reason": "r"})[0], 404)
        self.assertEqual(self.call("POST", FORGET, {"reason": "r"})[0], 200)
        code, body = self.call("POST", FORGET, {"reason": "r"})
        self.assertEqual(code, 400)
        self.assertIn(b"already forgotten", body)
        self.assertEqual(self.events().count("device.identity-forgotten"), 1)
