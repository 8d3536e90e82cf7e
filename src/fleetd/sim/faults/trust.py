"""
Faults of the trust part of the table (docs/design.md, the rack
simulator's faults): machines fleetd must refuse [T1] [T2] [T3] [D1], each
ending C{refused} with fleetd's reason code, checked from what fleetd
recorded (the journal, the owner API, the metrics on the admin listener):

    cloned-tpm       the node's swtpm runs on a copy of another machine's
                     TPM state: that machine is enrolled (its binding
                     approved), the clone's receiving scan names the same
                     EK under its own serial, so the evidence conflicts,
                     the approval is refused (conflicting-evidence), the
                     original's binding is suspended and the clone's
                     attestation is refused ek-binding-not-approved
    no-evidence      no evidence names its EK: the owner's approval is
                     refused (evidence-missing), the node still runs its
                     workflow and is refused ek-binding-not-approved
    tpm12            a TPM 1.2 swtpm with no resource manager (the kernel
                     gives a 1.2 TPM no /dev/tpmrm0): fleetd-agent tells
                     fleetd so, refused tpm12-unsupported
    worker-g2        a refused class: the provision is refused and so is
                     the attestation (class-refused)
    dup-disk-serial  its disk report adds a disk whose serial another
                     device reported before: duplicate-disk-serial
    no-disk-serial   its disk report has a non-removable disk without a
                     serial: disk-serial-missing

fleetd names the device an attestation refusal concerns by an approved
binding, or else by the node's claim (the serial it reports, the serials
its EK's evidence names; issue 27): the refusals of an unbound EK or a TPM
1.2 name the node's device too (C{named_by}), and are found by it. The
sim still spaces such refusals of one reason by 10 s, which fleetd once
needed to journal each (it journaled refusals naming no device at most
once per reason every 10 s) and which keeps a large rack under the budget
of refusals a claim may name at once.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import DeferredLock
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue

from fleetd.attest.throttle import ANONYMOUS_EVERY
from fleetd.sim.daemon import BIN, Fleetd
from fleetd.sim.faults.model import Fault
from fleetd.sim.node import (
    ACTIONS,
    DISK_BYTES,
    Node,
    Rack,
    Step,
    StepFailed,
)
from fleetd.sim.tpm import SWTPM, ResourceManager, ekDigestOf

NOT_APPROVED = "ek-binding-not-approved"
TPM12 = "tpm12-unsupported"
CLASS_REFUSED = "class-refused"
DUPLICATE = "duplicate-disk-serial"
MISSING = "disk-serial-missing"
ATTEST_RESULTS = "fleetd_attest_results_total"
OWNER_REFUSAL = re.compile(r"answered \d+: ([a-z0-9-]+): ")
REPORT_POLLS = 240  # another device's disk report is looked for this many times...
POLL_GAP = 0.5  # ...this many seconds apart

# Per rack and reason: held from a node's workflow until ANONYMOUS_EVERY
# after its refusal, for refusals that name no device (see above).
_gaps: dict[tuple[int, str], tuple[Rack, DeferredLock]] = {}


# The owner's side and fleetd's records


async def owner(node: Node, *args: str) -> tuple[int, str]:
    """C{fleetctl ARGS} as the owner: its exit status and its output."""
    argv = [str(BIN / "fleetctl"), "--config", str(node.rack.fleetd.config), *args]
    out, err, code = await getProcessOutputAndValue(
        argv[0], argv[1:], env=dict(os.environ)
    )
    return code, (out + err).decode(errors="replace")


async def ownerRefused(node: Node, code: str, *args: str) -> None:
    """The owner's C{fleetctl ARGS} is refused by fleetd with C{code}
    (part of the fault's story, not the node's end)."""
    status, text = await owner(node, *args)
    said = OWNER_REFUSAL.search(text)
    if status == 0 or said is None or said.group(1) != code:
        last = (text.strip().splitlines() or [f"exit {status}"])[-1]
        raise StepFailed(f"fleetctl {' '.join(args[:2])}: not {code}: {last}")


async def journal(node: Node, device: str | None = None) -> list[dict[str, Any]]:
    """fleetd's journal through the owner API, whole or about C{device}."""
    entries: list[dict[str, Any]] = []
    while True:
        since = str(entries[-1]["seq"] if entries else 0)
        args = ["--json", "journal", "--since", since]
        if device is not None:
            args += ["--device", device]
        page: list[dict[str, Any]] = json.loads(await node.fleetctl(*args))
        if not page:
            return entries
        entries += page


def entry(
    entries: list[dict[str, Any]], event: str, **fields: object
) -> dict[str, Any] | None:
    """The last entry of C{event} whose fields hold C{fields}."""
    for one in reversed(entries):
        held = all(one["fields"].get(k) == v for k, v in fields.items())
        if one["event"] == event and held:
            found: dict[str, Any] = one
            return found
    return None


def scrape(fleetd: Fleetd) -> str:
    """C{GET /metrics} on the admin listener (blocking)."""
    host, _, port = fleetd.admin.removeprefix("https://").partition(":")
    context = ssl.create_default_context(cafile=str(fleetd.pki.public_ca))
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


async def attestResults(node: Node, result: str) -> float:
    """C{fleetd_attest_results_total{result=RESULT}} as fleetd serves it."""
    text = await deferToThread(scrape, node.rack.fleetd)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ATTEST_RESULTS and sample.labels["result"] == result:
                return float(sample.value)
    raise StepFailed(f"metrics: no {ATTEST_RESULTS}{{result={result!r}}}")


async def attestRefused(node: Node, reason: str, device: str | None) -> str | None:
    """Whether fleetd journaled this node's attestation refusal with
    C{reason} (about C{device} when fleetd knows it, else by the serial the
    node reported) and counted it in its metric."""
    found = entry(
        await journal(node, device), "attest.refused",
        reason=reason, reported_serial=node.serial,
    )  # fmt: skip
    if found is None or found["device"] != device:
        return f"journal: no attest.refused {reason} of {node.serial} (device {device})"
    if await attestResults(node, reason) < 1:
        return f"metrics: {ATTEST_RESULTS}{{result={reason!r}}} is 0"
    return None


# Paths


def spaced(node: Node, reason: str, run: Callable[[], Awaitable[None]]) -> Step:
    """The workflow, after the last refusal of C{reason} naming no device
    is ANONYMOUS_EVERY seconds old (see the module's docstring)."""

    async def step() -> None:
        key = (id(node.rack), reason)
        _, gap = _gaps.setdefault(key, (node.rack, DeferredLock()))
        await gap.acquire()
        try:
            await run()
        finally:
            node.rack.clock.callLater(ANONYMOUS_EVERY + 0.5, gap.release)

    return Step(None, step)


def replaced(steps: list[Step], new: dict[str | None, Step]) -> list[Step]:
    """C{steps} with the steps of C{new}'s phases (None: the workflow) replaced."""
    return [new.get(s.phase, s) for s in steps]


def tpmStep(node: Node, make: Callable[[], tuple[SWTPM, str]], rm: bool) -> Step:
    """The tpm phase with the swtpm C{make} gives (and the EK digest a
    receiving scan would read), behind tpm2-abrmd when C{rm}."""

    def start() -> None:
        node.directory.mkdir(parents=True)
        (node.directory / "agent").mkdir()
        tpm, node.digest = make()
        node.rack.started.add("swtpm", lambda: tpm.pid, tpm.stop)
        tpm.start()
        node.tcti = tpm.tcti
        if rm:
            manager = ResourceManager(tpm, node.directory, node.rack.bus)

            def pid() -> int | None:
                return None if manager.process is None else manager.process.pid

            node.rack.started.add("tpm2-abrmd", pid, manager.stop)
            manager.start()
            node.tcti = manager.tcti

    async def run() -> None:
        await deferToThread(start)

    return Step("tpm", run)


async def addDevice(node: Node, deviceClass: str = "worker") -> None:
    await node.fleetctl("device", "add", node.name, "--serial", node.serial,
                        "--uuid", node.uuid, "--mac", node.mac,
                        "--class", deviceClass)  # fmt: skip


async def scan(node: Node, serial: str) -> None:
    """The receiving scan of C{serial}: the EK the node's TPM holds."""
    await node.fleetctl("evidence", "add", "--serial", serial,
                        "--ek-sha256", node.digest, "--kind", "receiving-scan",
                        "--ref", "fleetd-sim")  # fmt: skip


def original(node: Node) -> tuple[str, str]:
    """The name and serial of the machine whose TPM a clone copies."""
    return f"{node.name}-orig", f"{node.serial}-ORIG"


def clonedTPM(node: Node) -> tuple[SWTPM, str]:
    pki = node.rack.fleetd.pki
    first = SWTPM(node.directory / "original-tpm", pki)  # manufactured, never run
    digest = ekDigestOf(first.ekCertificates()["ek-rsa2048.crt"])
    return first.clone(node.directory / "tpm"), digest


async def enrollClone(node: Node) -> None:
    """The original machine enrolled earlier; then the clone's own
    receiving scan (the same EK: a conflict) and the refused approval."""
    name, serial = original(node)
    await node.fleetctl("device", "add", name, "--serial", serial,
                        "--uuid", str(uuid.uuid4()), "--class", "worker")  # fmt: skip
    await scan(node, serial)
    await node.fleetctl("binding", "approve", serial)
    await addDevice(node)
    await scan(node, node.serial)
    await ownerRefused(node, "conflicting-evidence", "binding", "approve", node.serial)


def clonedPath(node: Node, steps: list[Step]) -> list[Step]:
    return replaced(steps, {
        "tpm": tpmStep(node, lambda: clonedTPM(node), rm=True),
        "enroll": Step("enroll", lambda: enrollClone(node)),
        None: spaced(node, NOT_APPROVED, node.workflow),
    })  # fmt: skip


async def clonedRecorded(node: Node) -> str | None:
    name, serial = original(node)
    mine = await journal(node, node.name)
    if entry(mine, "evidence.conflict") is None:
        return "journal: no evidence.conflict for the clone's receiving scan"
    if entry(mine, "binding.refused", reason="conflicting-evidence") is None:
        return "journal: no binding.refused conflicting-evidence"
    shown = await node.fleetctl("--json", "binding", "list")
    states = {b["serial"]: b["state"] for b in json.loads(shown)}
    if states.get(serial) != "suspended":
        return f"bindings: {name}'s is {states.get(serial)}, not suspended"
    return await attestRefused(node, NOT_APPROVED, node.name)


async def enrollUnscanned(node: Node) -> None:
    await addDevice(node)
    await ownerRefused(node, "evidence-missing", "binding", "approve", node.serial)


def unscannedPath(node: Node, steps: list[Step]) -> list[Step]:
    return replaced(steps, {
        "enroll": Step("enroll", lambda: enrollUnscanned(node)),
        None: spaced(node, NOT_APPROVED, node.workflow),
    })  # fmt: skip


async def unscannedRecorded(node: Node) -> str | None:
    mine = await journal(node, node.name)
    if entry(mine, "evidence.recorded") is not None:
        return "journal: evidence recorded for a node without any"
    if entry(mine, "binding.refused", reason="evidence-missing") is None:
        return "journal: no binding.refused evidence-missing"
    return await attestRefused(node, NOT_APPROVED, node.name)


def tpm12(node: Node) -> tuple[SWTPM, str]:
    return SWTPM(node.directory / "tpm", node.rack.fleetd.pki, tpm2=False), ""


def tpm12Path(node: Node, steps: list[Step]) -> list[Step]:
    # No TPM 2.0 EK to scan: the device is added, no evidence recorded.
    return replaced(steps, {
        "tpm": tpmStep(node, lambda: tpm12(node), rm=False),
        "enroll": Step("enroll", lambda: addDevice(node)),
        None: spaced(node, TPM12, node.workflow),
    })  # fmt: skip


async def tpm12Recorded(node: Node) -> str | None:
    return await attestRefused(node, TPM12, node.name)


async def enrollG2(node: Node) -> None:
    await addDevice(node, "worker-g2")
    await scan(node, node.serial)
    await node.fleetctl("binding", "approve", node.serial)


async def provisionG2(node: Node) -> None:
    """The provision is refused; Tink (not fleetd's) still serves the
    install workflow, so HookOS runs it and attests."""
    await ownerRefused(node, CLASS_REFUSED, "provision", node.name)
    node.rack.tink.add(node.mac, f"sim/{node.name}", ACTIONS)


def g2Path(node: Node, steps: list[Step]) -> list[Step]:
    return replaced(steps, {
        "enroll": Step("enroll", lambda: enrollG2(node)),
        "provision": Step("provision", lambda: provisionG2(node)),
    })  # fmt: skip


async def g2Recorded(node: Node) -> str | None:
    mine = await journal(node, node.name)
    if entry(mine, "provision.refused", reason=CLASS_REFUSED) is None:
        return "journal: no provision.refused class-refused"
    return await attestRefused(node, CLASS_REFUSED, node.name)


async def anotherDevicesDisk(node: Node) -> list[dict[str, Any]]:
    """The node's disk and one whose serial another device reported."""
    for _ in range(REPORT_POLLS):
        reported = [
            e for e in await journal(node)
            if e["event"] == "disks.reported" and e["device"] != node.name
        ]  # fmt: skip
        if reported:
            serial = reported[-1]["fields"]["target"]
            moved = {"name": "vdb", "serial": serial, "wwn": None,
                     "size": DISK_BYTES, "removable": False}  # fmt: skip
            return [node.ownDisk(), moved]
        await deferLater(node.rack.clock, POLL_GAP, lambda: None)
    raise StepFailed("dup-disk-serial: no other device's disk report (no clean node?)")


async def unnamedDisk(node: Node) -> list[dict[str, Any]]:
    """The node's disk and one that exposes no serial."""
    bare = {"name": "vdb", "serial": None, "wwn": None,
            "size": DISK_BYTES, "removable": False}  # fmt: skip
    return [node.ownDisk(), bare]


def disksPath(
    report: Callable[[Node], Awaitable[list[dict[str, Any]]]],
) -> Callable[[Node, list[Step]], list[Step]]:
    def alter(node: Node, steps: list[Step]) -> list[Step]:
        node.disks = report
        return steps

    return alter


def disksRefused(reason: str) -> Callable[[Node], Awaitable[str | None]]:
    async def check(node: Node) -> str | None:
        found = entry(await journal(node, node.name), "disks.refused", reason=reason)
        if found is None:
            return f"journal: no disks.refused {reason}"
        if reason == DUPLICATE and not found["fields"].get("first_reported_by"):
            return "journal: disks.refused names no first reporter"
        return None

    return check


FAULTS: tuple[Fault, ...] = (
    Fault("cloned-tpm", "refused", clonedPath, clonedRecorded, NOT_APPROVED),
    Fault("no-evidence", "refused", unscannedPath, unscannedRecorded, NOT_APPROVED),
    Fault("tpm12", "refused", tpm12Path, tpm12Recorded, TPM12),
    Fault("worker-g2", "refused", g2Path, g2Recorded, CLASS_REFUSED),
    Fault("dup-disk-serial", "refused", disksPath(anotherDevicesDisk),
          disksRefused(DUPLICATE), DUPLICATE),
    Fault("no-disk-serial", "refused", disksPath(unnamedDisk),
          disksRefused(MISSING), MISSING),
)  # fmt: skip
