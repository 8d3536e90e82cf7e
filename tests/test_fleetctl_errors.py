"""
fleetctl's failures (issue 27, item 11): with C{--json} a failure is one
JSON object on stdout as well as its line on stderr, with the exit status
unchanged; an unknown device name gets the inventory's closest names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.cli.client import AdminError
from fleetd.cli.fleetctl import asksForJSON
from fleetd.cli.names import closeNames, hint, suggest
from fleetd.clitools import CLIError, errorDocument
from tests.daemonsupport import DaemonTestMixin
from tests.fleetctlsupport import fleetctlAgainst, runFleetctl
from tests.support import writeConfig

UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"


class JSONErrorFrameTests(SynchronousTestCase):
    """Failures before fleetd is asked, with and without C{--json}."""

    def assertJSONError(
        self, argv: list[str], status: int, words: str
    ) -> dict[str, Any]:
        """
        C{argv} fails with exit C{status}: one line on stderr naming
        C{words}, and on stdout one JSON object saying the same.
        """
        code, out, err = runFleetctl(argv)
        self.assertEqual((code, err.count("\n")), (status, 1), err)
        self.assertIn(words, err)
        self.assertEqual(out.count("\n"), 1, out)
        doc: dict[str, Any] = json.loads(out)
        self.assertEqual(doc["status"], status)
        self.assertIn(words, doc["error"])
        line = str(doc["error"])
        self.assertEqual(
            line if line.startswith("fleetctl") else f"fleetctl: {line}", err[:-1]
        )
        self.assertNotIn("http_status", doc)
        return doc

    def test_usageError_jsonBeforeOrAfter(self) -> None:
        """
        A usage mistake with C{--json} (before the command or after it) is
        C{{"error": LINE, "status": 2}} on stdout, and its line on stderr.
        """
        self.assertJSONError(["--json", "frobnicate"], 2, "invalid choice")
        self.assertJSONError(["status", "--json"], 2, "NAME")

    def test_configError_json(self) -> None:
        """A configuration that cannot be read: the same, exit 2."""
        self.assertJSONError(
            ["--json", "--config", "/nonexistent.toml", "journal"],
            2,
            "cannot read /nonexistent.toml",
        )

    def test_daemonDown_json(self) -> None:
        """fleetd not answering: exit 1, and no HTTP status in the object."""
        directory = Path(self.mktemp()).resolve()
        config = writeConfig(directory, {"owner": {"server": "https://localhost:1"}})
        from fleetd.pki.dev import ensureDevPKI

        ensureDevPKI(directory / "pki", "enroll.lolwtf.ca")
        self.assertJSONError(
            ["--config", str(config), "journal", "--json"],
            1,
            "cannot reach fleetd at https://localhost:1",
        )

    def test_withoutJSON_nothingOnStdout(self) -> None:
        """Without C{--json}, a failure leaves stdout empty, as before."""
        code, out, err = runFleetctl(["frobnicate"])
        self.assertEqual((code, out, err.count("\n")), (2, "", 1))

    def test_asksForJSON(self) -> None:
        """C{--json} counts anywhere before C{--}, and only as itself."""
        self.assertTrue(asksForJSON(["status", "w1", "--json"]))
        self.assertTrue(asksForJSON(["--json", "status"]))
        self.assertFalse(asksForJSON(["status", "w1"]))
        self.assertFalse(asksForJSON(["journal", "--", "--json"]))
        self.assertFalse(asksForJSON(["journal", "reanchor", "--reason=--json"]))

    def test_errorDocument(self) -> None:
        """The object: the line, the exit status and the error's own fields."""
        self.assertEqual(
            errorDocument(CLIError("backup: x exists", 1)),
            {"error": "backup: x exists", "status": 1},
        )
        self.assertEqual(
            errorDocument(AdminError(409, "serial S already belongs to w1")),
            {
                "error": "fleetd answered 409: serial S already belongs to w1",
                "status": 1,
                "http_status": 409,
            },
        )


NAMES = ["w1", "w2", "w10", "cp1", "storage-07"]


def listed() -> list[str]:
    return list(NAMES)


def failing() -> list[str]:
    raise CLIError("cannot reach fleetd")


class DidYouMeanTests(SynchronousTestCase):
    """The closest names for a device name fleetd does not know."""

    def test_closeNames(self) -> None:
        """difflib's closest names, best first, case aside; none when far."""
        self.assertEqual(closeNames("storage-7", NAMES), ["storage-07"])
        self.assertEqual(closeNames("CP11", NAMES), ["cp1"])
        self.assertEqual(closeNames("w100", NAMES)[0], "w10")
        self.assertEqual(closeNames("gateway", NAMES), [])

    def test_hint(self) -> None:
        self.assertEqual(hint([]), "")
        self.assertEqual(hint(["w1"]), " (did you mean w1?)")
        self.assertEqual(hint(["w1", "w10"]), " (did you mean w1 or w10?)")
        self.assertEqual(hint(["w1", "w10", "w2"]), " (did you mean w1, w10 or w2?)")

    def test_suggest_unknownName(self) -> None:
        """A 404 naming a name the inventory lacks: the line gets the hint."""
        error = AdminError(404, "no device named storage-7")
        better = suggest(error, ["storage-7"], listed)
        self.assertEqual(
            str(better),
            "fleetd answered 404: no device named storage-7 (did you mean storage-07?)",
        )
        self.assertEqual(
            errorDocument(better),
            {
                "error": str(better),
                "status": 1,
                "http_status": 404,
                "did_you_mean": ["storage-07"],
            },
        )

    def test_suggest_firstUnknownOfSeveral(self) -> None:
        """C{provision w1 cp11}: the name fleetd refused, not the others."""
        error = AdminError(404, "unknown device cp11")
        better = suggest(error, ["w1", "cp11"], listed)
        self.assertTrue(str(better).endswith("(did you mean cp1?)"), str(better))

    def test_suggest_leavesOtherErrorsAlone(self) -> None:
        """
        No hint unless a 404 names a given name the inventory lacks and a
        name is close; a listing that fails leaves the refusal as it was.
        """
        cases = [
            (AdminError(409, "no device named storage-7"), ["storage-7"], listed),
            (AdminError(404, "no run named r-1 in the journal"), ["w1"], listed),
            (AdminError(404, "no disk report from w1"), ["w1"], listed),
            (AdminError(404, "no device named gateway"), ["gateway"], listed),
            (AdminError(404, "no device named storage-7"), ["storage-7"], failing),
            (AdminError(404, "no device named storage-77"), ["storage-7"], listed),
            (AdminError(404, "no device named storage-7"), [], listed),
        ]
        for error, given, names in cases:
            self.assertIs(suggest(error, given, names), error, (str(error), given))


# Each command naming w1x where the inventory holds w1, as an operator
# would mistype it.
MISTYPED = [
    ("status", "w1x"),
    ("device", "show", "w1x"),
    ("device", "forget-identity", "w1x", "--reason", "r"),
    ("provision", "w1x"),
    ("retire", "w1x", "--yes"),
    ("disks", "forget", "w1x", "--reason", "moved"),
    ("journal", "--device", "w1x"),
]


class RefusalTests(DaemonTestMixin, TestCase):
    """fleetctl against a daemon whose inventory holds w1."""

    async def daemon(self) -> str:
        _, fleetctl = await self.daemonWithDevice()
        return str(fleetctl.config)

    async def test_everyDeviceCommand_didYouMean(self) -> None:
        """
        Every command that takes a device name answers a mistyped one with
        fleetd's line and the closest name: one line, exit 1, nothing on
        stdout; with C{--json}, the same line as C{error}, C{status} 1,
        C{http_status} 404 and C{did_you_mean} on stdout.
        """
        config = await self.daemon()
        for words in MISTYPED:
            code, out, err = await fleetctlAgainst(config, *words)
            self.assertEqual((code, out, err.count("\n")), (1, "", 1), (words, err))
            self.assertTrue(err.startswith("fleetctl: fleetd answered 404: "), err)
            self.assertTrue(err.endswith(" (did you mean w1?)\n"), (words, err))
            code, out, err2 = await fleetctlAgainst(config, *words, "--json")
            self.assertEqual((code, err2), (1, err), words)
            self.assertEqual(
                json.loads(out),
                {
                    "error": err[len("fleetctl: ") : -1],
                    "status": 1,
                    "http_status": 404,
                    "did_you_mean": ["w1"],
                },
            )

    async def test_refusal_json(self) -> None:
        """
        A refusal that is no unknown name: with C{--json}, its line, exit
        status and HTTP status on stdout, and no C{did_you_mean}.
        """
        config = await self.daemon()
        argv = ["device", "add", "w2", "--serial", "SN-1", "--uuid", UUID,
                "--class", "worker"]  # fmt: skip
        code, out, err = await fleetctlAgainst(config, "--json", *argv)
        self.assertEqual(code, 1)
        self.assertEqual(
            json.loads(out),
            {"error": err[len("fleetctl: ") : -1], "status": 1, "http_status": 409},
        )
        self.assertIn("SN-1", err)
