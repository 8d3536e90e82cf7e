"""
docs/install.md as a script (issue 27, item 6): its C{sh} blocks split into
commands, the few it cannot run here and what runs instead, and one C{bash}
in a scratch root (L{tests.scratchroot}) that runs them as written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from fleetd.pki.dev import certPEM, keyPEM, makeCertificate
from tests.support import REPO

GUIDE = REPO / "docs" / "install.md"
SENTINEL = "__install_rc__"
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")


@dataclass(frozen=True)
class Command:
    """One command of the guide: its text and the section it is in."""

    section: str
    text: str


def guideCommands(text: str) -> list[Command]:
    """Each C{sh} block's commands, continuation lines and here-documents joined."""
    commands: list[Command] = []
    section, lines = "", text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i][3:]
        if lines[i] != "```sh":
            i += 1
            continue
        i += 1
        pending: list[str] = []
        until = None
        while lines[i] != "```":
            line = lines[i]
            i += 1
            pending.append(line)
            if until is not None:
                if line == until:
                    until = None
                else:
                    continue
            elif (found := HEREDOC.search(line)) is not None:
                until = found.group(1)
                continue
            if line.endswith("\\"):
                continue
            if "".join(pending).strip():
                commands.append(Command(section, "\n".join(pending)))
            pending = []
    return commands


def purelib(venv: str) -> str:
    """Shell: the site-packages directory of the venv at C{venv}."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return f'"$({venv}/bin/python -c "{code}")"'


# What the test runs instead of a command of the guide it cannot run here
# (None: nothing), and what it runs after one (docs/install.md, "How this
# page is tested"). A command the guide changes is run as written again,
# and fails here until this table follows it.
START, RELOAD, RESTART = "start", "reload", "restart"
INSTEAD: dict[str, str | None] = {
    "apt-get install python3 python3-venv libtss2-dev pkg-config gcc openssl"
    " curl": None,
    "make dist": "install -d /root/fleetd/dist && cp {wheel} /root/fleetd/dist/",
    "systemctl daemon-reload": None,
    "systemctl enable --now fleetd": START,
    "systemctl status fleetd": None,
    "systemctl reload fleetd": RELOAD,
    "systemctl restart fleetd": RESTART,
    "fleetctl dns-check": None,
    'talosctl validate --config "$CLUSTER.yaml" --mode metal': None,
}
TALOS = 'talosctl gen config "$CLUSTER" "$KUBE_API"'  # then its options
# talosctl's worker template: the example's, with stand-in values of the
# right form (tests.support.filledTemplate); fleetd refuses its placeholders.
TALOS_INSTEAD = 'cp {template} "$CLUSTER.yaml"'
AFTER: dict[str, str] = {
    "python3 -m venv /opt/fleetd": (
        "echo {deps} > " + purelib("/opt/fleetd")[:-1] + '/deps.pth"'
    ),
    "/opt/fleetd/bin/pip install dist/fleetd-*-py3-none-any.whl": (
        "printf '#!/opt/fleetd/bin/python\\nimport sys\\n"
        "from twisted.scripts.twistd import run\\nsys.exit(run())\\n'"
        " > /opt/fleetd/bin/twistd && chmod 0755 /opt/fleetd/bin/twistd"
    ),
}


def instead(command: str) -> str | None:
    """What runs for C{command}: itself, a shell line, L{START}..., or None."""
    head = command.split("  #")[0].strip()
    if head.startswith(TALOS):
        return TALOS_INSTEAD
    return INSTEAD.get(head, command)


def cloneFiles() -> list[str]:
    """The files a clean clone of this checkout holds (as edited now)."""
    done = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    )
    return [n for n in done.stdout.decode().split("\0") if n]


def makeClone(target: Path) -> None:
    for name in cloneFiles():
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def publicCertificate(directory: Path, name: str) -> bytes:
    """
    certbot's three files for C{name} in C{directory}, from a stand-in
    public CA; returns that CA's certificate (PEM).
    """
    now = datetime.now(UTC)
    caKey = ec.generate_private_key(ec.SECP256R1())
    leafKey = ec.generate_private_key(ec.SECP256R1())
    ca = makeCertificate("stand-in public CA", caKey, now)
    leaf = makeCertificate(
        name, leafKey, now, (ca, caKey), ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName(name)],
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cert.pem").write_bytes(certPEM(leaf))
    (directory / "chain.pem").write_bytes(certPEM(ca))
    (directory / "privkey.pem").write_bytes(keyPEM(leafKey))
    return certPEM(ca)


class GuideShell:
    """One C{bash} as root in a scratch root under C{scratch}, a command at a time."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.script = scratch / "command.sh"
        python = f"{os.path.realpath(sys.base_prefix)}/bin"  # python3: this one
        system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env = {
            "PATH": f"{python}:{system}",
            "HOME": "/root", "USER": "root", "LOGNAME": "root", "LANG": "C.UTF-8",
            "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.scratchroot", str(scratch), "--",
             "bash", "--noprofile", "--norc"],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def run(self, command: str) -> tuple[int, str]:
        """Run C{command} (several lines, a here-document) with no input."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.script.write_text(command + "\n")
        self.process.stdin.write(
            f"source {self.script} </dev/null\necho {SENTINEL}$?\n"
        )
        self.process.stdin.flush()
        output: list[str] = []
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"the shell ended during: {command}")
            if line.startswith(SENTINEL):
                return int(line[len(SENTINEL) :]), "".join(output)
            output.append(line)

    def value(self, expression: str) -> str:
        """The shell's expansion of C{expression} (a variable of step 0)."""
        status, out = self.run(f'printf "%s\\n" {expression}')
        assert status == 0, out
        return out.strip()

    def nsenter(self, *argv: str) -> list[str]:
        """C{argv} run in the scratch root, from this checkout's directory."""
        return [
            "nsenter", f"--target={self.process.pid}", "--mount", "--net", "--uts",
            "--root", "--wd", "--", "sh", "-c", 'cd "$0" && exec "$@"', str(REPO),
            *argv,
        ]  # fmt: skip

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
