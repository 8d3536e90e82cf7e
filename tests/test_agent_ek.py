"""
C{fleetd-agent ek} over a real swtpm (EK certificates from swtpm_setup):
the receiving scan's reading of a machine [T1], checked against fleetd's
own EK digest at attestation, and sending nothing anywhere.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

from fleetd.agent import main as agent
from fleetd.agent import tpm
from fleetd.attest.tpm import checkEK, ekDigest
from fleetd.cli.fleetctl import buildParser as fleetctlParser
from fleetd.trust.model import EvidenceKind, evidence
from tests.swtpmsupport import SWTPMTestCase, ekDigestOf

SERIAL = "SER1"
UUID = "4c4c4544-0042-3510-8050-b4c04f4d3232"
REF = "dock 2026-12-06"
CERTS = {"rsa": "ek-rsa2048.crt", "ecc": "ek-secp384r1.crt"}

# Audit events of network use from Python code (sockets, name lookups)
# and of starting programs, seen while a guard is on; a guarded thread's
# attempt is refused as well as recorded.
_guarded: dict[int, list[str]] = {}
_WATCHED = ("socket.", "subprocess.Popen", "os.exec", "os.posix_spawn")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    seen = _guarded.get(threading.get_ident())
    if seen is not None and event.startswith(_WATCHED) and event != "socket.__new__":
        seen.append(event)
        raise PermissionError(f"blocked by the test: {event}")


sys.addaudithook(_audit)


def smbiosRoot(base: Path, serial: str | None = SERIAL) -> Path:
    """A sysfs root whose SMBIOS holds C{serial} (none when L{None}) and UUID."""
    dmi = base / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    if serial is not None:
        (dmi / "product_serial").write_text(serial + "\n")
    (dmi / "product_uuid").write_text(UUID + "\n")
    return base


class EKScanTests(SWTPMTestCase):
    """One manufactured swtpm (RSA-2048 and ECC P-384 EKs) for the class."""

    def scan(
        self, *after: str, before: tuple[str, ...] = (), serial: str | None = SERIAL
    ) -> tuple[int, str, str]:
        """
        Run C{fleetd-agent [before] ek [after]} in this thread, with no
        C{--server} and no C{--ca}.
        """
        root = smbiosRoot(Path(self.mktemp()), serial)
        argv = ["--tcti", self.swtpm.tcti, *before, "ek"]
        argv += ["--sysfs-root", str(root), *after]
        out, err = io.StringIO(), io.StringIO()
        code = agent.main(argv, err, out)
        return code, out.getvalue(), err.getvalue()

    def scanJSON(self, *after: str) -> dict[str, Any]:
        code, out, err = self.scan(*after, before=("--json",))
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.count("\n"), 1)
        document: dict[str, Any] = json.loads(out)
        return document

    def fleetdDigest(self, family: str) -> str:
        """
        The EK digest fleetd's attestation service computes for this TPM's
        C{family} EK: the agent's claim (EK certificate and EK public area)
        through the service's own certificate check and L{checkEK}.
        """
        ectx = tpm.openTPM(self.swtpm.tcti)
        try:
            keys = tpm.createKeys(ectx, family)
        finally:
            ectx.close()
        cert = self.server.service.ekRoots.verify(keys.ekCert)
        return ekDigest(checkEK(keys.ekPublic, cert.spki))

    def test_ek_digestsAreFleetdsOwn(self) -> None:
        """
        [T1] The RSA and the ECC EK digest that C{ek --json} prints equal
        the digest fleetd's attestation service computes for the same TPM,
        and the digest of the EK certificate swtpm_setup wrote; serial and
        uuid come from SMBIOS; the RSA EK is the one C{attest} presents.
        """
        document = self.scanJSON()
        self.assertEqual(
            (document["serial"], document["uuid"], document["kind"]),
            (SERIAL, UUID, "receiving-scan"),
        )
        eks = {e["ek"]: e for e in document["eks"]}
        self.assertEqual([e["ek"] for e in document["eks"]], ["rsa", "ecc"])
        certs = self.swtpm.ekCertificates()
        for family in ("rsa", "ecc"):
            digest = eks[family]["ek_sha256"]
            self.assertEqual(digest, self.fleetdDigest(family), family)
            self.assertEqual(digest, ekDigestOf(certs[CERTS[family]]), family)
            self.assertIsNone(eks[family]["problem"])
            self.assertIn("CN=", eks[family]["issuer"])
        self.assertNotEqual(eks["rsa"]["ek_sha256"], eks["ecc"]["ek_sha256"])
        self.assertEqual(
            (eks["rsa"]["ek_type"], eks["ecc"]["ek_type"]),
            ("EK-RSA2048", "EK-HIGH-ECC384"),
        )
        self.assertEqual(
            (eks["rsa"]["used_by_attest"], eks["ecc"]["used_by_attest"]),
            (True, False),
        )
        self.assertIn("independent evidence", document["note"])

    def test_ek_lineIsWhatFleetctlTakes(self) -> None:
        """
        [T1] Each printed line is a C{fleetctl evidence add} that fleetctl's
        own parser and evidence checks accept as it stands: the serial, the
        digest, kind receiving-scan and the C{--ref} given.
        """
        document = self.scanJSON("--ref", REF)
        for ek in document["eks"]:
            words = shlex.split(ek["fleetctl"])
            self.assertEqual(words[:3], ["fleetctl", "evidence", "add"])
            args = fleetctlParser().parse_args(words[1:])
            claim = evidence(
                serial=args.serial,
                ek_sha256=args.ek_sha256,
                kind=args.kind,
                ref=args.ref,
            )
            self.assertEqual(
                (claim.serial, claim.ek_sha256, claim.kind, claim.ref),
                (SERIAL, ek["ek_sha256"], EvidenceKind.RECEIVING_SCAN, REF),
            )

    async def _attestWith(self, family: str, *extra: str) -> None:
        document = self.scanJSON(*extra)
        (used,) = [e for e in document["eks"] if e["used_by_attest"]]
        self.assertEqual(used["ek"], family)
        self.server.addDevice("w1", SERIAL)
        self.server.bindings.approved[used["ek_sha256"]] = SERIAL
        code, _, err = await self.agent("attest", "--serial", SERIAL, *extra)
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(len(self.server.entries("ldevid.issued")), 1)

    async def test_ek_usedLine_attests(self) -> None:
        """
        [T1] [T3] With a binding approved on the digest of the line marked as
        the one attest presents, C{attest} (default C{--ek auto}) gets its
        LDevID: the evidence names the EK fleetd sees at attestation.
        """
        await self._attestWith("rsa")

    async def test_ek_eccChoice_attestsWithECC(self) -> None:
        """
        [T1] [T3] C{ek --ek ecc} marks the ECC EK as the one attest presents,
        and C{attest --ek ecc} attests on a binding to that digest.
        """
        await self._attestWith("ecc", "--ek", "ecc")

    def test_ek_text_linesAndNote(self) -> None:
        """
        The person's output: serial, uuid, each EK's issuer, the line to
        carry (RSA) as it stands and the other commented out, and the note
        that the digest must be compared with independent evidence.
        """
        document = self.scanJSON()
        rsa, ecc = (e["ek_sha256"] for e in document["eks"])
        code, out, err = self.scan()
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        line = f"fleetctl evidence add --serial {SERIAL} --ek-sha256 {rsa}"
        line += " --kind receiving-scan"
        self.assertIn(f"  {line}", lines)
        self.assertIn(f"  # {line.replace(rsa, ecc)}", lines)
        self.assertIn(f"uuid:   {UUID}", lines)
        self.assertEqual(out.count("certificate issuer: "), 2)
        self.assertIn("compared them with independent evidence", out)
        self.assertIn("Nothing was sent to fleetd.", out)

    def test_ek_noSMBIOSSerial_placeholder(self) -> None:
        """Without an SMBIOS serial the line asks for the label's serial."""
        code, out, err = self.scan(serial=None)
        self.assertEqual((code, err), (0, ""))
        self.assertIn("--serial CHASSIS-SERIAL --ek-sha256 ", out)
        self.assertIn("SMBIOS has none", out)

    def test_ek_sendsNothing(self) -> None:
        """
        [T1] A reported digest must never establish trust: C{ek} needs no
        C{--server}, opens no socket, looks up no name and starts no
        program (a guard refuses and records any attempt); it still reads
        the TPM (swtpm's TCTI is C, beneath the guard) and prints both EKs.
        """
        seen: list[str] = []
        _guarded[threading.get_ident()] = seen
        try:
            code, out, err = self.scan(before=("--json",))
        finally:
            del _guarded[threading.get_ident()]
        self.assertEqual((code, err, seen), (0, "", []))
        self.assertEqual(len(json.loads(out)["eks"]), 2)
        # The guard does refuse: a connection attempt under it is recorded.
        import socket

        _guarded[threading.get_ident()] = seen
        try:
            with self.assertRaises(PermissionError):
                socket.create_connection(("127.0.0.1", 9), 1)
        finally:
            del _guarded[threading.get_ident()]
        self.assertIn("socket.getaddrinfo", seen)

    def test_ek_jsonAfterCommand(self) -> None:
        """C{--json} may stand after C{ek} as well as before it."""
        code, out, err = self.scan("--json")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out)["serial"], SERIAL)


class EKScanTPM12Tests(SWTPMTestCase):
    tpm2 = False

    def test_ek_tpm12_oneLine(self) -> None:
        """[T2] A TPM 1.2: one line saying fleetd attests TPM 2.0 only, exit 1."""
        root = smbiosRoot(Path(self.mktemp()))
        argv = ["--tcti", self.swtpm.tcti, "ek", "--sysfs-root", str(root)]
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(agent.main(argv, err, out), 1)
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertIn("tpm12-unsupported", err.getvalue())
        self.assertEqual(out.getvalue(), "")
