"""Tests for L{fleetd.logs}: formats and redaction."""

from __future__ import annotations

import io
import json

from twisted.logger import Logger, LogPublisher
from twisted.trial.unittest import SynchronousTestCase

from fleetd.logs import REDACTED, makeObserver, redact


class LogTests(SynchronousTestCase):
    def emit(self, fmt: str, **fields: object) -> str:
        out = io.StringIO()
        publisher = LogPublisher(makeObserver(fmt, out))
        Logger(namespace="fleetd.test", observer=publisher).info(
            "run.served {run} {code}", **fields
        )
        return out.getvalue()

    def test_json_oneObjectPerLine(self) -> None:
        """--log-format json writes one JSON object per line with the text."""
        line = self.emit("json", run="r-1", code="SECRETCODE")
        self.assertEqual(line.count("\n"), 1)
        event = json.loads(line)
        self.assertEqual(event["run"], "r-1")
        self.assertEqual(event["log_namespace"], "fleetd.test")
        self.assertIn("r-1", event["message"])

    def test_secretFields_redacted(self) -> None:
        """Fields named like secrets never reach a log line, in either format."""
        for fmt in ("json", "text"):
            out = self.emit(fmt, run="r-1", code="SECRETCODE")
            self.assertNotIn("SECRETCODE", out)
            self.assertIn(REDACTED, out)

    def test_redact_names(self) -> None:
        """Names with secret words are redacted; similar safe names are not."""
        event = redact(
            {
                "token": 1,
                "access_token": 2,
                "config_body": 3,
                "private_key": 4,
                "device": 5,
                "run": 6,
                "keyboard": 7,
                "log_format": "x",
            }
        )
        self.assertEqual(
            {k for k, v in event.items() if v == REDACTED},
            {"token", "access_token", "config_body", "private_key"},
        )
