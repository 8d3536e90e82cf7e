"""
One virtual node's path, end to end (docs/design.md, the path of one
worker):

    tpm       its own swtpm (EK certified by the dev EK CA) behind tpm2-abrmd
    enroll    the owner: device, evidence of the EK, binding approved
    provision the owner: a run, its one-time code
    attest    HookOS workflow actions, each served by the tink-server
    disks       stand-in through fleetd's Tink proxy and reported RUNNING,
    plan        SUCCESS by a grpcio tink agent; each runs fleetd-agent
    install     over the device listener (install: the image written)
    config    Talos: GET /config?code=… on the boot listener, from the
              node's own loopback address, Talos's retry schedule scaled;
              or (C{--fetch device-flow}) RFC 8628: the node asks for a
              user code, the owner approves it (C{fleetctl approve}), the
              node polls for its token and fetches with it
    seal      (C{--disk-encryption}) Talos makes STATE and EPHEMERAL, each
              with 32 random bytes sealed by the KMS its configuration
              names (fleetd's kms listener; L{fleetd.sim.luks})
    kubelet   its first client CSR, filed with the bootstrap token of the
              delivered configuration against the Kubernetes fake, until
              fleetd's approver approves it (when the rack has a cluster)
    unlock    (C{--disk-encryption}) a reboot: each volume's sealed blob
              unsealed by fleetd, the answer opening it

Each phase is a method of L{Node} run in order by L{Node.run}, a fault
altering the path; a step fleetd refuses ends it with its reason code.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue

from fleetd.sim.daemon import BIN
from fleetd.sim.deviceflow import (
    BootEndpoint,
    DeviceFlowFailed,
    awaitToken,
    requestCode,
)
from fleetd.sim.hookos import ACTIONS, serveWorkflow
from fleetd.sim.kubelet import bootstrapToken, fileAndAwait
from fleetd.sim.luks import EncryptedDisk
from fleetd.sim.netbox import enterDevice
from fleetd.sim.rack import Cluster, Rack, Refused, Step, StepFailed
from fleetd.sim.relay import Relay, relayedChannel, tinkRelay
from fleetd.sim.talos import fetchConfig
from fleetd.sim.tpm import SWTPM, ResourceManager, ekDigestOf
from fleetd.testing.tinkagent import getAction, report

PHASES = (
    "tpm", "enroll", "provision", "attest", "disks", "plan", "install", "config",
    "kubelet",
)  # fmt: skip
# The phases of an encrypted disk (--disk-encryption), and every phase a
# node may be timed in, in the order of its path.
DISK_PHASES = ("seal", "unlock")
TIMED = (*PHASES[: PHASES.index("kubelet")], "seal", "kubelet", "unlock")
DISK_BYTES = 16 * 1024**3
# fleetd-agent's refusal lines: "refused: CODE: ..." (attest, plan),
# "fleetd refused (409): CODE: ..." (disks).
REFUSED = re.compile(r"refused(?: \(\d{3}\))?: ([a-z0-9-]+)")


@dataclass
class Node:
    """One node: its identity, where it is, what happened to it."""

    index: int
    rack: Rack
    fault: str | None = None
    phase: str = "waiting"
    phases: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)  # clock, per phase
    reason: str | None = None
    error: str | None = None
    # The fault's change to the path (fleetd.sim.faults), if any.
    alter: Callable[[Node, list[Step]], list[Step]] | None = None
    # A fault's disk report in place of the node's one disk, if any.
    disks: Callable[[Node], Awaitable[list[dict[str, Any]]]] | None = None

    def __post_init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"sim-{self.index:03d}-{tag}"
        self.serial = f"SIM-{tag.upper()}-{self.index:03d}"
        self.uuid = str(uuid.uuid4())
        low = secrets.randbelow(256)
        self.mac = (
            f"52:54:00:{self.index >> 8 & 0xFF:02x}:{self.index & 0xFF:02x}:{low:02x}"
        )
        self.disk = f"SIM-DISK-{tag.upper()}-{self.index:03d}"
        # Linux routes all of 127/8 to lo: each node its own source address.
        rank = self.index - 1  # 127.0.1.1 for the first node
        self.address = f"127.0.{1 + rank // 250}.{1 + rank % 250}"
        self.directory = self.rack.work / self.name
        self.tcti = ""
        self.digest = ""
        self.code = ""
        self.token = ""  # the delivered bootstrap token: used, never shown
        self.relay: Relay | None = None
        self.run_: str | None = None  # its latest run, as provisioned
        self.served = ""  # the workflow id tink-server served it
        self.encrypted: EncryptedDisk | None = None  # its STATE and EPHEMERAL
        if self.rack.diskEncryption:
            self.encrypted = EncryptedDisk(
                self.rack, self.directory, self.address, self.uuid
            )

    def steps(self) -> list[Step]:
        """The clean path."""
        steps = [
            Step("tpm", self.startTPM),
            Step("enroll", self.enroll),
            Step("provision", self.provision),
            Step(None, self.workflow),  # attest, disks, plan, install: timed there
            Step("config", self.fetchConfig),
        ]
        if self.encrypted is not None:
            steps.append(Step("seal", self.encrypted.seal))
        if self.rack.cluster is not None:
            steps.append(Step("kubelet", self.kubelet))
        if self.encrypted is not None:
            steps.append(Step("unlock", self.encrypted.unlock))  # a reboot
        return steps

    async def run(self) -> None:
        """Every step in order (the fault's path, if any), timing each;
        stop at a refusal."""
        steps = self.steps()
        if self.alter is not None:
            steps = self.alter(self, steps)
        try:
            for step in steps:
                if step.phase is None:
                    await step.run()
                else:
                    await self.timed(step.phase, step.run)
        except Refused as e:
            self.reason = e.reason
        except StepFailed as e:
            self.error = str(e)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            self.error = f"{type(e).__name__}: {e}"
        await (self.relay.stop() if self.relay else succeed(None))
        self.enter("done")

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.rack.changed()

    async def timed(self, phase: str, step: Callable[[], Awaitable[None]]) -> None:
        self.enter(phase)
        started = self.rack.clock.seconds()
        await step()
        self.ended[phase] = self.rack.clock.seconds()
        self.phases[phase] = round(self.ended[phase] - started, 3)

    # Owner and agent commands

    async def command(self, argv: list[str], env: dict[str, str] | None = None) -> str:
        """Run a console script; its stdout, or L{Refused}/L{StepFailed}."""
        out, err, code = await getProcessOutputAndValue(
            argv[0], argv[1:], env=env if env is not None else dict(os.environ)
        )
        if code != 0:
            text = (out + err).decode(errors="replace")
            refused = REFUSED.search(text)
            if refused:
                raise Refused(refused.group(1))
            last = text.strip().splitlines()[-1:] or [f"exit status {code}"]
            raise StepFailed(f"{Path(argv[0]).name} {argv[3:5]}: {last[0]}")
        result: str = out.decode()
        return result

    def tinkChannel(self, *extra: tuple[str, Any]) -> Any:
        """Its tink agent's channel from its address, through its relay."""
        if self.relay is None:  # stopped when it is done (run)
            self.relay = tinkRelay(self.rack, self.directory, self.address)
        return relayedChannel(self.relay, self.rack.fleetd, extra)

    def fleetctl(self, *args: str) -> Deferred[str]:
        argv = [str(BIN / "fleetctl"), "--config", str(self.rack.fleetd.config)]
        return Deferred.fromCoroutine(self.command([*argv, *args]))

    def agent(self, *args: str) -> Deferred[str]:
        fleetd = self.rack.fleetd
        argv = [str(BIN / "fleetd-agent"), "--server", fleetd.device,
                "--source", self.address, "--ca", str(fleetd.pki.public_ca),
                "--tcti", self.tcti, "--state", str(self.directory / "agent"),
                *args]  # fmt: skip
        env = {**dict(os.environ), "DBUS_SESSION_BUS_ADDRESS": self.rack.bus.address}
        return Deferred.fromCoroutine(self.command(argv, env))

    # Phases

    def startTPM(self) -> Deferred[None]:
        def start() -> str:
            self.directory.mkdir(parents=True)
            (self.directory / "agent").mkdir()
            tpm = SWTPM(self.directory / "tpm", self.rack.fleetd.pki)
            self.rack.started.add("swtpm", lambda: tpm.pid, tpm.stop)
            tpm.start()
            rm = ResourceManager(tpm, self.directory, self.rack.bus)
            self.rack.started.add("tpm2-abrmd", lambda: _pid(rm.process), rm.stop)
            rm.start()
            self.tcti = rm.tcti
            return ekDigestOf(tpm.ekCertificates()["ek-rsa2048.crt"])

        def started(digest: str) -> None:
            self.digest = digest

        d: Deferred[str] = deferToThread(start)
        return d.addCallback(started)

    async def enroll(self) -> None:
        if self.rack.netbox is not None:  # entered in NetBox, not through fleetd
            enterDevice(self.rack.netbox, name=self.name, serial=self.serial,
                        uuid=self.uuid, mac=self.mac, deviceClass="worker")  # fmt: skip
        else:
            await self.fleetctl("device", "add", self.name, "--serial", self.serial,
                                "--uuid", self.uuid, "--mac", self.mac,
                                "--class", "worker")  # fmt: skip
        await self.fleetctl("evidence", "add", "--serial", self.serial,
                            "--ek-sha256", self.digest, "--kind", "receiving-scan",
                            "--ref", "fleetd-sim")  # fmt: skip
        await self.fleetctl("binding", "approve", self.serial)

    async def provision(self, *extra: str) -> None:
        answer = json.loads(
            await self.fleetctl("--json", "provision", self.name, *extra)
        )
        self.run_ = str(answer["run"])
        await self.serve()

    async def serve(self) -> None:
        """The stand-in serves the run's workflow (L{fleetd.sim.hookos})."""
        cluster = self.rack.cluster
        fake = cluster.fake if cluster is not None and self.rack.workflows else None
        self.served = await serveWorkflow(
            self.rack.clock, self.rack.tink, fake, self.name, self.mac, self.run_
        )

    async def workflow(self) -> None:
        """HookOS: the tink agent plays the workflow tink-server serves
        through fleetd's proxy, each action being the step of its name."""
        ch = self.tinkChannel()
        try:
            while True:
                action = await deferToThread(getAction, ch, self.mac)
                if action is None:
                    return

                if action.action_id in PHASES:
                    await self.timed(action.action_id, self.reported(ch, action))
                else:  # META and the reboot: no phase of their own
                    await self.reported(ch, action)()
        finally:
            ch.close()

    def reported(self, ch: Any, action: Any) -> Callable[[], Awaitable[None]]:
        """C{action} run between its RUNNING and SUCCESS reports to tink."""

        async def step() -> None:
            await deferToThread(report, ch, self.mac, action, True)
            await self.action(action.action_id)
            await deferToThread(report, ch, self.mac, action, False)

        return step

    async def action(self, name: str) -> None:
        if name == "attest":
            await self.agent("attest", "--serial", self.serial, "--uuid", self.uuid,
                             "--ek", "rsa")  # fmt: skip
        elif name == "disks":
            report = self.directory / "disks.json"
            disks = [self.ownDisk()] if self.disks is None else await self.disks(self)
            report.write_text(json.dumps({"disks": disks}))
            await self.agent("disks", "--from", str(report))
        elif name == "plan":
            plan: dict[str, Any] = json.loads(await self.agent("--json", "plan"))
            if plan.get("target_disk_serial") != self.disk:
                raise StepFailed(f"plan: target disk {plan.get('target_disk_serial')}")
            self.code = str(plan["meta_0x0b"])
        elif name not in ("install", "meta", "reboot"):  # the image written...
            raise StepFailed(f"unknown workflow action {name!r}")

    def ownDisk(self) -> dict[str, Any]:
        """The node's one disk, as C{fleetd-agent disks} reads it from sysfs."""
        return {"name": "vda", "serial": self.disk, "wwn": None,
                "size": DISK_BYTES, "removable": False}  # fmt: skip

    async def fetchConfig(self) -> None:
        fleetd = self.rack.fleetd
        if self.rack.fetch == "device-flow":
            query, bearer = {}, await self.deviceFlowToken()
        else:
            query = {"code": self.code, "uuid": self.uuid, "serial": self.serial}
            bearer = None
        status, body = await deferToThread(
            fetchConfig,
            port=fleetd.boot,
            ca=fleetd.pki.public_ca,
            source=self.address,
            query=query,
            timeScale=self.rack.timeScale,
            bearer=bearer,
        )
        if status != 200:
            raise StepFailed(f"config: HTTP {status}")
        if self.encrypted is not None:  # Talos reads its disks' encryption
            self.encrypted.configured(body)
        if self.rack.cluster is not None:
            self.token = bootstrapToken(body)

    async def deviceFlowToken(self) -> str:
        """
        RFC 8628 (L{fleetd.sim.deviceflow}): the node asks for a user code
        and polls for its token while the owner, reading the code off the
        node's console, approves it as the console does (C{fleetctl
        approve USER-CODE --device NAME}).
        """
        fleetd = self.rack.fleetd
        boot = BootEndpoint(fleetd.boot, fleetd.pki.public_ca, self.address)
        reported = {"uuid": self.uuid, "serial": self.serial, "mac": self.mac,
                    "hostname": self.name}  # fmt: skip
        try:
            grant = await deferToThread(requestCode, boot, reported)
        except DeviceFlowFailed as e:
            raise StepFailed(f"config: {e}") from None
        stop = threading.Event()
        polled: Deferred[str] = deferToThread(
            awaitToken, boot, grant, self.rack.timeScale, stop
        )
        try:
            await self.fleetctl("approve", grant.userCode, "--device", self.name)
        except BaseException:
            stop.set()
            await polled.addErrback(lambda _: "")
            raise
        try:
            token: str = await polled
        except DeviceFlowFailed as e:
            raise StepFailed(f"config: {e}") from None
        return token

    async def kubelet(self) -> None:
        cluster = self.rack.cluster
        assert cluster is not None
        verdict = await deferToThread(
            fileAndAwait,
            port=cluster.port,
            ca=cluster.ca,
            token=self.token,
            node=self.name,
            source=self.address,
            timeout=60,
        )
        if verdict != "Approved":
            raise StepFailed(f"kubelet: CSR {verdict}")


def _pid(process: subprocess.Popen[bytes] | None) -> int | None:
    return None if process is None else process.pid


__all__ = [
    "ACTIONS",
    "DISK_PHASES",
    "PHASES",
    "TIMED",
    "Cluster",
    "Node",
    "Rack",
    "Refused",
    "Step",
    "StepFailed",
]
