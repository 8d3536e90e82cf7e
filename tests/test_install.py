"""
docs/install.md's steps, run into a temporary root as far as a test can
(issue 19, item 3): the wheel C{make dist} builds, a virtualenv at
C{<root>/opt/fleetd} with only that wheel installed into it, the
C{fleetd} user in the root's own passwd, C{/etc/fleetd} laid out from
C{conf/}, the unit and tmpfiles installed (checked by C{systemd-analyze
verify} and C{systemd-tmpfiles --root} when this machine has them), the
PKI made by the installed C{fleetd-pki}, and fleetd started with the
unit's own command line until C{/healthz} answers; then the backup job's
C{fleetctl backup} with its reader certificate and a clean SIGTERM.

What a test cannot do, and does instead: it does not install the
dependencies from the package index (the new venv reads them from the
venv running the tests, through a C{.pth} line, so it needs no network),
nor Twisted's C{twistd} script (written as pip writes it); it runs as the
current user, not C{fleetd}; it binds loopback port 0 rather than 443 and
53, and its vault is a plain directory (C{paths.vault_allow_any_fs}).
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import signal
import site
import subprocess
import sys
import tomllib
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.pki.dev import certPEM, keyPEM, makeCertificate
from tests.daemonsupport import httpsGet
from tests.support import REPO, _toml, filledTemplate, missingPeer
from tests.test_pki_cli import vendorFiles
from tests.test_twistd import Twistd

_WHEEL: list[Path] = []


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


def _env() -> dict[str, str]:
    """The environment without this checkout on the path, as under systemd."""
    drop = ("PYTHONPATH", "FLEETD_CONFIG", "NOTIFY_SOCKET", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=_env(), timeout=120
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


def reroot(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """C{config} with every absolute path moved under C{root}."""

    def move(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(("/etc/", "/var/", "/run/")):
            return str(root) + value
        return value

    return {t: {k: move(v) for k, v in keys.items()} for t, keys in config.items()}


def writeTOML(path: Path, config: dict[str, Any]) -> None:
    lines = []
    for table, keys in config.items():
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in keys.items())
        lines.append("")
    path.write_text("\n".join(lines))


class InstallTests(TestCase):
    timeout = 240

    def step(self, *argv: str | Path) -> str:
        done = run(*argv)
        self.assertEqual(done.returncode, 0, f"{argv}: {done.stderr}{done.stdout}")
        return done.stdout

    def layout(self, root: Path) -> tuple[Path, Path]:
        """The steps up to a startable fleetd; returns (config, public CA)."""
        opt = root / "opt" / "fleetd"
        # 1. /opt/fleetd: a virtualenv with the wheel (dependencies: see above).
        base = getattr(sys, "_base_executable", sys.executable)
        self.step(base, "-m", "venv", opt)
        purelib = run(
            opt / "bin/python",
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        )
        (Path(purelib.stdout.strip()) / "deps.pth").write_text(
            site.getsitepackages()[0] + "\n"
        )
        self.step(
            opt / "bin/python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            wheel(root.parent / "dist"),
        )
        twistd = opt / "bin" / "twistd"  # Twisted's console script, as pip writes it
        twistd.write_text(
            f"#!{opt / 'bin' / 'python'}\nimport sys\n"
            "from twisted.scripts.twistd import run\nsys.exit(run())\n"
        )
        twistd.chmod(0o755)
        self.assertIn("fleetd", self.step(twistd, "--help"))  # also writes dropin.cache
        where = self.step(
            opt / "bin/python", "-c", "import fleetd; print(fleetd.__file__)"
        )
        self.assertTrue(where.startswith(str(opt)), where)
        # 2. the fleetd user (useradd --root ROOT --system --user-group ...).
        etc = root / "etc"
        etc.mkdir()
        home = "/var/lib/fleetd:/usr/sbin/nologin"
        (etc / "passwd").write_text(
            f"root:x:0:0::/root:/bin/sh\nfleetd:x:{os.getuid()}:{os.getgid()}::{home}\n"
        )
        (etc / "group").write_text(f"root:x:0:\nfleetd:x:{os.getgid()}:\n")
        # 3. /etc/fleetd from conf/.
        conf, fleetd = REPO / "conf", etc / "fleetd"
        config = reroot(tomllib.loads((conf / "fleetd.toml").read_text()), root)
        topology = Path(config["site"]["topology"])
        topology.parent.mkdir(parents=True)
        shutil.copy(conf / "anchor-topology.example.json", topology)
        (fleetd / "templates").mkdir()
        # Generated by talosctl at a site (step 8); fleetd refuses the
        # example's placeholders (issue 27): stand-in values of their form.
        (fleetd / "templates" / "folly.yaml").write_text(filledTemplate())
        config["listen"] = {
            name: "tcp:0:interface=127.0.0.1"
            for name in ("boot", "device", "admin", "tink")
        } | {"dns": "0:interface=127.0.0.1"}
        config["paths"]["vault_allow_any_fs"] = True
        config["tink"]["upstream"] = "tcp:127.0.0.1:1"
        config["owner"]["client_cert"] = str(fleetd / "operators" / "alice.pem")
        config["owner"]["client_key"] = str(fleetd / "operators" / "alice.key")
        writeTOML(fleetd / "fleetd.toml", config)
        # 4. the unit and tmpfiles.
        (etc / "systemd" / "system").mkdir(parents=True)
        shutil.copy(
            conf / "fleetd.service", etc / "systemd" / "system" / "fleetd.service"
        )
        (etc / "tmpfiles.d").mkdir()
        shutil.copy(conf / "fleetd.tmpfiles.conf", etc / "tmpfiles.d" / "fleetd.conf")
        self.tmpfiles(root)
        self.verifyUnit(root)
        # 5. the PKI, with the installed fleetd-pki.
        toml = fleetd / "fleetd.toml"
        pki: list[str | Path] = [opt / "bin/fleetd-pki", "--config", toml]
        vendor = vendorFiles(root.parent / "vendor")
        self.step(*pki, "owner-ca")
        self.step(*pki, "operator", "alice")
        self.step(*pki, "operator", "backup", "--role", "reader")
        self.step(*pki, "issuer")
        self.step(*pki, "ek-roots", "import", vendor["root"], vendor["inter"])
        for key in (
            "owner-ca.key",
            "operators/alice.key",
            "operators/backup.key",
            "pki/folly-devid-issuer.key",
        ):
            self.assertEqual((fleetd / key).stat().st_mode & 0o777, 0o600, key)
        return fleetd / "fleetd.toml", self.publicCertificate(config)

    def tmpfiles(self, root: Path) -> None:
        """systemd-tmpfiles --root ROOT --create, or the same by hand."""
        if shutil.which("systemd-tmpfiles"):
            self.step("systemd-tmpfiles", f"--root={root}", "--create", "fleetd.conf")
        else:
            for line in (
                (REPO / "conf" / "fleetd.tmpfiles.conf").read_text().splitlines()
            ):
                if line.startswith("d "):
                    made = root / line.split()[1].lstrip("/")
                    made.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in ("run/fleetd/configs", "var/lib/fleetd"):
            self.assertEqual((root / path).stat().st_mode & 0o777, 0o700, path)

    def verifyUnit(self, root: Path) -> None:
        """systemd-analyze verify --root ROOT, when this machine has systemd."""
        units = Path("/lib/systemd/system")
        if not (
            shutil.which("systemd-analyze") and (units / "sysinit.target").exists()
        ):
            return  # UnitFileTests checked the keys
        shutil.copytree(
            units, root / "usr" / "lib" / "systemd" / "system", symlinks=True
        )
        (root / "bin").mkdir(exist_ok=True)
        shutil.copy(shutil.which("kill") or "/bin/kill", root / "bin" / "kill")
        done = run(
            "systemd-analyze",
            "verify",
            f"--root={root}",
            "/etc/systemd/system/fleetd.service",
        )
        self.assertEqual((done.returncode, done.stderr), (0, ""))

    def publicCertificate(self, config: dict[str, Any]) -> Path:
        """A stand-in for the public CA's certificate (docs/install.md, step 6)."""
        now = datetime.now(UTC)
        caKey, leafKey = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
        ca = makeCertificate("stand-in public CA", caKey, now)
        names = [x509.DNSName("enroll.lolwtf.ca"), x509.DNSName("localhost")]
        leaf = makeCertificate(
            "enroll.lolwtf.ca",
            leafKey,
            now,
            (ca, caKey),
            ExtendedKeyUsageOID.SERVER_AUTH,
            names,
        )
        tls = config["tls"]
        Path(tls["cert"]).parent.mkdir(parents=True, exist_ok=True)
        Path(tls["cert"]).write_bytes(certPEM(leaf))
        Path(tls["key"]).write_bytes(keyPEM(leafKey))
        Path(tls["key"]).chmod(0o600)
        Path(tls["chain"]).write_bytes(certPEM(ca))
        return Path(tls["chain"])

    async def _install(self) -> None:
        root = Path(self.mktemp()).resolve() / "root"
        root.mkdir(parents=True)
        config, publicCA = self.layout(root)
        # 6. start it with the unit's own command line, rerooted.
        argv = [
            str(root) + a if a.startswith(("/opt/", "/etc/")) else a
            for a in shlex.split(unit()["Service"]["ExecStart"])
        ]
        proto = Twistd()
        transport = reactor.spawnProcess(proto, argv[0], argv, env=_env())

        def cleanup() -> Any:
            if not proto.ended.called:
                transport.signalProcess("KILL")
                return proto.ended
            return None

        self.addCleanup(cleanup)
        await proto.ready()
        admin = proto.ports["admin"]
        status, _, body = await deferToThread(httpsGet, admin, "/healthz", publicCA)
        self.assertEqual((status, json.loads(body)["status"]), (200, "ok"))
        # 7. fleetctl with the operators' certificates: the backup job's
        # backup.toml names the reader's pair (docs/install.md, step 11).
        settings = tomllib.loads(config.read_text())
        settings["owner"]["server"] = f"https://localhost:{admin}"
        settings["owner"]["server_ca"] = str(publicCA)
        writeTOML(config, settings)
        pair = config.parent / "backup"
        pair.mkdir(mode=0o700)
        for name in ("backup.pem", "backup.key"):
            (config.parent / "operators" / name).rename(pair / name)
        settings["owner"]["client_cert"] = str(pair / "backup.pem")
        settings["owner"]["client_key"] = str(pair / "backup.key")
        job = config.parent / "backup.toml"
        writeTOML(job, settings)
        fleetctl = root / "opt" / "fleetd" / "bin" / "fleetctl"
        backup = root / "fleetd-backup.sqlite3"
        out = await deferToThread(
            self.step, fleetctl, "--config", job, "backup", backup
        )
        self.assertIn("integrity ok", out)
        refused = await deferToThread(
            run, fleetctl, "--config", job, "cluster-token", "rotate"
        )
        self.assertEqual(refused.returncode, 1)
        self.assertIn("403: refused: backup holds a reader certificate", refused.stderr)
        journal = await deferToThread(
            self.step, fleetctl, "--config", config, "journal"
        )
        self.assertIn("backup.taken  actor=reader:backup", journal)
        transport.signalProcess(signal.SIGTERM)
        self.assertEqual(await proto.ended, 0, proto.err)
        self.assertNotIn(b"Traceback", proto.out + proto.err)

    def test_installSteps_reachARunningFleetd(self) -> None:
        """
        A wheel install into <root>/opt/fleetd, /etc/fleetd from conf/, the
        unit, tmpfiles and fleetd-pki's PKI: fleetd started with the unit's
        ExecStart answers /healthz, takes the backup job's backup with its
        reader certificate (which can change nothing [O4]), and stops
        cleanly on SIGTERM.
        """
        return ensureDeferred(self._install())  # type: ignore[return-value]


class PrometheusTests(SynchronousTestCase):
    def test_scrapeJob_promtoolValid(self) -> None:
        """
        conf/prometheus/fleetd.yml passes promtool check config beside the
        alert rules, and its job is what the rules select: job="fleetd",
        HTTPS to the admin port, the enrollment name verified, and no client
        certificate (an owner CA certificate would make Prometheus an
        owner [O1]).
        """
        if shutil.which("promtool") is None:
            raise missingPeer("promtool not installed")
        directory = Path(self.mktemp())
        directory.mkdir()
        shutil.copy(REPO / "conf" / "prometheus" / "fleetd.yml", directory)
        shutil.copy(REPO / "conf" / "alerts.yml", directory / "fleetd-alerts.yml")
        done = run("promtool", "check", "config", directory / "fleetd.yml")
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        doc = yaml.safe_load((REPO / "conf" / "prometheus" / "fleetd.yml").read_text())
        (job,) = doc["scrape_configs"]
        self.assertEqual((job["job_name"], job["scheme"]), ("fleetd", "https"))
        self.assertIn('job="fleetd"', (REPO / "conf" / "alerts.yml").read_text())
        (target,) = job["static_configs"][0]["targets"]
        topology = json.loads(
            (REPO / "conf" / "anchor-topology.example.json").read_text()
        )
        self.assertEqual(target, f"{topology['SPORE_IP']}:8446")
        admin = tomllib.loads((REPO / "conf" / "fleetd.toml").read_text())["listen"][
            "admin"
        ]
        self.assertEqual(admin, "tcp:8446")
        tls = job["tls_config"]
        self.assertEqual(tls["server_name"], topology["enrollment_name"])
        self.assertNotIn("cert_file", tls)
        self.assertNotIn("key_file", tls)
