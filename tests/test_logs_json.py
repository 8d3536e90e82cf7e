"""
C{--log-format json} as a log collector reads it (issue 27, item 7): one
flat object per line, C{time}, C{level}, C{event} and the event's own
fields, no Twisted internals, secrets still redacted; over the lines the
real daemon (C{twistd -n fleetd}) writes at start, at a delivery and at
refusals, and over single events.
"""

from __future__ import annotations

import enum
import io
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import Logger, LogPublisher
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd import logs
from fleetd.logs import REDACTED, makeObserver
from fleetd.pki.dev import DevPKIPaths
from tests.daemonsupport import (
    UUID1,
    UUID2,
    configPath,
    httpsGet,
    httpsJSON,
    httpsRequest,
)
from tests.support import writeConfig
from tests.test_twistd import proto_pid, spawn

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LEVELS = {"debug", "info", "warn", "error", "critical"}
# What Twisted's own JSON (eventAsJSON) carried, that a collector cannot use.
INTERNALS = ("log_", "__class_uuid__", "unpersistable", "log_flattened")
SECRET = "LIVEcode0123456789abcdefghijklmn"


class Kind(enum.Enum):
    SCAN = "receiving-scan"


def checkFlat(test: SynchronousTestCase, line: str) -> dict[str, Any]:
    """
    C{line} is one JSON object: C{time}, C{level}, C{event} first, every
    value a scalar or an array of scalars, no Twisted internal anywhere.
    """
    for internal in INTERNALS:
        test.assertNotIn(internal, line)
    document: dict[str, Any] = json.loads(line)
    test.assertIsInstance(document, dict)
    test.assertEqual(list(document)[:3], ["time", "level", "event"], line)
    test.assertRegex(document["time"], TIME)
    test.assertIn(document["level"], LEVELS)
    test.assertTrue(document["event"])
    scalar = (str, int, float, bool, type(None))
    for key, value in document.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            test.assertIsInstance(item, scalar, f"{key} in {line}")
    return document


def emitted(emit: Any) -> list[dict[str, Any]]:
    out = io.StringIO()
    log = Logger(
        namespace="fleetd.test", observer=LogPublisher(makeObserver("json", out))
    )
    emit(log)
    return [json.loads(line) for line in out.getvalue().splitlines()]


class JSONLineTests(SynchronousTestCase):
    """Single events through the json observer."""

    def test_fleetdEvent_nameAndOwnFields(self) -> None:
        """
        A fleetd event: its name is the format's first word, its fields the
        ones the format names (in order) and the call supplied, nothing else.
        """
        (line,) = emitted(
            lambda log: log.warn(
                "tink.h2.enhance-your-calm {reason} {source}",
                reason="frames",
                source="10.0.0.9",
                streams=3,
            )
        )
        self.assertEqual(
            line.pop("time")[:2] + line.pop("level"), "20warn"
        )  # the year's first digits
        self.assertEqual(
            line,
            {
                "event": "tink.h2.enhance-your-calm",
                "reason": "frames",
                "source": "10.0.0.9",
                "streams": 3,
            },
        )

    def test_eventName_filledAndTrimmed(self) -> None:
        """A field inside the first word is filled in; a trailing colon dropped."""
        cases = [
            (
                {"log_format": "netbox.push.{state} {entry}", "state": "retry"},
                "netbox.push.retry",
            ),
            (
                {"log_format": "netbox.device.invalid: {reason}"},
                "netbox.device.invalid",
            ),
            ({"log_format": "fleetd.ready"}, "fleetd.ready"),
            ({"log_format": "Received SIGTERM, shutting down."}, None),
            ({"log_format": "{log_text}", "log_text": "x"}, None),
            ({}, None),
        ]
        for event, name in cases:
            self.assertEqual(logs.eventName(event), name, event)

    def test_values_jsonSafe(self) -> None:
        """
        Addresses print as host:port, bytes as text, sets and tuples as
        arrays, mappings as their JSON text with secret keys redacted,
        non-finite floats as text, other objects as their str.
        """
        (line,) = emitted(
            lambda log: log.info(
                "x.values {a} {b}",
                a=IPv4Address("TCP", "10.1.2.3", 443),
                b=IPv6Address("TCP", "::1", 53),
                raw=b"abc",
                seen=frozenset({"b", "a"}),
                pair=(1, [2, 3]),
                doc={"run": "r-1", "token": "t0k3n"},
                ratio=float("inf"),
                event="mine",
                kind=Kind.SCAN,
                path=Path("/x"),
            )
        )
        self.assertEqual(line["a"], "10.1.2.3:443")
        self.assertEqual(line["b"], "[::1]:53")
        self.assertEqual(line["raw"], "abc")
        self.assertEqual(line["seen"], ["a", "b"])
        self.assertEqual(line["pair"], [1, "[2, 3]"])
        self.assertEqual(json.loads(line["doc"]), {"run": "r-1", "token": REDACTED})
        self.assertEqual(line["ratio"], "inf")
        self.assertEqual(line["event"], "x.values")  # the name stays...
        self.assertEqual(line["event_"], "mine")  # ...the field is kept beside it
        self.assertEqual(line["kind"], "receiving-scan")
        self.assertEqual(line["path"], "/x")

    def test_secrets_stillRedacted(self) -> None:
        """
        [A2] Secret-named fields, codes in any text (fields, free-text
        formats, list items, mapping values) and tracebacks stay masked.
        """
        emits = [
            lambda log: log.info("x.code {code}", code=SECRET),
            lambda log: log.info("x.where {what}", what=f"GET /config?code={SECRET}"),
            lambda log: log.info(f"pre-formatted code={SECRET}"),
            lambda log: log.info("x.list {where}", where=[f"token={SECRET}"]),
            lambda log: log.info("x.map {m}", m={"url": f"/t?device_code={SECRET}"}),
            lambda log: log.info("x.quote {q}", q=f'unbalanced code="{SECRET}'),
            lambda log: log.info("x.keys {m}", m={f"/config?code={SECRET}": 1}),
        ]
        for emit in emits:
            (line,) = emitted(emit)
            text = json.dumps(line)
            self.assertNotIn(SECRET, text)
            self.assertIn(REDACTED, text)

    def test_failure_typeAndTraceback(self) -> None:
        """A failure adds its type and message, and its (scrubbed) traceback."""

        def emit(log: Logger) -> None:
            try:
                raise RuntimeError(f"no producer for ?code={SECRET}")
            except RuntimeError:
                log.failure("runs.record.failed")

        (line,) = emitted(emit)
        self.assertEqual(line["event"], "runs.record.failed")
        self.assertEqual(line["level"], "critical")
        self.assertTrue(line["failure"].startswith("RuntimeError: no producer"))
        self.assertIn("Traceback", line["traceback"])
        self.assertNotIn(SECRET, json.dumps(line))

    def test_foreignLine_namespaceAndMessage(self) -> None:
        """A line that is not a fleetd event: its namespace, and its text."""
        out = io.StringIO()
        publisher = LogPublisher(makeObserver("json", out))
        Logger(namespace="twisted.internet.base", observer=publisher).info(
            "Received SIGTERM, shutting down."
        )
        line = checkFlat(self, out.getvalue())
        self.assertEqual(line["event"], "twisted.internet.base")
        self.assertEqual(line["message"], "Received SIGTERM, shutting down.")


class DaemonJSONTests(TestCase):
    """The real daemon's lines at start, at a delivery and at refusals."""

    timeout = 120

    async def test_daemon_startDeliveryRefusal_flatJSON(self) -> None:
        """
        C{twistd -n fleetd --log-format json}: every line it writes at
        start, at refusals (an unknown code, a code from another machine, a
        TPM 1.2's attestation), at a delivery (C{GET /config} 200, then 410)
        and at stop is one flat JSON object of time, level, event and the
        event's own fields: no Twisted internals, listener addresses as
        host:port, the code nowhere, 95 % of lines under 300 characters.
        """
        directory = Path(self.mktemp()).resolve()
        proto = spawn(self, writeConfig(directory), "--log-format", "json")
        await proto.ready()
        pki = DevPKIPaths.inside(directory / "pki")
        owner = (pki.owner_cert, pki.owner_key)

        async def admin(method: str, path: str, body: Any) -> tuple[int, Any]:
            port = proto.ports["admin"]
            result: tuple[int, Any] = await deferToThread(
                httpsJSON, port, method, path, pki.public_ca, owner, body
            )
            return result

        async def boot(path: str) -> int:
            port = proto.ports["boot"]
            status, _, _ = await deferToThread(httpsGet, port, path, pki.public_ca)
            return status

        device = {"name": "w1", "serial": "SER1", "uuid": UUID1, "class": "worker"}
        self.assertEqual((await admin("POST", "/v1/admin/devices", device))[0], 201)
        status, doc = await admin("POST", "/v1/admin/provision", {"devices": ["w1"]})
        self.assertEqual(status, 201, doc)
        code = doc["runs"][0]["code"]
        # refusals: an unknown code, the code from another machine, a TPM 1.2
        self.assertEqual(await boot(configPath("0" * len(code), UUID1, "SER1")), 404)
        self.assertEqual(await boot(configPath(code, UUID2, "SER2")), 403)
        claim = json.dumps({"tpm_version": "1.2", "serial": "SER1"}).encode()
        status, _ = await deferToThread(
            httpsRequest, proto.ports["device"], "POST", "/v1/attest/challenge",
            pki.public_ca, None, claim, "application/json",
        )  # fmt: skip
        self.assertEqual(status, 403)
        # the delivery, and the code once more
        self.assertEqual(await boot(configPath(code, UUID1, "SER1")), 200)
        self.assertEqual(await boot(configPath(code, UUID1, "SER1")), 410)
        for _ in range(200):  # until the delivery is recorded
            _, journal = await admin("GET", "/v1/admin/journal", None)
            if "run.delivered" in [e["event"] for e in journal["entries"]]:
                break
            await deferLater(reactor, 0.05, lambda: None)
        os.kill(proto_pid(proto), signal.SIGTERM)
        self.assertEqual(await proto.ended, 0, proto.err)

        output = proto.out.decode("utf-8")
        self.assertNotIn(code, output)
        lines = output.splitlines()
        documents = [checkFlat(self, line) for line in lines]
        events = [d["event"] for d in documents]
        for wanted in ("fleetd.started", "listen.started", "dns.listening",
                       "fleetd.ready", "fleetd.stopping"):  # fmt: skip
            self.assertIn(wanted, events)
        (started,) = [d for d in documents if d["event"] == "fleetd.started"]
        self.assertEqual(
            set(started), {"time", "level", "event", "version", "site", "entries"}
        )
        listening = [d for d in documents if d["event"] == "listen.started"]
        self.assertEqual(
            {d["listener"] for d in listening}, {"boot", "device", "admin", "tink"}
        )
        for d in listening:
            self.assertRegex(d["address"], r"^127\.0\.0\.1:\d+$")
            self.assertEqual(set(d), {"time", "level", "event", "listener", "address"})
        access = [d for d in documents if d["event"] == "http.access"]
        configs = [d["status"] for d in access if d["path"] == "/config"]
        self.assertEqual(configs, [404, 403, 200, 410])
        self.assertEqual(
            set(access[-1]),
            {"time", "level", "event", "method", "path", "status", "peer"},
        )
        (wrong,) = [d for d in documents if d["event"] == "config.wrong-machine"]
        self.assertEqual(
            (wrong["level"], wrong["device"], wrong["peer"], len(wrong)),
            ("warn", "w1", "127.0.0.1", 5),
        )
        (refused,) = [d for d in documents if d["event"] == "attest.refused"]
        self.assertEqual(
            (refused["level"], refused["reason"], refused["device"], len(refused)),
            ("warn", "tpm12-unsupported", None, 5),
        )
        sizes = sorted(len(line) for line in lines)
        p95 = sizes[int(0.95 * (len(sizes) - 1))]
        self.assertLess(p95, 300, f"p95 {p95}: {sizes}")
        self.assertTrue(len(lines) >= 20, lines)
