"""Tests for L{fleetd.logs}: formats and redaction."""

from __future__ import annotations

import io
import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import Logger, LogPublisher, capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyChannel

from fleetd.logs import (
    BEARER,
    REDACTED,
    SECRET_ASSIGNMENT,
    ThrottledLog,
    makeObserver,
    redact,
    scrub,
)
from fleetd.web.site import BoundedRequest

SECRET = "LIVEcode0123456789abcdefghijklmn"


class LogTests(SynchronousTestCase):
    def emit(self, fmt: str, **fields: object) -> str:
        out = io.StringIO()
        publisher = LogPublisher(makeObserver(fmt, out))
        Logger(namespace="fleetd.test", observer=publisher).info(
            "run.served {run} {code}", **fields
        )
        return out.getvalue()

    def test_json_oneObjectPerLine(self) -> None:
        """
        --log-format json writes one flat JSON object per line: time, level,
        the event's name and its own fields (issue 27, item 7).
        """
        line = self.emit("json", run="r-1", code="SECRETCODE")
        self.assertEqual(line.count("\n"), 1)
        event = json.loads(line)
        self.assertEqual(list(event), ["time", "level", "event", "run", "code"], event)
        self.assertEqual((event["event"], event["run"]), ("run.served", "r-1"))

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


class PatternRedactionTests(SynchronousTestCase):
    """The observer masks secrets wherever they appear, not only by field name."""

    def emitted(self, fmt: str, emit: object) -> str:
        out = io.StringIO()
        publisher = LogPublisher(makeObserver(fmt, out))
        log = Logger(namespace="fleetd.test", observer=publisher)
        emit(log)  # type: ignore[operator]
        return out.getvalue()

    def test_scrub_assignmentsAndBearer(self) -> None:
        """
        C{code=}, C{token=}, C{device_code=} (also URL-encoded and quoted)
        and bearer tokens are masked in any text; other text is left alone.
        """
        cases = [
            f"GET /config?code={SECRET}&uuid=u",
            f"/token?device_code={SECRET}",
            f"grant_type=x&access_token={SECRET}",
            f"Provisioned(run='r-1', code='{SECRET}', device='w1')",
            f"code%3D{SECRET}",
            f"Authorization: Bearer {SECRET}",
        ]
        for text in cases:
            self.assertNotIn(SECRET, scrub(text), text)
            self.assertIn(REDACTED, scrub(text), text)
        self.assertEqual(scrub("run=r-1 device=w1 uuid=u"), "run=r-1 device=w1 uuid=u")

    def test_scrub_bootstrapToken(self) -> None:
        """[K1] A bootstrap token in any text keeps its public id, loses its secret."""
        self.assertEqual(
            scrub("cluster:\n  token: abc123.0123456789abcdef\n"),
            f"cluster:\n  token: abc123.{REDACTED}\n",
        )

    @settings(max_examples=3000)
    @given(
        st.lists(
            st.sampled_from(
                [
                    "code",
                    "token",
                    "_",
                    "=",
                    "%3D",
                    "%3d",
                    "Bearer ",
                    "bEaReR ",
                    "BEARER\t",
                    "bearer",
                    ".",
                    "'",
                    '"',
                    "\\",
                    " ",
                    "\n",
                    "&",
                    "abc123",
                    "0123456789abcdef",
                    "abc123.0123456789abcdef",
                    "x",
                    "Z9",
                    "\u212a",
                    "é",
                    ":",
                    ";",
                ]
            )
            | st.text(max_size=3),
            max_size=20,
        ).map("".join)
    )
    def test_scrub_sameAsEveryPatternEverywhere(self, text: str) -> None:
        """
        The prefilters and the dot-first bootstrap pattern change nothing:
        the same output as running the three patterns as first written,
        over every text.
        """
        self.assertEqual(scrub(text), _scrubEverywhere(text))

    def test_freeText_inFieldsFormatsAndLegacy_masked(self) -> None:
        """
        [A2] A code inside any field's text, a pre-formatted format string or
        a legacy message never reaches a line, in either format.
        """
        emits = [
            lambda log: log.info("x {what}", what=f"GET /config?code={SECRET}"),
            lambda log: log.info(f"pre-formatted code={SECRET}"),
            lambda log: log.info("x {where}", where=[f"token={SECRET}"]),
        ]
        for fmt in ("text", "json"):
            for emit in emits:
                line = self.emitted(fmt, emit)
                self.assertNotIn(SECRET, line)
                self.assertIn(REDACTED, line)

    def test_requestObject_describedWithoutQuery(self) -> None:
        """[A2] A request object in an event prints as method and path only."""
        request = BoundedRequest(DummyChannel())
        request.method = b"HEAD"
        request.uri = b"/config?code=" + SECRET.encode()
        event = redact({"log_format": "{slf}", "slf": request})
        self.assertEqual(event["slf"], "<BoundedRequest HEAD /config>")
        for fmt in ("text", "json"):
            line = self.emitted(fmt, lambda log: log.info("Warning {slf}", slf=request))
            self.assertNotIn(SECRET, line)
            self.assertIn("/config", line)

    def test_failureText_masked(self) -> None:
        """A traceback whose exception message holds a code is masked too."""
        for fmt in ("text", "json"):

            def emit(log: Logger) -> None:
                try:
                    raise RuntimeError(f"Producer not unregistered for ?code={SECRET}")
                except RuntimeError:
                    log.failure("boom")

            line = self.emitted(fmt, emit)
            self.assertIn("RuntimeError", line)
            self.assertNotIn(SECRET, line)


class ThrottledLogTests(SynchronousTestCase):
    """Per-request lines: at most C{burst} per window per event."""

    def test_burstThenSuppressedCount(self) -> None:
        """
        Ten lines pass, the rest are counted; after the window the next line
        says how many were suppressed; other events have their own budget.
        """
        clock = Clock()
        log = ThrottledLog(clock, burst=10, window=10.0)
        with capturedLogs() as events:
            for i in range(50):
                log.warn("per.request {i}", i=i)
            log.warn("other.event")
            clock.advance(9.9)
            log.warn("per.request {i}", i=50)
            clock.advance(0.1)
            log.warn("per.request {i}", i=51)
            log.info("per.request {i}", i=52)
        shown = [e.get("i") for e in events if e["log_format"].startswith("per.")]
        self.assertEqual(shown, [*range(10), 51, 52])
        self.assertEqual(events[-2]["suppressed"], 41)
        self.assertIn("41 similar lines suppressed", formatEvent(events[-2]))
        self.assertNotIn("suppressed", events[-1])
        other = [e for e in events if e["log_format"] == "other.event"]
        self.assertEqual(len(other), 1)
        self.assertEqual(clock.getDelayedCalls(), [])


class SecretReprTests(SynchronousTestCase):
    """Objects that hold a code print without it."""

    def test_provisioned_reprWithoutCode(self) -> None:
        """
        [A2] repr(Provisioned) (as a log line or a traceback would show it)
        names the run and device but not the code; toJSON still has it.
        """
        from fleetd.runs.provision import Provisioned

        provisioned = Provisioned(run="r-0123", code=SECRET, device="w1")
        for text in (repr(provisioned), str(provisioned)):
            self.assertNotIn(SECRET, text)
            self.assertIn("r-0123", text)
            self.assertIn("w1", text)
        self.assertEqual(provisioned.toJSON()["code"], SECRET)


def _scrubEverywhere(text: str) -> str:
    """L{scrub} as first written: every pattern over every text."""
    text = SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    text = BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    token = re.compile(r"\b([a-z0-9]{6})\.[a-z0-9]{16}\b")
    return token.sub(lambda m: f"{m.group(1)}.{REDACTED}", text)
