"""
C{make agent-demo}: one node's TPM path against fleetd, end to end.

What a node's Tinkerbell workflow does in HookOS, run here with real
peers and no hardware: a swtpm whose EK is certified by the dev PKI's
TPM manufacturer CA, behind tpm2-abrmd on a private D-Bus (the resource
manager a node has as /dev/tpmrm0, which mTLS with the TPM-resident
LDevID needs), and a sparse disk image laid out as Talos lays out an
installed disk. Each step prints the command it runs; the one-time code
is a secret that joins a node, so only its first characters are shown.

    .venv/bin/python scripts/agent_demo.py [--config conf/fleetd.dev.toml]
    .venv/bin/python scripts/agent_demo.py --start

Without C{--start} it talks to the daemon of C{make run} (another
terminal) and adds one device to its inventory, a fresh name and serial
each run. With C{--start} it runs its own fleetd on a temporary state
directory. Everything it started (swtpm, tpm2-abrmd, dbus-daemon, its
fleetd) is stopped and its files removed, also when a step fails.
Exit 0 after "META 0x0b verified", 1 when a step failed, 2 when fleetd
is not running.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


from fleetd.pki.dev import ensureDevPKI  # noqa: E402
from fleetd.sim.daemon import Fleetd, freePort, healthy  # noqa: E402
from fleetd.sim.tpm import SWTPM, ResourceManager, SessionBus, ekDigestOf  # noqa: E402
from tests.metasupport import TALOS_LAYOUT  # noqa: E402
from tests.support import TOPOLOGY, writeConfig  # noqa: E402

BIN = Path(sys.executable).parent  # the venv's console scripts
# Its commands run this checkout's fleetd, as this script does.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    ),
}
IMAGE_BYTES = 16 * 1024**3  # sparse; fleetd installs on disks of 10 GiB or more
SHOWN = 6  # characters of the code that are printed


class StepFailed(Exception):
    pass


WORK: list[str] = []  # the workspace, shown as $W


def shown(argv: Sequence[str]) -> str:
    """A command as one can paste it: the workspace as $W, and paths
    under the current directory relative to it."""
    here = str(Path.cwd()) + os.sep
    words = []
    for arg in argv:
        arg = arg[len(here) :] if arg.startswith(here) else arg
        word = shlex.quote(arg)
        if WORK and word == arg:
            word = word.replace(WORK[0], "$W")
        words.append(word)
    return " ".join(words)


def echo(argv: Sequence[str], tail: str = "") -> None:
    print(f"$ {shown(argv)}{tail}", flush=True)


def say(line: str) -> None:
    print(line, flush=True)


class Demo:
    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.env = env
        self.code = ""  # the run's code, once provisioned; never printed whole

    def mask(self, text: str) -> str:
        return text.replace(self.code, masked(self.code)) if self.code else text

    def run(self, *argv: str, provision: bool = False, asLine: bool = False) -> str:
        """
        Run one step; print its output (code masked); its stdout. After
        C{provision}, the code is learnt from its JSON before printing;
        an C{asLine} step (C{sh -c LINE}) is shown as its line.
        """
        if asLine:
            say(f"$ {argv[-1].replace(str(self.work), '$W')}")
        else:
            echo(argv)
        done = subprocess.run(
            argv, capture_output=True, text=True, env=self.env, timeout=120
        )
        if provision and done.returncode == 0:
            self.code = str(json.loads(done.stdout)["code"])
        for line in (done.stdout + done.stderr).splitlines():
            say(f"  {self.mask(line).replace(str(self.work), '$W')}")
        if done.returncode != 0:
            raise StepFailed(f"exit status {done.returncode} from the step above")
        return done.stdout


def masked(code: str) -> str:
    return code[:SHOWN] + "…"


def startFleetd(work: Path, stack: ExitStack) -> Fleetd:
    """Our own fleetd on a temporary state directory, until the end."""
    admin, device = freePort(), freePort()
    listen = "tcp:{}:interface=127.0.0.1"
    config = writeConfig(
        work / "fleetd",
        {
            "listen": {"admin": listen.format(admin), "device": listen.format(device)},
            "owner": {"server": f"https://localhost:{admin}"},
        },
    )
    ensureDevPKI(work / "fleetd" / "pki", str(TOPOLOGY["enrollment_name"]))
    fleetd = Fleetd.fromConfig(config)
    argv = [str(BIN / "twistd"), "-n", "--pidfile=", "fleetd", "--config", str(config)]
    echo(argv, " > $W/fleetd.log 2>&1 &")
    log = (work / "fleetd.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    log.close()

    def stop() -> None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    started(stack, "fleetd", process.pid, stop)
    deadline = time.monotonic() + 60
    while not healthy(fleetd):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = (work / "fleetd.log").read_text(errors="replace")[-2000:]
            raise StepFailed(f"fleetd did not come up:\n{tail}")
        time.sleep(0.1)
    return fleetd


def started(
    stack: ExitStack, what: str, pid: int | None, stop: Callable[[], None]
) -> None:
    """Say that C{what} runs, and stop it (saying so) at the end."""
    say(f"  started {what} (pid {pid})")

    def stopping() -> None:
        stop()
        say(f"  stopped {what} (pid {pid})")

    stack.callback(stopping)


def makeImage(path: Path) -> None:
    """A sparse disk image with Talos's installed layout (META 1 MiB)."""
    echo(["truncate", "-s", f"{IMAGE_BYTES // 1024**3}G", str(path)])
    with path.open("wb") as f:
        f.truncate(IMAGE_BYTES)
    layout = ["label: gpt"] + [
        f"size={size}, name={name}" if size else f"name={name}"
        for name, size in TALOS_LAYOUT
    ]
    argv = ["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", str(path)]
    echo(["printf", "%s\\n", *layout], f" | {shown(argv)}")
    subprocess.run(
        argv, input="\n".join(layout) + "\n", text=True, check=True, timeout=60
    )


def demo(args: argparse.Namespace, work: Path, stack: ExitStack) -> None:
    WORK[:] = [str(work)]
    say(f"$ W={work}    # the workspace, removed at the end")
    if args.start:
        say("== 0. fleetd on a temporary state directory")
        fleetd = startFleetd(work, stack)
    else:
        fleetd = Fleetd.fromConfig(args.config)
        if not healthy(fleetd):
            raise NotRunning(fleetd.admin)
    config = str(fleetd.config)
    say(f"== fleetd answers on {fleetd.admin}/healthz; device listener {fleetd.device}")

    say("== 1. a TPM: swtpm, its EK certified by the dev EK CA, behind tpm2-abrmd")
    tpm = SWTPM(work / "tpm", fleetd.pki, echo=echo)
    tpm.start()
    started(stack, "swtpm", tpm.pid, tpm.stop)
    bus = SessionBus(work / "bus", echo=echo)
    bus.start()
    started(stack, "dbus-daemon", bus.pid, bus.stop)
    rm = ResourceManager(tpm, work / "bus", bus)
    try:
        rm.start()
    finally:
        started(stack, "tpm2-abrmd", rm.process.pid if rm.process else None, rm.stop)
    say(f"$ export DBUS_SESSION_BUS_ADDRESS={bus.address}")
    run = Demo(work, {**ENV, "DBUS_SESSION_BUS_ADDRESS": bus.address})

    tag = secrets.token_hex(3)
    name, serial, node = f"demo-{tag}", f"DEMO-{tag.upper()}", str(uuid.uuid4())
    say("== 2. the owner: inventory, evidence of the EK (a receiving scan), binding")
    digest = ekDigestOf(tpm.ekCertificates()["ek-rsa2048.crt"])
    # The EK digest as an owner computes it from the EK certificate (DER,
    # as swtpm_setup and a TPM's NV index hold it); fleetd's reading of
    # the same SPKI must agree.
    ek = tpm.directory / "certs" / "ek-rsa2048.crt"
    pipeline = (
        f"openssl x509 -inform DER -in {shlex.quote(str(ek))} -noout -pubkey"
        " | openssl pkey -pubin -outform DER | sha256sum"
    )
    if run.run("sh", "-c", pipeline, asLine=True).split()[0] != digest:
        raise StepFailed(f"openssl's EK digest is not fleetd's {digest}")
    fleetctl = [str(BIN / "fleetctl"), "--config", config]
    run.run(*fleetctl, "device", "add", name, "--serial", serial, "--uuid", node,
            "--class", args.device_class)  # fmt: skip
    run.run(*fleetctl, "evidence", "add", "--serial", serial, "--ek-sha256", digest,
            "--kind", "receiving-scan", "--ref", "agent-demo")  # fmt: skip
    run.run(*fleetctl, "binding", "approve", serial)

    say("== 3. the node: attest, an LDevID in the TPM; report the disks")
    agent = [str(BIN / "fleetd-agent"), "--server", fleetd.device,
             "--ca", str(fleetd.pki.public_ca), "--tcti", rm.tcti,
             "--state", str(work / "agent")]  # fmt: skip
    (work / "agent").mkdir()
    run.run(*agent, "attest", "--serial", serial, "--uuid", node, "--ek", "rsa")
    disk = f"DEMO-DISK-{tag.upper()}"
    report = work / "disks.json"
    report.write_text(json.dumps({"disks": [
        {"name": "vda", "serial": disk, "wwn": None, "size": IMAGE_BYTES,
         "removable": False}]}, indent=1))  # fmt: skip
    say(f"  {report.name}: one disk, vda, serial {disk}, {IMAGE_BYTES} bytes")
    run.run(*agent, "disks", "--from", str(report))

    say("== 4. the owner provisions it: a run, a one-time code")
    run.run(*fleetctl, "--json", "provision", name, provision=True)

    say("== 5. the node: the plan, its code written as META 0x0b on the disk")
    image = work / "disk.img"
    makeImage(image)
    plan = json.loads(
        run.run(*agent, "--json", "plan", "--write-meta", str(image), "--image-file")
    )
    if plan["target_disk_serial"] != disk:
        raise StepFailed(f"the plan's target disk is {plan['target_disk_serial']}")
    keys = json.loads(run.run(*agent, "meta", "read", "--disk", str(image), "--json"))
    if keys["keys"].get("0x0b") != run.code:
        raise StepFailed("META 0x0b on the image is not the run's code")
    say(f"META 0x0b verified: {masked(run.code)}")
    if not args.start:
        say(f"(device {name} stays in the inventory: fleetctl status {name})")


class NotRunning(Exception):
    pass


def onSignal(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agent-demo", description="One node's TPM path against fleetd."
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=REPO / "conf" / "fleetd.dev.toml",
        help="the config of the running fleetd (default: make run's)",
    )
    parser.add_argument(
        "--start", action="store_true", help="start (and stop) a fleetd of its own"
    )
    parser.add_argument(
        "--class", dest="device_class", default="worker", help="the device's class"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, onSignal)
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="fleetd-agent-demo-"))
        stack.callback(lambda: say(f"== removed {work}"))
        stack.callback(shutil.rmtree, work, True)
        try:
            demo(args, work, stack)
        except NotRunning as e:
            say(
                f"agent-demo: fleetd does not answer on {e}/healthz: start it"
                " with `make run` in another terminal (or run with --start)"
            )
            return 2
        except (StepFailed, subprocess.SubprocessError, OSError, RuntimeError) as e:
            say(f"agent-demo: failed: {e}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
