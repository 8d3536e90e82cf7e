"""
C{fleetd-agent attest}, C{plan} and C{renew} against the device listener.

C{attest}: EK -> AK -> LDevID [T3].

Reads the EK certificate from NV, creates the AK and the LDevID key under
the SRK, sends the claim, activates the credential, certifies the LDevID
key with the AK over the server's nonce, sends the proof with a CSR signed
inside the TPM, and stores the issued LDevID (certificate, chain and the
TSS2 key file) under C{--state}. A TPM 1.2 still asks fleetd, so that the
refusal is journaled [T2].

C{plan} and C{renew} (and C{disks}) present the node's LDevID over mTLS
[T4], a TPM key through L{fleetd.agent.mtls}: the install
plan (target disk serial, image, META 0x0b code), and a new LDevID from the
one issuer for the key the node already holds (a TPM key is asked to sign
the CSR; a legacy node's software key in C{ldevid.key} signs it itself).
"""

from __future__ import annotations

import argparse
import base64
import os
import ssl
import urllib.parse
from pathlib import Path
from typing import IO, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from tpm2_pytss import TSS2_Exception

from fleetd.agent import meta, smbios, target, tpm
from fleetd.agent.client import Refusal, Send, Unreachable, call, tlsContext
from fleetd.agent.mtls import TPMTLSError, tpmSender
from fleetd.clitools import writeJSON

CERT, CHAIN, KEY = "ldevid.pem", "ldevid-chain.pem", "ldevid.tss2.pem"
# A software LDevID key (the legacy capsule/forge issuers' nodes).
SOFT_KEY = "ldevid.key"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def writePrivate(path: Path, data: bytes) -> None:
    """Write C{data} (mode 0600) atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def attest(args: argparse.Namespace, out: IO[str]) -> dict[str, Any]:
    serial = args.serial or smbios.serial()
    uuid = args.uuid or smbios.uuid()
    if not serial:
        raise tpm.TPMError("no chassis serial (sysfs or --serial)")
    context = tlsContext(args.ca)
    try:
        ectx = tpm.openTPM(args.tcti)
    except tpm.TPM12:
        call(args.server, "/v1/attest/challenge", context,
             {"tpm_version": "1.2", "serial": serial, "uuid": uuid},
             source=args.source_address)  # fmt: skip
        raise tpm.TPMError("fleetd accepted a TPM 1.2 claim") from None
    try:
        keys = tpm.createKeys(ectx, args.ek)
        challenge = call(
            args.server,
            "/v1/attest/challenge",
            context,
            {
                "tpm_version": "2.0",
                "serial": serial,
                "uuid": uuid,
                "ek_cert": _b64(keys.ekCert),
                "ek_public": _b64(keys.ekPublic.marshal()),
                "ak_public": _b64(keys.akPublic.marshal()),
            },
            source=args.source_address,
        )
        secret = tpm.activate(
            ectx,
            keys,
            base64.b64decode(challenge["credential_blob"]),
            base64.b64decode(challenge["encrypted_secret"]),
        )
        info, signature, csr = tpm.certifyAndCSR(
            ectx, keys, base64.b64decode(challenge["nonce"]), serial
        )
    finally:
        ectx.close()
    issued = call(
        args.server,
        "/v1/attest/proof",
        context,
        {
            "challenge": challenge["challenge"],
            "secret": _b64(secret),
            "ldevid_public": _b64(keys.ldevidPublic.marshal()),
            "certify_info": _b64(info),
            "certify_signature": _b64(signature),
            "csr": csr.decode("ascii"),
        },
        source=args.source_address,
    )
    state = Path(args.state)
    writePrivate(state / KEY, tpm.tss2PEM(keys.ldevidPublic, keys.ldevidPrivate))
    writePrivate(state / CHAIN, issued["chain"].encode("ascii"))
    writePrivate(state / CERT, issued["certificate"].encode("ascii"))
    return {"ldevid": str(state / CERT), "ek": keys.ekType}


def ldevidTransport(args: argparse.Namespace) -> ssl.SSLContext | Send:
    """
    How to present the node's current LDevID [T4]: a TLS context for a
    software key, or the TPM key's transport (L{fleetd.agent.mtls}).
    """
    state = Path(args.state)
    cert = state / CERT
    if not cert.is_file():
        raise tpm.TPMError(f"no LDevID in {state}: run attest first")
    soft = state / SOFT_KEY
    if soft.is_file():
        return tlsContext(args.ca, cert, soft)
    return tpmTLS(args, cert, state / KEY)


def tpmTLS(args: argparse.Namespace, cert: Path, key: Path) -> Send:
    """
    TLS with the TPM-resident LDevID key, through OpenSSL's tpm2 provider
    in a child process; every transient object of the agent's own is
    flushed before (its ESAPI context is closed by then).

    @raise TPMTLSError: C{tpm-tls-unsupported}, e.g. no resource manager.
    """
    if not key.is_file():
        raise tpm.TPMError(f"no LDevID key in {key.parent}: run attest first")
    return tpmSender(args.tcti, args.ca, cert, key, args.source_address)


def plan(args: argparse.Namespace, out: IO[str], err: IO[str]) -> dict[str, Any]:
    """
    The install plan; with C{--target-link PATH}, PATH made a link to its
    target disk (L{target.linkTarget}); with C{--write-meta DEV}, its code
    then written as META 0x0b on DEV (L{meta.writePlanCode}).
    """
    path = "/v1/node/plan"
    if args.device:
        path += "?device=" + urllib.parse.quote(args.device, safe="")
    via = ldevidTransport(args)
    result = installable(call(args.server, path, via, source=args.source_address))
    if args.target_link is not None:
        device = target.linkTarget(
            result, Path(args.target_link), Path(args.sysfs_root)
        )
        result = {**result, "target_device": device}
    if args.write_meta is not None:

        def warn(line: str) -> None:
            err.write(line + "\n")

        written = meta.writePlanCode(args, result, warn)
        for note in written.notes:
            err.write(f"fleetd-agent: plan: {note}\n")
        result = {**result, "meta_written": written.disk}
    return result


def installable(plan: dict[str, Any]) -> dict[str, Any]:
    """
    The plan, unless fleetd withheld the META code for a ready run because
    the disk check has not passed [D1]: then the install cannot go on, and
    the workflow stops on the disk check's line (its reason code first).
    """
    withheld = plan.get("meta_0x0b_withheld")
    if withheld:
        raise Refusal(409, str(withheld))
    return plan


class NoLDevID(Exception):
    """C{renew} found no key of a previous C{attest} under C{--state}."""


def renew(args: argparse.Namespace, out: IO[str]) -> dict[str, Any]:
    """A new LDevID from the one issuer, for the key the node holds."""
    state = Path(args.state)
    soft = state / SOFT_KEY
    if soft.is_file():
        key = serialization.load_pem_private_key(soft.read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise tpm.TPMError(f"{soft}: not an ECDSA or RSA key")
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "renewal")])
        builder = x509.CertificateSigningRequestBuilder().subject_name(name)
        csr = builder.sign(key, hashes.SHA256()).public_bytes(
            serialization.Encoding.PEM
        )
    elif not (state / KEY).is_file():
        raise NoLDevID(
            f"no LDevID key in {state} (neither {KEY} nor {SOFT_KEY});"
            " run `fleetd-agent attest` first"
        )
    else:
        public, private = tpm.readTSS2PEM((state / KEY).read_bytes())
        ectx = tpm.openTPM(args.tcti)
        try:
            csr = tpm.csrFor(ectx, private, public, "renewal")
        finally:
            ectx.close()
    issued = call(
        args.server,
        "/v1/ldevid/renew",
        ldevidTransport(args),
        {"csr": csr.decode()},
        source=args.source_address,
    )
    writePrivate(state / CHAIN, issued["chain"].encode("ascii"))
    writePrivate(state / CERT, issued["certificate"].encode("ascii"))
    return {"ldevid": str(state / CERT)}


COMMANDS = {"attest": attest, "renew": renew}


def _describe(command: str, result: dict[str, Any]) -> str:
    if command != "plan":
        return f"LDevID stored in {result['ldevid']}\n"
    lines = [
        f"target disk serial: {result.get('target_disk_serial') or '-'}",
        f"image: {result.get('image') or '-'}",
        f"META 0x0b code: {result.get('meta_0x0b') or '- (no ready run)'}",
    ]
    if "target_device" in result:
        lines.append(f"target disk device: {result['target_device']}")
    if "meta_written" in result:
        written = result["meta_written"]
        lines.append(f"META 0x0b written on {written} (both copies, read back)")
    return "".join(line + "\n" for line in lines)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Run one command; 0, or 1 with one line naming the reason code."""
    try:
        if args.command == "plan":
            result = plan(args, out, err)
        else:
            result = COMMANDS[args.command](args, out)
    except Refusal as e:
        err.write(f"fleetd-agent: {args.command}: refused: {e.line}\n")
        return 1
    except Unreachable as e:
        err.write(f"fleetd-agent: {args.command}: unreachable: {e}\n")
        return 1
    except (TPMTLSError, NoLDevID, meta.MetaError, target.TargetError) as e:
        err.write(f"fleetd-agent: {args.command}: {e}\n")
        return 1
    except tpm.TPMError as e:
        err.write(f"fleetd-agent: {args.command}: tpm-error: {e}\n")
        return 1
    except TSS2_Exception as e:
        err.write(f"fleetd-agent: {args.command}: tpm-error: {e}\n")
        return 1
    if args.json:
        writeJSON(out, result, sortKeys=True)
    else:
        out.write(_describe(args.command, result))
    return 0
