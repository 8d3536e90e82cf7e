"""
Issue 9's acceptance, end to end: the real C{fleetd-agent} against a
running fleetd daemon over TLS, with a real swtpm (behind tpm2-abrmd where
the agent presents its TPM-resident LDevID) [T1] [T3] [T4] [D1]: weak
evidence never lets a node attest; a cloned TPM claiming another serial,
a certify over another nonce, a tampered certify and a replayed proof
are refused; a legacy
(capsule/forge) LDevID works until the node attests through spore, then
is refused, and C{fleetctl status} shows the binding, its evidence and
the LDevID; duplicate and missing disk serials are refused.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cryptography import x509
from twisted.internet.threads import deferToThread

from fleetd.agent.client import Refusal
from tests.fleetctlsupport import fleetctlAgainst
from tests.swtpmsupport import Node, TPMKeyDaemonCase, ekDigestOf, issueWith

BIG = 240_057_409_536


def disk(name: str, serial: str | None, size: int = BIG) -> dict[str, Any]:
    return {"name": name, "serial": serial, "wwn": None, "size": size,
            "removable": False}  # fmt: skip


class SporeDaemonCase(TPMKeyDaemonCase):
    """Helpers over the daemon + swtpm + abrmd fixtures."""

    async def fleetctlRaw(self, *words: str) -> tuple[int, str, str]:
        code, out, err = await fleetctlAgainst(self.config, *words)
        return code, str(out), str(err)

    async def journal(self, event: str) -> list[Any]:
        entries = await self.service.journal.query(limit=10000)
        return [e for e in entries if e.event == event]

    def legacy(self, name: str, serial: str, ca: str) -> Path:
        """A node holding a software LDevID from a legacy CA (capsule, forge)."""
        cert, key = issueWith(
            getattr(self.pki, f"{ca}_ca"), getattr(self.pki, f"{ca}_ca_key"),
            name, serial,
        )  # fmt: skip
        state = Path(self.mktemp()).resolve()
        state.mkdir()
        (state / "ldevid.pem").write_bytes(cert)
        (state / "ldevid.key").write_bytes(key)
        return state

    async def refused(self, reason: str, command: str, *extra: str,
                      state: Path | None = None) -> str:  # fmt: skip
        code, out, err = await self.agent(command, *extra, state=state)
        self.assertEqual((code, out), (1, ""), err)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(f"{reason}: ", err)
        return str(err)

    async def attest(self) -> None:
        code, _, err = await self.agent("attest", "--serial", "SER1", "--ek", "rsa")
        self.assertEqual((code, err), (0, ""))

    async def reportDisks(
        self, *disks: dict[str, Any], state: Path | None = None
    ) -> tuple[int, str, str]:
        report = Path(self.mktemp())
        report.write_text(json.dumps({"disks": list(disks)}))
        result: tuple[int, str, str] = await self.agent(
            "disks", "--from", str(report), state=state
        )
        return result


class WeakEvidenceTests(SporeDaemonCase):
    async def test_weakEvidenceOnly_bindingAndAttestRefused(self) -> None:
        """
        [T1] Real daemon, real agent, real swtpm: with no evidence
        (evidence-missing), then with reported-serial, pending-claim and
        console evidence naming the TPM's own EK, `binding approve` refuses
        (evidence-insufficient, names what is missing) and `fleetd-agent
        attest` is refused (ek-binding-not-approved, journaled); no LDevID
        anywhere.
        """
        await self._start(approve=False)
        digest = ekDigestOf(self.swtpm.ekCertificates()["ek-rsa2048.crt"])
        # No evidence at all: approval refused, attestation refused.
        code, _, err = await self.fleetctlRaw("binding", "approve", "SER1")
        self.assertEqual(code, 1)
        self.assertIn("evidence-missing:", err)
        self.assertIn("receiving-scan or supplier-record", err)
        await self.refused("ek-binding-not-approved", "attest",
                           "--serial", "SER1", "--ek", "rsa")  # fmt: skip
        for kind in ("reported-serial", "pending-claim", "console"):
            await self.fleetctl("evidence", "add", "--serial", "SER1",
                                "--ek-sha256", digest, "--kind", kind)  # fmt: skip
            code, _, err = await self.fleetctlRaw("binding", "approve", "SER1")
            self.assertEqual(code, 1, kind)
            self.assertEqual(err.count("\n"), 1, err)
            self.assertIn("evidence-insufficient:", err)
            self.assertIn("receiving-scan", err)
            await self.refused("ek-binding-not-approved", "attest",
                               "--serial", "SER1", "--ek", "rsa")  # fmt: skip
        # Refusals naming no device pass the journal throttle (one per
        # reason per 10 s, the rest counted): at least the first is there.
        refusals = await self.journal("attest.refused")
        self.assertEqual(
            {e.fields["reason"] for e in refusals}, {"ek-binding-not-approved"}
        )
        self.assertEqual(await self.journal("binding.approved"), [])
        self.assertEqual(await self.journal("ldevid.issued"), [])
        self.assertFalse((self.state / "ldevid.pem").exists())
        out = await self.fleetctl("status", "w1")
        self.assertIn("binding:  none approved", out)
        self.assertEqual(out.count("(cannot approve)"), 3, out)


class ClonedTPMTests(SporeDaemonCase):
    async def test_clonedTPM_otherSerial_refused(self) -> None:
        """
        [T3] [T1] Real daemon, real agent: a copy of w1's swtpm state (its
        approved EK) in a machine reporting w2's serial is refused
        (serial-mismatch, journaled); nothing is issued to w2.
        """
        await self._start()
        await self.fleetctl("device", "add", "w2", "--serial", "SER2", "--uuid",
                            "4c4c4544-0042-3510-8050-b4c04f4d3233",
                            "--class", "worker")  # fmt: skip
        twin = self.swtpm.clone(Path(self.mktemp()).resolve())
        twin.start()
        self.addCleanup(twin.stop)
        code, out, err = await self.agent(
            "attest", "--serial", "SER2", "--ek", "rsa", tcti=twin.tcti
        )
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("refused: serial-mismatch: ", err)
        (refused,) = await self.journal("attest.refused")
        self.assertEqual(refused.fields["reason"], "serial-mismatch")
        self.assertEqual(refused.fields["reported_serial"], "SER2")
        self.assertEqual(await self.journal("ldevid.issued"), [])
        self.assertFalse((self.state / "ldevid.pem").exists())
        code, out, err = await self.fleetctlRaw("--json", "status", "w2")
        self.assertIsNone(json.loads(out)["ldevid"])


class BentProofTests(SporeDaemonCase):
    def bent(self, node: Node) -> list[tuple[str, int]]:
        """Three bent proofs, then a good one replayed: (reason, status) each."""
        answers = []

        def refusal(proof: dict[str, Any]) -> None:
            try:
                node.post("/v1/attest/proof", proof)
            except Refusal as e:
                answers.append((e.reason, e.status))
            else:
                answers.append(("issued", 200))

        keys, challenge = node.begin("SER1")
        refusal(node.proof(keys, challenge, nonce=b"\x00\xff\x55\xaa"))
        keys, challenge = node.begin("SER1")
        proof = node.proof(keys, challenge)
        info = bytearray(base64.b64decode(proof["certify_info"]))
        info[-1] ^= 1
        proof["certify_info"] = base64.b64encode(bytes(info)).decode()
        refusal(proof)
        keys, challenge = node.begin("SER1")
        proof = node.proof(keys, challenge)
        refusal(proof)
        refusal(proof)
        return answers

    async def test_wrongNonce_tamperedCertify_replay_refused(self) -> None:
        """
        [T3] Real daemon, real swtpm (the agent's TPM steps, the proof bent
        on purpose): a certify over another nonce and a certify with one
        flipped byte are certify-invalid; a good proof is issued once and
        its replay is challenge-used (410); each kind of refusal journaled
        (a second of one kind within 10 s is counted, not journaled [J1]).
        """
        await self._start()
        case: Any = SimpleNamespace(
            url=self.url, pki=self.pki, swtpm=SimpleNamespace(tcti=self.rm.tcti)
        )
        answers = await deferToThread(self.bent, Node(case))
        self.assertEqual(
            answers,
            [("certify-invalid", 403), ("certify-invalid", 403), ("issued", 200),
             ("challenge-used", 410)],
        )  # fmt: skip
        # Journaled once per device and reason within 10 s [J1].
        refused = await self.journal("attest.refused")
        self.assertEqual(
            [(e.device, e.fields["reason"]) for e in refused],
            [("w1", "certify-invalid"), ("w1", "challenge-used")],
        )  # fmt: skip
        self.assertEqual(len(await self.journal("ldevid.issued")), 1)


class LegacyCutOverTests(SporeDaemonCase):
    async def test_legacyAcceptedUntilAttested_thenRefused_statusShowsIt(
        self,
    ) -> None:
        """
        [T4] Real daemon, real agent, real swtpm: capsule- and forge-issued
        LDevIDs serve lookups and are never renewed (attest-required); once
        the node attests through spore with its TPM both are refused
        (ldevid-not-current-issuer) and the new TPM-held one is accepted;
        `fleetctl status` shows the binding, the evidence behind it and the
        LDevID (issuer, notAfter, not legacy).
        """
        await self._start()
        capsule = self.legacy("w1", "SER1", "capsule")
        forge = self.legacy("w1", "SER1", "forge")
        for state in (capsule, forge):
            code, out, err = await self.agent("plan", state=state)
            self.assertEqual((code, err), (0, ""))
            self.assertEqual(json.loads(out)["device"], "w1")
        code, out, _ = await self.fleetctlRaw("--json", "status", "w1")
        self.assertIsNone(json.loads(out)["ldevid"])
        text = await self.fleetctl("status", "w1")
        self.assertIn(
            "ldevid:   none from this fleetd (an LDevID from an older CA of the"
            " trust bundle is accepted until the node attests here)",
            text,
        )
        # A legacy software key is never renewed into a spore LDevID.
        err = await self.refused("attest-required", "renew", state=capsule)
        self.assertIn("fleetd-agent attest", err)
        self.assertEqual(await self.journal("ldevid.issued"), [])

        await self.attest()
        for state in (capsule, forge):
            await self.refused("ldevid-not-current-issuer", "plan", state=state)
        code, out, err = await self.agent("plan")
        self.assertEqual((code, err), (0, ""))
        (issued,) = await self.journal("ldevid.issued")
        self.assertEqual(issued.fields["how"], "attest")

        cert = x509.load_pem_x509_certificate((self.state / "ldevid.pem").read_bytes())
        code, out, err = await self.fleetctlRaw("--json", "status", "w1")
        self.assertEqual(code, 0, err)
        doc = json.loads(out)
        ldevid = doc["ldevid"]
        self.assertEqual(ldevid["issuer"], cert.issuer.rfc4514_string())
        self.assertEqual(ldevid["not_after"], cert.not_valid_after_utc.timestamp())
        self.assertFalse(ldevid["legacy"])
        binding = doc["trust"]["binding"]
        digest = ekDigestOf(self.swtpm.ekCertificates()["ek-rsa2048.crt"])
        self.assertEqual((binding["state"], binding["ek_sha256"]), ("approved", digest))
        (evidence,) = doc["trust"]["evidence"]
        self.assertEqual(
            (evidence["kind"], evidence["ref"]), ("receiving-scan", "scan-1")
        )
        text = await self.fleetctl("status", "w1")
        self.assertIn(f"ldevid:   {cert.issuer.rfc4514_string()}  until ", text)
        self.assertIn(f"binding:  approved: EK {digest}", text)
        self.assertIn("receiving-scan", text)


class DiskSerialTests(SporeDaemonCase):
    def write(self, *disks: dict[str, Any]) -> Path:
        report = Path(self.mktemp())
        report.write_text(json.dumps({"disks": list(disks)}))
        return report

    async def test_duplicateAndMissingSerials_refused(self) -> None:
        """
        [D1] Real daemon, real agent presenting its TPM-held LDevID (swtpm
        behind tpm2-abrmd): `fleetd-agent disks` is refused for a fixed
        disk without a serial, a serial twice in the machine and a serial
        another node reported first (each journaled, one line naming no
        other device, exit 1; the journal names it); the plan
        of a ready run then stops on that reason; a clean report names the
        target by serial.
        """
        await self._start()
        await self.fleetctl("device", "add", "w2", "--serial", "SER2", "--uuid",
                            "4c4c4544-0042-3510-8050-b4c04f4d3233",
                            "--class", "worker")  # fmt: skip
        await self.attest()
        # Missing serial on a fixed disk.
        await self.refused("disk-serial-missing", "disks",
                           "--from", str(self.write(disk("sda", None))))  # fmt: skip
        # The same serial twice in one machine.
        twice = self.write(disk("sda", "S-A"), disk("sdb", "S-A"))
        await self.refused("duplicate-disk-serial", "disks", "--from", str(twice))
        # Another node (a legacy LDevID) already reported S-B.
        other = self.legacy("w2", "SER2", "capsule")
        code, _, err = await self.reportDisks(disk("sda", "S-B"), state=other)
        self.assertEqual((code, err), (0, ""))
        err = await self.refused("duplicate-disk-serial", "disks", "--from",
                                 str(self.write(disk("nvme0n1", "S-B"))))  # fmt: skip
        self.assertNotIn("w2", err)  # the node's line names no other device
        refused = await self.journal("disks.refused")
        self.assertEqual(
            [(e.device, e.fields["reason"]) for e in refused],
            [("w1", "disk-serial-missing"), ("w1", "duplicate-disk-serial"),
             ("w1", "duplicate-disk-serial")],
        )  # fmt: skip
        self.assertEqual(refused[-1].fields["first_reported_by"], "w2")
        # A ready run: the plan withholds the code, the agent stops the workflow.
        await self.fleetctl("provision", "w1")
        err = await self.refused("duplicate-disk-serial", "plan")
        self.assertIn("S-B", err)
        # A clean report names the target; the plan then carries the code.
        code, out, err = await self.reportDisks(disk("nvme0n1", "S-C"))
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out)["target"]["serial"], "S-C")
        code, out, err = await self.agent("plan")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out)["target_disk_serial"], "S-C")
