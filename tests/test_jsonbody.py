"""
Tests for L{fleetd.jsonbody}: the one strict JSON decoder, and that every
place reading JSON from a client uses it with the same behaviour [O3].
"""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO
from typing import Any

from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from fleetd import jsonbody
from fleetd.admin.deviceflow import _jsonBody
from fleetd.admin.devices import parseDeviceJSON
from fleetd.admin.resource import _checkBody
from fleetd.admin.trust import jsonObject
from fleetd.device.attest import readJSON
from fleetd.jsonbody import JSONBodyError
from fleetd.trust.disk_report import parseDiskReport
from fleetd.trust.manifest import parseManifest

DUPLICATE = b'{"a": "1", "a": "2"}'
CONSTANT = b'{"a": NaN}'
DEEP = b"[" * 100_000 + b"]" * 100_000
NOT_UTF8 = b'{"a": "\xff"}'


def _request(raw: bytes) -> Any:
    request = DummyRequest([])
    request.method = b"POST"
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
    request.content = BytesIO(raw)  # type: ignore[attr-defined]
    return request


def _checked(raw: bytes) -> None:
    refusal = _checkBody(_request(raw), csv=False)
    if refusal is not None:
        raise ValueError(refusal.line)


# Each place that reads a client's JSON, as a function of the raw bytes
# that raises (any exception) with its one-line message.
SITES: dict[str, Callable[[bytes], object]] = {
    "admin gate": _checked,
    "device flow": lambda raw: _jsonBody(_request(raw), ("a",)),
    "attestation": lambda raw: readJSON(_request(raw)),
    "trust API": lambda raw: jsonObject(raw, {"a": True}),
    "disk report": parseDiskReport,
    "manifest": lambda raw: parseManifest("[" + raw.decode("utf-8", "replace") + "]"),
    "devices API": lambda raw: parseDeviceJSON(raw.decode("utf-8", "replace")),
}


class LoadsTests(SynchronousTestCase):
    def test_loads_strict(self) -> None:
        """[O3] Duplicate keys, NaN/Infinity, bad UTF-8 and deep nesting refused."""
        cases = [
            (DUPLICATE, "key 'a' appears twice"),
            (b'{"x": {"a": 1, "a": 1}}', "key 'a' appears twice"),
            (CONSTANT, "NaN is not JSON"),
            (b"[-Infinity]", "-Infinity is not JSON"),
            (NOT_UTF8, "not JSON"),
            (DEEP, "not JSON"),
            (b"", "not JSON"),
            (b"{", "not JSON"),
        ]
        for raw, message in cases:
            error = self.assertRaises(JSONBodyError, jsonbody.loads, raw)
            self.assertEqual(str(error), message, raw[:40])

    def test_loads_longKeyShortened(self) -> None:
        """A repeated long key is named in a short line."""
        key = "k" * 500
        error = self.assertRaises(
            JSONBodyError, jsonbody.loads, f'{{"{key}": 1, "{key}": 2}}'
        )
        self.assertLess(len(str(error)), 80)

    def test_loads_accepts(self) -> None:
        """Plain JSON, as bytes or text, decodes as json.loads would."""
        self.assertEqual(
            jsonbody.loads(b'{"a": [1, 2.5, "\\u00e9"]}'), {"a": [1, 2.5, "é"]}
        )
        self.assertEqual(jsonbody.loads(' {"a": {"b": null}} '), {"a": {"b": None}})

    def test_everySite_sameRefusals(self) -> None:
        """
        [O3] Every reader of a client's JSON refuses a repeated key, NaN
        and absurd nesting in one line naming why; none crashes.
        """
        for site, parse in SITES.items():
            for raw, why in (
                (DUPLICATE, "key 'a' appears twice"),
                (CONSTANT, "NaN is not JSON"),
                (DEEP, "not JSON"),
            ):
                try:
                    parse(raw)
                except RecursionError:  # pragma: no cover - the failure
                    self.fail(f"{site}: nesting crashed the parser")
                except Exception as e:
                    line = str(e)
                    self.assertIn(why, line, site)
                    self.assertNotIn("\n", line, site)
                else:
                    self.fail(f"{site}: {raw[:20]!r} accepted")
