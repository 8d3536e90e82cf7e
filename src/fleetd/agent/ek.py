"""
C{fleetd-agent ek}: a receiving scan's reading of one machine [T1].

Prints the machine's chassis serial and uuid (SMBIOS, as C{attest} reads
them) and, for its RSA and its ECC endorsement key, the EK digest in the
form C{fleetctl evidence add --ek-sha256} takes, each as a ready
C{fleetctl evidence add ... --kind receiving-scan} line for a person to
check and carry over. It talks to no server: a digest a machine reports
about itself proves nothing until someone compares it with something the
machine does not control (the label on the chassis, the EK certificate's
issuer, the supplier's papers).

The digest is computed as fleetd computes it at attestation: SHA-256 of
the DER SubjectPublicKeyInfo of the EK public area the TPM derives from
the EK template, after checking that the EK certificate holds the same
key (fleetd refuses an EK whose certificate disagrees). Only one EK per
machine may be carried over: fleetd treats one serial claimed for two EK
digests as conflicting evidence. The line to carry is the EK C{attest}
presents (with C{--ek auto}, its default, the RSA EK when the TPM has an
RSA EK certificate, else the ECC one); the other EK's line is printed
commented out.
"""

from __future__ import annotations

import argparse
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_der_public_key,
)

from fleetd.agent import smbios
from fleetd.clitools import addJSONOption, writeJSON
from fleetd.trust.model import EvidenceKind, ekDigest

KIND = EvidenceKind.RECEIVING_SCAN.value
FAMILIES = ("rsa", "ecc")
NAMES = {"rsa": "RSA", "ecc": "ECC"}
# Stands in for the serial when SMBIOS has none: the person writes the
# label's serial there (and attests with --serial).
NO_SERIAL = "CHASSIS-SERIAL"

NOTE = (
    "These digests were read from this machine; they prove nothing until a"
    " person has compared them with independent evidence. Check that the"
    " serial is the one on the chassis label and that the EK certificate's"
    " issuer is the TPM maker you expect, then carry one line (the one not"
    " commented out) to fleetctl. Never both: one serial with two EK digests"
    " is conflicting evidence. Nothing was sent to fleetd."
)


def addArguments(parser: argparse.ArgumentParser) -> None:
    """C{ek [--ek auto|rsa|ecc] [--ref R] [--sysfs-root DIR] [--json]}."""
    parser.add_argument(
        "--ek",
        choices=("auto", "rsa", "ecc"),
        default="auto",
        help="the EK this node will attest with, as attest --ek (default auto)",
    )
    parser.add_argument("--ref", help="the scan's reference, put in the lines")
    parser.add_argument(
        "--sysfs-root", default="/sys", help="where sysfs is mounted (tests)"
    )
    addJSONOption(parser, after=True)


@dataclass(frozen=True)
class Reading:
    """
    One EK family as the TPM shows it.

    @ivar ekType: the TCG template read (C{EK-RSA2048}, C{EK-HIGH-ECC384},
        ...), or L{None} when the TPM holds no certificate of this family.
    @ivar digest: the EK digest, or L{None} when there is no EK or its
        certificate holds another key (C{problem} says which).
    @ivar issuer: the EK certificate's issuer (RFC 4514), when readable.
    """

    family: str
    ekType: str | None
    digest: str | None
    issuer: str | None
    problem: str | None


def digestOf(publicDER: bytes) -> str:
    """
    The EK digest of a public key given as DER SubjectPublicKeyInfo (as
    C{TPM2B_PUBLIC.to_der} gives it), re-encoded canonically first.
    """
    key = load_der_public_key(publicDER)
    return ekDigest(key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo))


def _certificate(der: bytes) -> tuple[str | None, str | None, str | None]:
    """The certificate's issuer and key digest, or why they are unreadable."""
    try:
        cert = x509.load_der_x509_certificate(der)
        spki = cert.public_key().public_bytes(
            Encoding.DER, PublicFormat.SubjectPublicKeyInfo
        )
    except ValueError as e:
        return None, None, f"the EK certificate is unreadable here ({e})"
    return cert.issuer.rfc4514_string(), ekDigest(spki), None


def read(ectx: Any, family: str) -> Reading:
    """Read C{family}'s EK certificate and derive its EK (flushed again)."""
    from tpm2_pytss.constants import ESYS_TR

    from fleetd.agent import tpm

    try:
        ekType, cert, template = tpm.readEK(ectx, family)
    except tpm.TPMError:
        return Reading(family, None, None, None, "no EK certificate in the TPM")
    handle, public = ectx.create_primary(None, template, ESYS_TR.ENDORSEMENT)[:2]
    ectx.flush_context(handle)
    digest = digestOf(public.to_der())
    issuer, certDigest, problem = _certificate(cert)
    if certDigest is not None and certDigest != digest:
        problem = (
            "the EK certificate holds another key than the EK:"
            " fleetd refuses this EK at attestation"
        )
        return Reading(family, ekType, None, issuer, problem)
    return Reading(family, ekType, digest, issuer, problem)


def attested(readings: list[Reading], choice: str) -> str | None:
    """The family C{attest --ek choice} presents (L{tpm.readEK}'s order)."""
    for reading in readings:
        if reading.ekType is not None and choice in ("auto", reading.family):
            return reading.family
    return None


def evidenceLine(serial: str | None, digest: str, ref: str | None) -> str:
    """The C{fleetctl evidence add} line for C{serial} and C{digest}."""
    words = ["fleetctl", "evidence", "add", "--serial", serial or NO_SERIAL]
    words += ["--ek-sha256", digest, "--kind", KIND]
    if ref:
        words += ["--ref", ref]
    return shlex.join(words)


def scan(args: argparse.Namespace) -> dict[str, Any]:
    """Read the machine; the C{--json} document."""
    from fleetd.agent import tpm

    root = Path(args.sysfs_root)
    serial, uuid = smbios.serial(root), smbios.uuid(root)
    ectx = tpm.openTPM(args.tcti)
    try:
        readings = [read(ectx, family) for family in FAMILIES]
    finally:
        ectx.close()
    if all(r.ekType is None for r in readings):
        raise tpm.TPMError("no EK certificate in the TPM's NV indices")
    used = attested(readings, args.ek)
    if used is None:
        raise tpm.TPMError(f"no {NAMES[args.ek]} EK certificate in the TPM")
    eks = []
    for r in readings:
        line = None if r.digest is None else evidenceLine(serial, r.digest, args.ref)
        eks.append(
            {
                "ek": r.family,
                "ek_type": r.ekType,
                "ek_sha256": r.digest,
                "issuer": r.issuer,
                "used_by_attest": r.family == used,
                "fleetctl": line,
                "problem": r.problem,
            }
        )
    return {"serial": serial, "uuid": uuid, "kind": KIND, "eks": eks, "note": NOTE}


def describe(result: dict[str, Any], choice: str) -> str:
    """The lines for a person."""
    serial = result["serial"] or (
        f"- (SMBIOS has none: {NO_SERIAL} stands for the label's serial, which"
        " attest must then be given with --serial)"
    )
    lines = [f"serial: {serial}", f"uuid:   {result['uuid'] or '-'}"]
    for ek in result["eks"]:
        name = NAMES[ek["ek"]]
        if ek["ek_type"] is None:
            lines += ["", f"{name} EK: none ({ek['problem']})"]
            continue
        lines += [
            "",
            f"{name} EK ({ek['ek_type']}), certificate issuer: {ek['issuer']}",
        ]
        if ek["problem"]:
            lines.append(f"  {ek['problem']}")
        if ek["fleetctl"] is None:
            continue
        if ek["used_by_attest"]:
            lines.append(f"  fleetd-agent attest --ek {choice} presents this EK:")
            lines.append(f"  {ek['fleetctl']}")
        else:
            lines.append(f"  only if this node attests with --ek {ek['ek']}:")
            lines.append(f"  # {ek['fleetctl']}")
    lines += ["", *textwrap.wrap(result["note"], 76)]
    return "".join(line + "\n" for line in lines)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """C{fleetd-agent ek}: 0, or 1 with one line."""
    from tpm2_pytss import TSS2_Exception

    from fleetd.agent import tpm

    try:
        result = scan(args)
    except tpm.TPM12:
        err.write(
            "fleetd-agent: ek: this TPM is a TPM 1.2; fleetd attests"
            " TPM 2.0 only (tpm12-unsupported)\n"
        )
        return 1
    except (tpm.TPMError, TSS2_Exception) as e:
        err.write(f"fleetd-agent: ek: tpm-error: {e}\n")
        return 1
    if args.json:
        writeJSON(out, result, sortKeys=True)
    else:
        out.write(describe(result, args.ek))
    return 0
