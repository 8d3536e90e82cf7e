"""
A node's encrypted STATE and EPHEMERAL with fleetd as its KMS
(C{fleetd-sim --disk-encryption}; docs/design.md, "Disk keys"), as
Talos's KMS key handler does it (docs/decisions.md, "Disk keys: the
protocol as Talos speaks it"), as its delivered configuration says:

    config  C{machine.systemDiskEncryption}'s C{state} and C{ephemeral}
            each name a KMS key, C{https://<enrollment name>:<port>}
            (L{fleetd.sim.diskconfig}); without the section Talos
            encrypts nothing: the disk stays C{none}, its reason
            C{UNENCRYPTED} (with C{--disk-encryption}, not as expected)
    seal    at install, once its configuration is fetched, for each
            volume: 32 random bytes sealed by its endpoint's KMS
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
(L{fleetd.sim.relay}, as its tink agent's), to the volume's endpoint: its
name resolves to fleetd's loopback address (L{FLEETD_ADDRESS}, as the
anchors' DNS answers spore's), its port is the endpoint's, and TLS
verifies the name, each step on a new connection. C{UNAVAILABLE}
(fleetd starting, busy or not there) is retried as Talos retries, every
30 s divided by the time scale, a few times; any other status ends the
step.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from twisted.internet.threads import deferToThread

from fleetd.sim.diskconfig import (
    UNENCRYPTED,
    VOLUMES,
    ConfigProblem,
    Endpoint,
    kmsEndpoints,
)
from fleetd.sim.rack import Rack, StepFailed
from fleetd.sim.relay import Relay, relayedChannel
from fleetd.testing.kmsclient import KMSClient

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
FLEETD_ADDRESS = "127.0.0.1"  # what the enrollment name resolves to, for a node

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
    clients: Mapping[str, KMSClient], uuid: str, directory: Path, gap: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:  # fmt: skip
    """Install: each volume's bytes sealed by its endpoint's client, the
    volume formatted with them."""
    for name in VOLUMES:
        raw = os.urandom(PASSPHRASE_BYTES)
        sealed = called(clients[name].seal, uuid, raw, gap, sleep)
        formatVolume(directory / f"{name}.luks", raw, sealed)


def unlockVolumes(
    clients: Mapping[str, KMSClient], uuid: str, directory: Path, gap: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:  # fmt: skip
    """A boot: each volume's blob unsealed, the answer opening it."""
    for name in VOLUMES:
        volume = directory / f"{name}.luks"
        sealed = sealedBlob(volume)
        raw = called(clients[name].unseal, uuid, sealed, gap, sleep)
        if not opens(volume, raw):
            raise VolumeFailed(f"{name}: the unsealed passphrase does not open it")


Blocking = Callable[[Mapping[str, KMSClient], str, Path, float], None]


class EncryptedDisk:
    """One node's encrypted volumes; its steps L{seal} and L{unlock}."""

    def __init__(self, rack: Rack, directory: Path, address: str, uuid: str) -> None:
        self.rack = rack
        self.directory = directory
        self.address = address
        self.uuid = uuid
        self.state = DiskState()
        # Each volume's KMS endpoint, as its configuration names it
        # (configured), or why there is none.
        self.endpoints: dict[str, Endpoint] = {}
        self.unusable: str | None = "no configuration delivered"

    def configured(self, config: bytes) -> None:
        """What the delivered C{config} says of the disks (read as it
        arrives; the configuration itself is not kept)."""
        try:
            endpoints = kmsEndpoints(config, self.rack.fleetd.enrollment)
        except ConfigProblem as e:
            self.endpoints, self.unusable = {}, str(e)
        else:
            self.endpoints = endpoints or {}
            self.unusable = UNENCRYPTED if endpoints is None else None

    async def seal(self) -> None:
        """At install. A refusal ends the node's path: Talos cannot make
        STATE, so it never gets further. A configuration without the
        section: Talos makes plain volumes, and the path goes on."""
        if self.unusable == UNENCRYPTED:
            self.state = DiskState(NONE, error=UNENCRYPTED)
            return
        if self.unusable is not None:
            self.state = DiskState(FAILED, error=self.unusable)
            raise StepFailed(f"seal: {self.unusable}")
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
        if self.state.error == UNENCRYPTED:
            return  # plain volumes: nothing to ask
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
        """C{blocking} in a thread with a client per endpoint of the
        volumes, each on a new connection from the node's address."""
        relays: list[Relay] = []
        channels: list[grpc.Channel] = []
        byURL: dict[str, KMSClient] = {}
        try:
            for endpoint in self.endpoints.values():
                if endpoint.url in byURL:
                    continue
                n = len(relays)
                relay = Relay(
                    self.rack.clock,
                    self.directory / (f"kms-{n}.sock" if n else "kms.sock"),
                    _resolved(endpoint.port),
                    self.address,
                )
                relay.start()
                relays.append(relay)
                options = [("grpc.use_local_subchannel_pool", 1)]
                channels.append(
                    relayedChannel(relay, self.rack.fleetd, options, endpoint.host)
                )
                byURL[endpoint.url] = KMSClient(channels[-1], timeout=CALL_TIMEOUT)
            clients = {name: byURL[e.url] for name, e in self.endpoints.items()}
            await deferToThread(
                blocking, clients, self.uuid, self.directory,
                RETRY_GAP / self.rack.timeScale,
            )  # fmt: skip
        finally:
            for channel in channels:
                channel.close()
            for relay in relays:
                await relay.stop()


def _resolved(port: int) -> Callable[[], tuple[str, int]]:
    """An endpoint's name as the node resolves it (fleetd), and its port."""
    return lambda: (FLEETD_ADDRESS, port)
