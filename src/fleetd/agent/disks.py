"""
C{fleetd-agent disks}: report this node's disks to fleetd [D1].

The disks come from sysfs (C{--sysfs-root}, default C{/sys}) or from
C{--from FILE}, the same JSON the agent would send
(L{fleetd.trust.disk_report}). From sysfs, every whole disk under
C{block/} that has a C{device} link (so not loop, ram, zram, dm or md
devices) and is not an optical drive is reported, with:

  - serial: L{fleetd.agent.sysfs.serialOf};
  - WWN: C{wwid}, else C{device/wwid};
  - size: C{size} (512-byte sectors) in bytes; C{removable}: the flag.

The report presents the node's LDevID over mTLS, as C{plan} does (a TPM
key through OpenSSL's tpm2 provider). Exit 0 with the target disk fleetd
chose; otherwise one line on stderr
naming the reason code (C{duplicate-disk-serial}, C{disk-serial-missing},
C{no-target-disk}, ...) and exit 1; 2 when the local input is bad.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fleetd.agent.sysfs import serialOf, text
from fleetd.clitools import writeJSON
from fleetd.trust.disk_report import (
    Disk,
    DiskReportError,
    disk,
    parseDiskReport,
    reportJSON,
)

PATH = "/v1/node/disks"
REFUSED = 1
BAD_INPUT = 2
_SKIPPED = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")

# Send a JSON body to a path on the device listener: (status, body).
Post = Callable[[str, bytes], tuple[int, bytes]]


class AgentError(Exception):
    def __init__(self, line: str, status: int = REFUSED) -> None:
        super().__init__(line)
        self.status = status


def readSysfs(root: Path) -> list[Disk]:
    """The whole disks under C{root}/block, as fleetd wants them reported."""
    block = root / "block"
    try:
        names = sorted(entry.name for entry in block.iterdir())
    except OSError as e:
        raise AgentError(f"cannot read {block}: {e.strerror}", BAD_INPUT) from e
    disks: list[Disk] = []
    for name in names:
        base = block / name
        if name.startswith(_SKIPPED) or not (base / "device").exists():
            continue
        sectors = text(base / "size")
        entry = {
            "name": name,
            "serial": serialOf(base),
            "wwn": text(base / "wwid") or text(base / "device" / "wwid"),
            "size": int(sectors) * 512 if sectors and sectors.isdigit() else 0,
            "removable": text(base / "removable") == "1",
        }
        try:
            found = disk(entry, len(disks))
        except DiskReportError as e:
            raise AgentError(f"{name}: {e}", BAD_INPUT) from e
        if found.size:  # an empty card reader or drive has nothing to install on
            disks.append(found)
    return disks


def httpsPost(
    server: str,
    ca: str | None,
    context: ssl.SSLContext | None = None,
    source: str | None = None,
) -> Post:
    """
    A L{Post} to C{server} (C{https://HOST:PORT}) verifying it against
    C{ca}, from the local address C{source} if given (C{--source});
    C{context} may carry the node's LDevID client certificate.
    """
    url = urllib.parse.urlsplit(server)
    if url.scheme != "https" or not url.hostname:
        raise AgentError(
            f"--server must be https://HOST:PORT, not {server!r}", BAD_INPUT
        )
    if context is None:
        context = ssl.create_default_context(cafile=ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2

    def post(path: str, body: bytes) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection(
            url.hostname or "",
            url.port or 8444,
            context=context,
            timeout=30,
            source_address=None if source is None else (source, 0),
        )
        try:
            conn.request(
                "POST", path, body=body, headers={"content-type": "application/json"}
            )
            response = conn.getresponse()
            return response.status, response.read(1 << 20)
        except (OSError, http.client.HTTPException) as e:
            raise AgentError(f"cannot reach fleetd at {server}: {e}") from e
        finally:
            conn.close()

    return post


def nodePost(args: argparse.Namespace) -> Post:
    """
    A L{Post} presenting the node's LDevID [T4] as C{plan} and C{renew}
    do (L{fleetd.agent.attest.ldevidTransport}); a TPM or TLS failure is
    one L{AgentError} line.
    """
    from fleetd.agent.attest import ldevidTransport
    from fleetd.agent.client import Unreachable
    from fleetd.agent.mtls import TPMTLSError
    from fleetd.agent.tpm import TPMError

    try:
        via = ldevidTransport(args)
    except TPMTLSError as e:
        raise AgentError(str(e)) from e
    except TPMError as e:
        raise AgentError(f"tpm-error: {e}") from e
    if isinstance(via, ssl.SSLContext):
        return httpsPost(args.server, args.ca, via, args.source_address)
    url = urllib.parse.urlsplit(args.server)
    if url.scheme != "https" or not url.hostname:
        raise AgentError(
            f"--server must be https://HOST:PORT, not {args.server!r}", BAD_INPUT
        )
    send = via
    base = args.server.rstrip("/")

    def post(path: str, body: bytes) -> tuple[int, bytes]:
        try:
            return send("POST", base + path, body)
        except Unreachable as e:
            raise AgentError(f"cannot reach fleetd at {args.server}: {e}") from e
        except TPMTLSError as e:
            raise AgentError(str(e)) from e

    return post


def addArguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", help="disk report JSON to send")
    parser.add_argument(
        "--sysfs-root", default="/sys", help="where sysfs is mounted (tests)"
    )


def collect(args: argparse.Namespace) -> list[Disk]:
    if args.source is None:
        return readSysfs(Path(args.sysfs_root))
    try:
        raw = Path(args.source).read_bytes()
    except OSError as e:
        raise AgentError(f"cannot read {args.source}: {e.strerror}", BAD_INPUT) from e
    try:
        return parseDiskReport(raw)
    except DiskReportError as e:
        raise AgentError(f"{args.source}: {e}", BAD_INPUT) from e


def report(disks: list[Disk], post: Post) -> dict[str, Any]:
    """Send the report; return fleetd's verdict or raise its one line."""
    body = json.dumps(reportJSON(disks)).encode("utf-8")
    status, answer = post(PATH, body)
    if status != 200:
        lines = answer.decode("utf-8", "replace").strip().splitlines()
        raise AgentError(f"fleetd refused ({status}): {lines[0] if lines else ''}")
    try:
        verdict: dict[str, Any] = json.loads(answer)
    except ValueError as e:
        raise AgentError("fleetd answered something that is not JSON") from e
    return verdict


def run(
    args: argparse.Namespace,
    post: Post | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    """The C{disks} command; C{post} defaults to HTTPS to C{--server}."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        disks = collect(args)
        verdict = report(disks, post or nodePost(args))
    except AgentError as e:
        err.write(f"fleetd-agent: disks: {e}\n")
        return e.status
    if args.json:
        writeJSON(out, verdict, sortKeys=True)
    else:
        target = verdict["target"]
        out.write(
            f"target disk serial {target['serial']} ({target['name']},"
            f" {target['size']} bytes)\n"
        )
    return 0
