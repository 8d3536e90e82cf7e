"""
A node's encrypted STATE and EPHEMERAL with fleetd as its KMS
(C{fleetd-sim --disk-encryption}; docs/design.md, "Disk keys"), as
Talos's KMS key handler does it (docs/decisions.md, "Disk keys: the
protocol as Talos speaks it"):

    seal    at install, once its configuration is fetched, for each
            volume: 32 random bytes sealed by fleetd's kms listener
            (C{Seal}); a LUKS2 volume on a file formatted with base64 of
            them (C{cryptsetup}); the sealed blob kept in its header as
            Talos keeps it, a C{sideroKMS} token whose C{sealedData} is
            the blob in base64. The bytes are then forgotten.
    unlock  at a reboot, for each volume: the blob read back from the
            header, C{Unseal} asked, and C{cryptsetup open
            --test-passphrase} with base64 of the answer: the volume opens
            (its bytes came back), or fleetd refused (the reason code that
            starts the gRPC status's message), or the answer opens nothing.

Every call goes from the node's own address, through a relay of its own
(L{fleetd.sim.relay}, as its tink agent's), over TLS to the kms listener,
each step on a new connection. C{UNAVAILABLE} (fleetd starting, busy or
not there) is retried as Talos retries, every 30 s divided by the time
scale, a few times; any other status ends the step.

Blocking parts (grpcio, cryptsetup) run in threads.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from twisted.internet.threads import deferToThread

from fleetd.sim.rack import Rack, StepFailed
from fleetd.sim.relay import Relay, relayedChannel
from fleetd.testing.kmsclient import KMSClient

VOLUMES = ("STATE", "EPHEMERAL")
PASSPHRASE_BYTES = 32  # what Talos seals (kms-client's PassphraseSize)
TOKEN_TYPE = "sideroKMS"  # noqa: S105 (the LUKS2 token type Talos keeps blobs in)
CALL_TIMEOUT = 10.0  # seconds Talos gives each call
RETRY_GAP = 30.0  # seconds between Talos's tries (divided by the time scale)
TRIES = 4  # tries of a call answered UNAVAILABLE before the step ends
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
VOLUME_BYTES = 2 << 20  # a small LUKS2 header and 1 MiB of data space
CRYPTSETUP = shutil.which("cryptsetup") or "/usr/sbin/cryptsetup"
AVAILABLE = os.access(CRYPTSETUP, os.X_OK)
REASON = re.compile(r"^([a-z0-9-]+): ")

# How a node's disk ends (DiskState.state).
NONE, SEALED, UNLOCKED, REFUSED, FAILED = (
    "none", "sealed", "unlocked", "refused", "failed",
)  # fmt: skip


@dataclass(frozen=True)
class DiskState:
    """
    A node's disk as its last step left it: C{state} (L{NONE} until
    sealed), the refusal's C{reason} code and gRPC C{status} name, and
    for L{FAILED} what failed (one line).
    """

    state: str = NONE
    reason: str | None = None
    status: str | None = None
    error: str | None = None

    def asJSON(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "status": self.status}

    def shown(self) -> str:
        """For the table: C{unlocked}, C{refused retired}, ..."""
        return self.state if self.reason is None else f"{self.state} {self.reason}"


class KMSRefused(Exception):
    """fleetd answered a Seal or Unseal with a gRPC status."""

    def __init__(self, status: str, reason: str | None, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.reason = reason


class VolumeFailed(Exception):
    """A volume could not be made or opened (one line)."""


# cryptsetup, on files (no device-mapper)


def _cryptsetup(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [CRYPTSETUP, *argv], input=stdin, capture_output=True, timeout=60, check=False
    )


def passphrase(raw: bytes) -> bytes:
    """What Talos gives cryptsetup: base64 of the bytes it sealed."""
    return base64.b64encode(raw)


def formatVolume(volume: Path, raw: bytes, sealed: bytes) -> None:
    """A LUKS2 volume on the file C{volume} opened by C{raw}'s passphrase,
    its key slot 0's token holding C{sealed} as Talos's does."""
    with open(volume, "wb") as f:
        f.truncate(VOLUME_BYTES)
    formatted = _cryptsetup(
        "luksFormat", "--type", "luks2", "--batch-mode",
        "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
        "--luks2-metadata-size", "16k", "--luks2-keyslots-size", "256k",
        "--key-file", "-", str(volume), stdin=passphrase(raw),
    )  # fmt: skip
    if formatted.returncode != 0:
        raise VolumeFailed(f"{volume.name}: luksFormat: {_last(formatted)}")
    token = {
        "type": TOKEN_TYPE,
        "keyslots": [],
        "UserData": {"sealedData": base64.b64encode(sealed).decode()},
    }
    imported = _cryptsetup(
        "token", "import", "--token-id", "0", "--json-file", "-", "--token-replace",
        str(volume), stdin=json.dumps(token).encode(),
    )  # fmt: skip
    if imported.returncode != 0:
        raise VolumeFailed(f"{volume.name}: token import: {_last(imported)}")


def sealedBlob(volume: Path) -> bytes:
    """The sealed blob the volume's C{sideroKMS} token holds."""
    exported = _cryptsetup("token", "export", "--token-id", "0", str(volume))
    if exported.returncode != 0:
        raise VolumeFailed(f"{volume.name}: token export: {_last(exported)}")
    try:
        token = json.loads(exported.stdout)
        if token["type"] != TOKEN_TYPE:
            raise VolumeFailed(f"{volume.name}: token type {token['type']!r}")
        return base64.b64decode(token["UserData"]["sealedData"], validate=True)
    except (ValueError, KeyError, TypeError) as e:
        raise VolumeFailed(f"{volume.name}: token: {e}") from None


def opens(volume: Path, raw: bytes) -> bool:
    """Whether C{raw}'s passphrase opens the volume."""
    return _cryptsetup(
        "open", "--test-passphrase", "--key-file", "-", str(volume),
        stdin=passphrase(raw),
    ).returncode == 0  # fmt: skip


def _last(done: subprocess.CompletedProcess[bytes]) -> str:
    lines = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


# The calls, as Talos makes them


def refusal(error: grpc.RpcError) -> KMSRefused:
    """The status fleetd answered; its reason, the code its message
    starts with (L{None} when it names none: not fleetd's refusal)."""
    code: grpc.StatusCode = error.code()
    message = str(error.details() or "")
    found = REASON.match(message)
    return KMSRefused(code.name, found.group(1) if found else None, message)


def called(
    method: Callable[[str, bytes], bytes],
    uuid: str,
    data: bytes,
    gap: float,
    sleep: Callable[[float], None],
) -> bytes:
    """C{method(uuid, data)}'s answer; UNAVAILABLE retried C{gap} seconds
    apart, as Talos retries.

    @raise KMSRefused: the last answer's status.
    """
    for attempt in range(TRIES):
        try:
            return method(uuid, data)
        except grpc.RpcError as e:
            if e.code() not in RETRIED or attempt == TRIES - 1:
                raise refusal(e) from None
        sleep(gap)
    raise AssertionError("unreachable")


def sealVolumes(
    client: KMSClient, uuid: str, directory: Path, gap: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:  # fmt: skip
    """Install: each volume's bytes sealed, the volume formatted with them."""
    for name in VOLUMES:
        raw = os.urandom(PASSPHRASE_BYTES)
        sealed = called(client.seal, uuid, raw, gap, sleep)
        formatVolume(directory / f"{name}.luks", raw, sealed)


def unlockVolumes(
    client: KMSClient, uuid: str, directory: Path, gap: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:  # fmt: skip
    """A boot: each volume's blob unsealed, the answer opening it."""
    for name in VOLUMES:
        volume = directory / f"{name}.luks"
        sealed = sealedBlob(volume)
        raw = called(client.unseal, uuid, sealed, gap, sleep)
        if not opens(volume, raw):
            raise VolumeFailed(f"{name}: the unsealed passphrase does not open it")


Blocking = Callable[[KMSClient, str, Path, float], None]


class EncryptedDisk:
    """One node's encrypted volumes; its steps L{seal} and L{unlock}."""

    def __init__(self, rack: Rack, directory: Path, address: str, uuid: str) -> None:
        self.rack = rack
        self.directory = directory
        self.address = address
        self.uuid = uuid
        self.state = DiskState()

    async def seal(self) -> None:
        """At install. A refusal ends the node's path: Talos cannot make
        STATE, so it never gets further."""
        try:
            await self._call(sealVolumes)
        except KMSRefused as e:
            self.state = DiskState(REFUSED, e.reason, e.status)
            raise StepFailed(f"seal: {e}") from None
        except VolumeFailed as e:
            self.state = DiskState(FAILED, error=str(e))
            raise StepFailed(f"seal: {e}") from None
        self.state = DiskState(SEALED)

    async def unlock(self) -> None:
        """At a reboot; its outcome is the disk's state (a refusal does not
        end the path: what follows a reboot is the fault's)."""
        if self.state.state == NONE:
            raise StepFailed("unlock: nothing was sealed")
        try:
            await self._call(unlockVolumes)
        except KMSRefused as e:
            self.state = DiskState(REFUSED, e.reason, e.status)
        except VolumeFailed as e:
            self.state = DiskState(FAILED, error=str(e))
        else:
            self.state = DiskState(UNLOCKED)

    async def _call(self, blocking: Blocking) -> None:
        """C{blocking} in a thread with a client on a new connection from
        the node's address."""
        fleetd = self.rack.fleetd
        if fleetd.kms is None:
            raise StepFailed("disk encryption: fleetd has no kms listener ([kms])")
        relay = Relay(
            self.rack.clock,
            self.directory / "kms.sock",
            lambda: ("127.0.0.1", self.rack.fleetd.kms or 0),
            self.address,
        )
        relay.start()
        channel = relayedChannel(relay, fleetd, [("grpc.use_local_subchannel_pool", 1)])
        client = KMSClient(channel, timeout=CALL_TIMEOUT)
        try:
            await deferToThread(
                blocking, client, self.uuid, self.directory,
                RETRY_GAP / self.rack.timeScale,
            )  # fmt: skip
        finally:
            channel.close()
            await relay.stop()
