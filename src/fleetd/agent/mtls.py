"""
mTLS with the TPM-resident LDevID key, through OpenSSL's tpm2 provider.

Python's C{ssl} signs the handshake with a provider key when the key file
(the TSS2 PEM the agent stores) goes through OpenSSL's decoders with the
tpm2 provider loaded in the default library context: that needs an
C{OPENSSL_CONF} read when the process first touches OpenSSL, so each
request runs in a short child process (C{python -m fleetd.agent.mtls})
with its own configuration, its TCTI (C{TPM2OPENSSL_TCTI}) and the request
on stdin; it answers one JSON object on stdout.

The configuration activates C{tpm2} before C{default}: OpenSSL 3.0 picks
a signature by name, first provider first, and tpm2-openssl 1.1.1 lets a
TPM key's public half be exported, so with C{default} first the handshake
would be signed with a public-only copy. The provider's digests and
ciphers are excluded (slow, and each transcript copy is a TPM context).
The server's signatures are then verified by the TPM as well, which needs
more than the three object slots a TPM without a resource manager (swtpm,
C{/dev/tpm0}) offers (rc 0x902): such a TCTI is refused up front with
C{tpm-tls-unsupported} (docs/decisions.md).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from fleetd.agent.client import TIMEOUT, Send, Unreachable, openURL

UNSUPPORTED = "tpm-tls-unsupported"

# tpm2 first: OpenSSL 3.0 fetches the signature by name, and the first
# provider wins a tie; digests and ciphers stay in the default provider.
OPENSSL_CONF = """\
openssl_conf = openssl_init
[openssl_init]
providers = provider_sect
alg_section = algorithm_sect
[provider_sect]
tpm2 = tpm2_sect
default = default_sect
[tpm2_sect]
activate = 1
[default_sect]
activate = 1
[algorithm_sect]
default_properties = tpm2.digest=no,tpm2.cipher=no
"""


class TPMTLSError(Exception):
    """The TPM key cannot make this TLS connection; one line."""


def resourceManaged(tcti: str) -> bool:
    """
    Whether C{tcti} reaches the TPM through a resource manager: the
    kernel's (C{device:/dev/tpmrmN}) or tpm2-abrmd (C{tabrmd}).
    """
    name, _, conf = tcti.partition(":")
    if name == "tabrmd":
        return True
    if name == "device":
        return os.path.basename(conf or "/dev/tpm0").startswith("tpmrm")
    return False


def tpmSender(
    tcti: str, ca: str | None, cert: Path, key: Path, source: str | None = None
) -> Send:
    """
    A L{Send} presenting C{cert} with the TPM key in C{key} (TSS2 PEM),
    connecting from C{source} if given (the child binds it).

    @raise TPMTLSError: C{tcti} has no resource manager.
    """
    if not resourceManaged(tcti):
        raise TPMTLSError(
            f"{UNSUPPORTED}: {tcti} has no resource manager; OpenSSL's tpm2"
            " provider needs more than the TPM's object slots for a handshake"
            " (use device:/dev/tpmrm0 or tabrmd)"
        )

    def send(method: str, url: str, data: bytes | None) -> tuple[int, bytes]:
        request = {
            "method": method,
            "url": url,
            "ca": ca,
            "cert": str(cert),
            "key": str(key),
            "source": source,
            "body": None if data is None else base64.b64encode(data).decode(),
        }
        with tempfile.TemporaryDirectory(prefix="fleetd-agent-") as directory:
            conf = Path(directory, "openssl.cnf")
            conf.write_text(OPENSSL_CONF)
            env = dict(os.environ, OPENSSL_CONF=str(conf), TPM2OPENSSL_TCTI=tcti)
            env.setdefault("TSS2_LOG", "all+none")
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "fleetd.agent.mtls"],
                    input=json.dumps(request).encode(),
                    capture_output=True,
                    env=env,
                    timeout=TIMEOUT + 15,
                    check=False,
                )
            except subprocess.TimeoutExpired as e:
                raise Unreachable(f"{url}: no answer in {TIMEOUT:.0f} s") from e
        return _answer(url, done.stdout, done.stderr)

    return send


def _answer(url: str, stdout: bytes, stderr: bytes) -> tuple[int, bytes]:
    try:
        answer = json.loads(stdout)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except ValueError:
        lines = stderr.decode("utf-8", "replace").strip().splitlines()
        why = lines[-1] if lines else "no answer"
        raise TPMTLSError(f"{UNSUPPORTED}: the TLS helper failed: {why}") from None
    if "error" in answer:
        if answer["error"] == UNSUPPORTED:
            raise TPMTLSError(f"{UNSUPPORTED}: {answer['line']}")
        raise Unreachable(f"{url}: {answer['line']}")
    return int(answer["status"]), base64.b64decode(answer["body"])


def _exchange(request: dict[str, Any]) -> dict[str, Any]:
    """One request over TLS with the provider key (in the child)."""
    context = ssl.create_default_context(cafile=request["ca"])
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(request["cert"], request["key"])
    except (ssl.SSLError, OSError) as e:
        return {
            "error": UNSUPPORTED,
            "line": f"OpenSSL cannot load the TPM key {request['key']} through"
            f" its tpm2 provider ({e})",
        }
    body = request["body"]
    data = None if body is None else base64.b64decode(body)
    call = urllib.request.Request(request["url"], data=data, method=request["method"])  # noqa: S310
    if data is not None:
        call.add_header("content-type", "application/json")
    try:
        with openURL(call, context, request.get("source")) as r:
            status, answer = r.status, r.read(1 << 20)
    except urllib.error.HTTPError as e:
        status, answer = e.code, e.read(1024)
    except (urllib.error.URLError, ssl.SSLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if "EVP lib" in str(reason):  # the TPM could not sign the handshake
            return {"error": UNSUPPORTED, "line": f"the TPM did not sign: {reason}"}
        return {"error": "unreachable", "line": str(reason)}
    return {"status": status, "body": base64.b64encode(answer).decode()}


def main(stdin: IO[bytes] | None = None, stdout: IO[str] | None = None) -> int:
    source = sys.stdin.buffer if stdin is None else stdin
    sink = sys.stdout if stdout is None else stdout
    sink.write(json.dumps(_exchange(json.loads(source.read()))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
