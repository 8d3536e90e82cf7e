"""
An L{InventoryError} reaching an HTTP resource is a one-line answer by its
kind (400 invalid, 404 not-found, 409 duplicate, 503 unavailable), never a
500 with a logged traceback: on the device listener's lookups and disk
reports, the admin status view, and the admin routes that use
C{storeRefusal}.

(The review's probe C{test_review_500} showed a duplicate as a 500.)
"""

from __future__ import annotations

import json
from io import BytesIO
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd.admin.status import DeviceStatusResource
from fleetd.attest.identity import Peer
from fleetd.attest.lookup import LookupService
from fleetd.device.attest import deviceAPI
from fleetd.device.disks import NodeDisksResource
from fleetd.inventory.model import ErrorKind, InventoryError
from fleetd.nodes import NodeIdentity
from fleetd.trust.disk_report import Disk, reportJSON
from fleetd.web.refusals import inventoryRefusal, storeRefusal

EXPECTED: dict[ErrorKind, int] = {
    "invalid": 400,
    "not-found": 404,
    "duplicate": 409,
    "unavailable": 503,
}
MESSAGE = "NetBox has 2 devices named w1; fleetd needs exactly one"


class _Identify:
    def check(self, request: Any) -> Peer:
        return Peer(NodeIdentity("w1", "S1"), None, "CN=x", False)  # type: ignore[arg-type]


class _Failing:
    """A disk or status service whose inventory read fails."""

    def __init__(self, kind: ErrorKind) -> None:
        self.kind = kind

    def report(self, *args: object) -> Deferred[Any]:
        return fail(InventoryError(MESSAGE, self.kind))


def _answer(request: DummyRequest) -> tuple[int, str]:
    code = request.responseCode
    assert code is not None
    return code, b"".join(request.written).decode()


class InventoryRefusalTests(SynchronousTestCase):
    def lookupPlan(self, kind: ErrorKind) -> tuple[int, str]:
        lookups = LookupService(
            runner=None,  # type: ignore[arg-type]
            attestation=None,  # type: ignore[arg-type]
            book=None,  # type: ignore[arg-type]
            getDevice=lambda name: fail(InventoryError(MESSAGE, kind)),
            runs=None,  # type: ignore[arg-type]
            vault=None,  # type: ignore[arg-type]
            targetDiskFor=None,  # type: ignore[arg-type]
        )
        api = deviceAPI(None, _Identify(), lookups)  # type: ignore[arg-type]
        request = DummyRequest([b"node", b"plan"])
        request.method = b"GET"
        resource: Any = api
        for segment in (b"node", b"plan"):
            resource = resource.getChildWithDefault(segment, request)
        resource.render(request)
        return _answer(request)

    def test_lookup_eachKindOneLine(self) -> None:
        """
        [A3] A lookup on 8444 whose inventory read fails answers by the
        error's kind in one line; nothing is logged as a bug.
        """
        for kind, status in EXPECTED.items():
            code, body = self.lookupPlan(kind)
            self.assertEqual(code, status, kind)
            self.assertEqual(body.count("\n"), 1, body)
            if kind != "unavailable":
                self.assertIn(MESSAGE, body)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_disks_eachKindOneLine(self) -> None:
        """[D1] A disk report whose inventory read fails: one line by kind, no 500."""
        raw = json.dumps(reportJSON([Disk("sda", "D1", None, 4096)])).encode()
        for kind, status in EXPECTED.items():
            resource = NodeDisksResource(
                _Failing(kind),  # type: ignore[arg-type]
                lambda request: NodeIdentity("w1", "S1"),
            )
            request = DummyRequest([])
            request.method = b"POST"
            request.content = BytesIO(raw)  # type: ignore[attr-defined]
            resource.render(request)  # type: ignore[arg-type]
            code, body = _answer(request)
            self.assertEqual(code, status, kind)
            self.assertEqual(body.count("\n"), 1, body)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_adminStatus_eachKindOneLine(self) -> None:
        """C{GET /v1/admin/status/NAME} whose inventory read fails: one line by kind."""
        for kind, status in EXPECTED.items():
            service = _Failing(kind)
            resource = DeviceStatusResource(
                service,  # type: ignore[arg-type]
                "w1",
            )
            request = DummyRequest([])
            request.method = b"GET"
            resource.render(request)  # type: ignore[arg-type]
            code, body = _answer(request)
            self.assertEqual(code, status, kind)
            self.assertEqual(body, MESSAGE + "\n")
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_storeRefusal_everyKind(self) -> None:
        """[J1] storeRefusal maps every inventory kind; an unknown error is a bug."""
        for kind, status in EXPECTED.items():
            answer = storeRefusal(InventoryError("a\nb", kind))
            assert answer is not None
            self.assertEqual(answer[0], status)
            self.assertNotIn("\n", answer[1])
        self.assertEqual(
            inventoryRefusal(InventoryError("x taken", "duplicate")), (409, "x taken")
        )
        self.assertIsNone(storeRefusal(KeyError("bug")))
