"""
docs/install.md runs as written (issue 19, item 3; issue 27, item 6):
every C{sh} block of the guide, in order, in one C{bash} as root in a
scratch root (L{tests.scratchroot}: private mount and network namespaces,
an overlay over C{/}) from a clean copy of the repository at
C{/root/fleetd}; the unit's daemon under every hardening directive it
sets (L{tests.hardening}) as the C{fleetd} user the guide made, on the
shipped ports; a TLS handshake with ALPN on each listener; the backup
job's reader certificate, and root's. What the test cannot run it runs
instead (L{tests.installguide.INSTEAD}), as the guide's "How this page is
tested" says.
"""

from __future__ import annotations

import configparser
import json
import shlex
import shutil
import signal
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import yaml
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.installguide import (
    AFTER,
    GUIDE,
    INSTEAD,
    RELOAD,
    RESTART,
    START,
    TALOS,
    GuideShell,
    guideCommands,
    instead,
    makeClone,
    publicCertificate,
)
from tests.support import REPO, filledTemplate, missingPeer
from tests.test_hardening import requireHardening
from tests.test_pki_cli import vendorFiles
from tests.test_twistd import Twistd

_WHEEL: list[Path] = []
EXAMPLE = REPO / "conf" / "examples" / "folly"


def wheel(tmp: Path) -> Path:
    """The fleetd wheel, built once per test run as C{make dist} builds it."""
    if not _WHEEL:
        source = tmp / "source"
        for name in ("setup.cfg", "pyproject.toml", "README.md"):
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, source / name)
        ignore = shutil.ignore_patterns("__pycache__", "dropin.cache", "*.pyc")
        shutil.copytree(REPO / "src", source / "src", ignore=ignore)
        shutil.copytree(REPO / "docs", source / "docs")
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--no-build-isolation", "-w", str(tmp / "dist"), str(source)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        _WHEEL.append(next((tmp / "dist").glob("fleetd-*.whl")))
    return _WHEEL[0]


def unit() -> configparser.ConfigParser:
    """conf/fleetd.service as sections of keys (repeated keys: the last)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "conf" / "fleetd.service")
    return parser


def documentation() -> list[str]:
    """Every C{Documentation=} of the unit (the directive repeats)."""
    lines = (REPO / "conf" / "fleetd.service").read_text().splitlines()
    return [u for line in lines if line.startswith("Documentation=")
            for u in line.split("=", 1)[1].split()]  # fmt: skip


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120
    )


class WheelTests(SynchronousTestCase):
    def test_wheel_carriesThePluginScriptsAndGuides(self) -> None:
        """
        The wheel holds twisted/plugins/fleetd_plugin.py (so twistd finds
        fleetd in a plain install), the console scripts, fleetd-pki too,
        and every document the unit's Documentation= names, where a venv
        at /opt/fleetd puts it.
        """
        built = wheel(Path(self.mktemp()).resolve())
        archive = zipfile.ZipFile(built)
        names = archive.namelist()
        self.assertIn("twisted/plugins/fleetd_plugin.py", names)
        self.assertNotIn("twisted/plugins/dropin.cache", names)
        self.assertNotIn("twisted/__init__.py", names)  # never Twisted's own
        entry = next(n for n in names if n.endswith("entry_points.txt"))
        scripts = archive.read(entry).decode()
        for script in ("fleetctl", "fleetd-agent", "fleetd-pki"):
            self.assertIn(f"\n{script} = ", scripts)
        docs = documentation()
        self.assertTrue(docs)
        data = {n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n}
        for url in docs:
            self.assertTrue(url.startswith("file:///opt/fleetd/"), url)
            self.assertIn(url.removeprefix("file:///opt/fleetd/"), data)


class UnitFileTests(SynchronousTestCase):
    def test_unit_runsTheInstalledLayout(self) -> None:
        """
        The unit starts /opt/fleetd/bin/twistd as fleetd on
        /etc/fleetd/fleetd.toml, may write exactly paths.state and the
        vault's runtime directory, and keeps the vault over a restart [V2].
        """
        service = unit()["Service"]
        argv = shlex.split(service["ExecStart"])
        self.assertEqual(argv[0], "/opt/fleetd/bin/twistd")
        self.assertEqual(
            argv[argv.index("fleetd") :][:3],
            ["fleetd", "--config", "/etc/fleetd/fleetd.toml"],
        )
        self.assertEqual((service["User"], service["Type"]), ("fleetd", "notify"))
        conf = tomllib.loads((REPO / "conf" / "fleetd.toml").read_text())
        paths = conf["paths"]
        self.assertEqual(paths["vault"], f"/run/{service['RuntimeDirectory']}/configs")
        self.assertEqual(service["RuntimeDirectoryPreserve"], "yes")
        self.assertEqual(
            service["ReadWritePaths"].split(),
            [paths["state"], str(Path(paths["vault"]).parent)],
        )
        tmpfiles = (REPO / "conf" / "fleetd.tmpfiles.conf").read_text()
        for path in (paths["state"], paths["vault"]):
            self.assertIn(f"d {path}", " ".join(tmpfiles.split()))


class GuideScriptTests(SynchronousTestCase):
    def test_substitutions_nameCommandsOfTheGuide(self) -> None:
        """
        Each command the install test does not run as written is a command
        of the guide's sh blocks (a stale entry would hide a change), and
        a here-document is one command.
        """
        commands = guideCommands(GUIDE.read_text())
        heads = {c.text.split("  #")[0].strip() for c in commands}
        self.assertLessEqual(set(INSTEAD) | set(AFTER), heads)
        self.assertTrue(any(h.startswith(TALOS) for h in heads))
        (topology,) = [c for c in commands if "<<EOF" in c.text]
        self.assertTrue(topology.text.endswith("\nEOF"), topology.text)
        self.assertEqual(commands[0].section, "0. Your site's values")


# What the listeners answer under the unit: TLS version and ALPN protocol.
HANDSHAKES = r"""
import json, socket, ssl, sys
name, chosen = sys.argv[1], {}
for port, alpn in ((443, "http/1.1"), (8444, "http/1.1"), (8446, "http/1.1"),
                   (42113, "h2")):
    context = ssl.create_default_context()
    context.set_alpn_protocols([alpn])
    with socket.create_connection(("127.0.0.1", port), 10) as raw:
        with context.wrap_socket(raw, server_hostname=name) as tls:
            chosen[port] = [tls.version(), tls.selected_alpn_protocol()]
print(json.dumps(chosen))
"""


class InstallTests(TestCase):
    timeout = 600

    def setUp(self) -> None:
        requireHardening()
        if shutil.which("nsenter") is None:
            raise missingPeer("nsenter (util-linux) is not installed")
        self.daemon: Twistd | None = None
        self.transport: Any = None

    async def shellRun(self, shell: GuideShell, command: str) -> str:
        status, out = await deferToThread(shell.run, command)
        self.assertEqual(status, 0, f"{command}\n{out}")
        return out

    async def start(self, shell: GuideShell) -> None:
        """C{systemctl start}: the unit's ExecStart under its hardening."""
        service = unit()["Service"]
        writable = [a for p in service["ReadWritePaths"].split()
                    for a in ("--writable", p)]  # fmt: skip
        argv = shell.nsenter(
            sys.executable, "-m", "tests.hardening",
            "/etc/systemd/system/fleetd.service", "--user", service["User"],
            *writable, "--", *shlex.split(service["ExecStart"]),
        )  # fmt: skip
        proto = Twistd()
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        nsenter = shutil.which("nsenter") or "nsenter"
        self.transport = reactor.spawnProcess(proto, nsenter, argv, env=env)
        self.daemon = proto
        ready = Deferred.fromCoroutine(proto.ready())
        await ready.addTimeout(120, reactor)

    async def stop(self) -> None:
        assert self.daemon is not None
        self.transport.signalProcess(signal.SIGTERM)
        self.assertEqual(await self.daemon.ended, 0, self.daemon.err)
        self.assertNotIn(b"Traceback", self.daemon.out + self.daemon.err)

    async def reload(self) -> None:
        """C{systemctl reload}: SIGHUP, until the daemon says it reloaded."""
        assert self.daemon is not None
        before = self.daemon.out.count(b"tls.reloaded")
        self.transport.signalProcess(signal.SIGHUP)
        for _ in range(300):
            if self.daemon.out.count(b"tls.reloaded") > before:
                return
            await deferLater(reactor, 0.1, lambda: None)
        self.fail(f"no tls.reloaded: {self.daemon.out[-2000:]!r}")

    def cleanupDaemon(self) -> Deferred[int] | None:
        if self.daemon is not None and not self.daemon.ended.called:
            try:
                self.transport.signalProcess("KILL")
            except ProcessExitedAlready:
                pass
            return self.daemon.ended
        return None

    async def siteInputs(self, shell: GuideShell, scratch: Path) -> None:
        """What a site has before the guide: the clone, vendor files, certbot's."""
        inputs = scratch / "inputs"
        makeClone(inputs / "fleetd")
        shutil.copy(self.built, inputs)
        (inputs / "template.yaml").write_text(filledTemplate())
        vendor = vendorFiles(inputs / "vendor")
        name = shell.value("$ENROLLMENT_NAME")
        live = inputs / "live" / name
        (inputs / "standin-ca.pem").write_bytes(publicCertificate(live, name))
        await self.shellRun(
            shell,
            f"cp -a {inputs}/fleetd /root/fleetd\n"
            f"install -d /root/ek-roots /etc/letsencrypt/live\n"
            f"cp {vendor['root']} {vendor['inter']} /root/ek-roots/\n"
            f"cp -a {live} /etc/letsencrypt/live/\n"
            f"cat {inputs}/standin-ca.pem >> /etc/ssl/certs/ca-certificates.crt\n"
            "command -v sudo || { printf '#!/bin/sh\\nexec \"$@\"\\n'"
            " > /usr/local/bin/sudo && chmod 0755 /usr/local/bin/sudo; }",
        )

    def checkSaid(self, said: dict[str, str]) -> None:
        """What the guide's commands printed, where it says what they print."""

        def out(prefix: str) -> str:
            return "".join(v for k, v in said.items() if k.startswith(prefix))

        self.assertIn("fleetd", out("/opt/fleetd/bin/twistd --help | grep fleetd"))
        self.assertIn("no placeholder left", out("grep -n 'REPLACE-WITH-"))
        self.assertIn("0\nno placeholder left", out("grep -c REPLACE-WITH"))
        self.assertIn('"status": "ok"', out("curl https://"))
        self.assertIn("journal OK", out("fleetctl journal verify"))
        self.assertIn("integrity ok", out("fleetctl --config /etc/fleetd/backup.toml"))
        self.assertIn("tls.reloaded", out("fleetctl journal | tail -1"))
        self.assertIn("SUCCESS", out("promtool check config"))

    async def checkRunning(self, shell: GuideShell) -> None:
        """Under the unit, as fleetd: TLS with ALPN on each listener, readers."""
        assert self.daemon is not None and self.transport is not None
        uid = await self.shellRun(shell, "id -u fleetd")
        status = Path(f"/proc/{self.transport.pid}/status").read_text()
        self.assertIn(f"\nUid:\t{uid.strip()}\t", status)
        name = shell.value("$ENROLLMENT_NAME")
        script = shell.scratch / "handshakes.py"
        script.write_text(HANDSHAKES)
        chosen = json.loads(await self.shellRun(shell, f"python3 {script} {name}"))
        self.assertEqual(
            chosen,
            {"443": ["TLSv1.3", "http/1.1"], "8444": ["TLSv1.3", "http/1.1"],
             "8446": ["TLSv1.3", "http/1.1"], "42113": ["TLSv1.3", "h2"]},
        )  # fmt: skip
        for config, who in (("/etc/fleetd/backup.toml", "backup"),
                            ("/etc/fleetd/fleetd.toml", "root")):  # fmt: skip
            refused = await deferToThread(
                shell.run, f"fleetctl --config {config} cluster-token rotate"
            )
            self.assertEqual(refused[0], 1, refused[1])
            self.assertIn(f"403: refused: {who} holds a reader certificate", refused[1])
        journal = await self.shellRun(shell, "fleetctl journal")
        self.assertIn("backup.taken  actor=reader:backup", journal)
        for url in documentation():
            await self.shellRun(shell, f"test -f {url.removeprefix('file://')}")
        await self.stop()

    async def test_guide_runsAsWritten(self) -> None:
        """
        Every sh block of docs/install.md runs as written in a scratch
        root: the wheel into /opt/fleetd, the fleetd user, /etc/fleetd
        filled from step 0, the unit and tmpfiles, fleetd-pki's PKI with
        root's and the backup job's reader certificates; fleetd under the
        unit's hardening as fleetd answers /healthz through curl, completes
        a TLS handshake with ALPN on boot, device, admin and tink, takes
        the backup, reloads its certificate, restarts for the upgrade; the
        readers change nothing [O4]; the unit's Documentation= is there.
        """
        scratch = Path(self.mktemp()).resolve()
        scratch.mkdir(parents=True)
        self.built = wheel(scratch.parent / "dist")
        built = scratch / "inputs" / self.built.name
        shell = GuideShell(scratch)
        self.addCleanup(shell.close)
        self.addCleanup(self.cleanupDaemon)
        deps = site.getsitepackages()[0]
        said: dict[str, str] = {}
        commands = guideCommands(GUIDE.read_text())
        prepared = False
        for command in commands:
            if not command.section.startswith("0.") and not prepared:
                await self.siteInputs(shell, scratch)
                prepared = True
            what = instead(command.text)
            if what is None:
                continue
            if what in (START, RESTART, RELOAD):
                if what == RESTART:
                    await self.stop()
                if what == RELOAD:
                    await self.reload()
                else:
                    await self.start(shell)
                continue
            if what != command.text:
                template = scratch / "inputs" / "template.yaml"
                what = what.format(wheel=built, deps=deps, template=template)
            said[command.text] = await self.shellRun(shell, what)
            if command.text in AFTER:
                await self.shellRun(shell, AFTER[command.text].format(deps=deps))
        # What each command printed, for whoever reads a failure.
        (scratch / "said.json").write_text(json.dumps(said, indent=1))
        self.checkSaid(said)
        await self.checkRunning(shell)
        assert self.daemon is not None
        (scratch / "daemon.log").write_bytes(self.daemon.out + self.daemon.err)


class PrometheusTests(SynchronousTestCase):
    def test_exampleScrapeJob_promtoolValid(self) -> None:
        """
        The reference site's scrape job (conf/prometheus/fleetd.yml filled
        in) passes promtool check config beside the alert rules, and its
        job is what the rules select: job="fleetd", HTTPS to the admin
        port, the enrollment name verified, and no client certificate (an
        owner CA certificate would make Prometheus an owner [O1]).
        """
        if shutil.which("promtool") is None:
            raise missingPeer("promtool not installed")
        directory = Path(self.mktemp())
        directory.mkdir()
        shutil.copy(EXAMPLE / "prometheus.yml", directory / "fleetd.yml")
        shutil.copy(REPO / "conf" / "alerts.yml", directory / "fleetd-alerts.yml")
        done = run("promtool", "check", "config", directory / "fleetd.yml")
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        doc = yaml.safe_load((EXAMPLE / "prometheus.yml").read_text())
        (job,) = doc["scrape_configs"]
        self.assertEqual((job["job_name"], job["scheme"]), ("fleetd", "https"))
        self.assertIn('job="fleetd"', (REPO / "conf" / "alerts.yml").read_text())
        (target,) = job["static_configs"][0]["targets"]
        topology = json.loads((EXAMPLE / "anchor-topology.json").read_text())
        self.assertEqual(target, f"{topology['SPORE_IP']}:8446")
        conf = tomllib.loads((REPO / "conf" / "fleetd.toml").read_text())
        self.assertEqual(conf["listen"]["admin"], "tcp:8446")
        tls = job["tls_config"]
        self.assertEqual(tls["server_name"], topology["enrollment_name"])
        self.assertNotIn("cert_file", tls)
        self.assertNotIn("key_file", tls)
