"""
C{fleetd-pki}: make the site's real PKI where a fleetd config says it lives
(docs/install.md, "The PKI").

    fleetd-pki [--config FILE] owner-ca [--cn CN] [--days N] [--force]
    fleetd-pki [--config FILE] operator NAME [--role owner|reader] [--out DIR]
                                        [--ca-key FILE] [--days N]
    fleetd-pki [--config FILE] issuer [--cn CN] [--days N] [--force]
    fleetd-pki [--config FILE] ek-roots import FILE... [--force]

The config comes from C{--config}, else C{$FLEETD_CONFIG}, else
C{/etc/fleetd/fleetd.toml}, and names every path: C{owner.client_ca} (its
key beside it, C{.key} for C{.pem}, unless C{--ca-key}), C{pki.issuer_cert},
C{pki.issuer_key}, C{pki.bundle} and C{attest.ek_roots}. Nothing existing is
overwritten without C{--force}; keys are mode 0600; every file written is
printed. An operator's role (C{owner}, the default, or C{reader}) is fixed
in the certificate [O4] (L{fleetd.pki.owners}). The owner CA gets a key of
its own and is refused where fleetd would refuse it [O1]: as the issuer,
in the bundle or the public chain.
Exit 0, or 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetd.config import ConfigError, Settings, loadSettings
from fleetd.pki import real
from fleetd.pki.owners import OWNER, READER, ROLES
from fleetd.pki.real import PKIError

__all__ = ["main"]

DEFAULT_CONFIG = Path("/etc/fleetd/fleetd.toml")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _UsageError(message)


def _caKey(settings: Settings, given: Path | None) -> Path:
    return given or settings.owner.client_ca.with_suffix(".key")


def _others(settings: Settings) -> list[tuple[str, Path]]:
    """The files the owner CA must stay out of [O1], by config key."""
    found = [
        ("pki.issuer_cert", settings.pki.issuer_cert),
        ("pki.bundle", settings.pki.bundle),
        ("tls.cert", settings.tls.cert),
    ]
    if settings.tls.chain is not None:
        found.append(("tls.chain", settings.tls.chain))
    return found


def _checkOwnerApart(settings: Settings, owner: Any) -> None:
    """Refuse an owner CA that the issuer, bundle or public chain holds [O1]."""
    ownerPath = settings.owner.client_ca.resolve()
    for key, path in _others(settings):
        if path.resolve() == ownerPath:
            raise PKIError(f"owner.client_ca and {key} are the same file, {path} [O1]")
        if path.exists():
            problem = real.ownerConflict(
                owner, f"in {key}", real.readCertificates(path)
            )
            if problem is not None:
                raise PKIError(
                    f"{problem} ({path}); owners need a CA of their own [O1]"
                )


def ownerCA(settings: Settings, options: argparse.Namespace) -> list[str]:
    cert, key = real.makeOwnerCA(options.cn, _now(), options.days, options.key_type)
    _checkOwnerApart(settings, cert)
    files = [
        real.certFile(cert, settings.owner.client_ca),
        real.keyFile(key, _caKey(settings, options.ca_key)),
    ]
    return [
        *real.writeFiles(files, options.force),
        "next: one certificate per operator (fleetd-pki operator NAME); then keep "
        f"{files[1][0]} offline",
    ]


def operator(settings: Settings, options: argparse.Namespace) -> list[str]:
    caKey = _caKey(settings, options.ca_key)
    if settings.owner.client_ca.exists() and not caKey.exists():
        raise PKIError(
            f"the owner CA's key {caKey} is not there (offline? --ca-key FILE)"
        )
    ca = real.readPair(settings.owner.client_ca, caKey)
    _checkOwnerApart(settings, ca[0])
    role = options.role
    cert, key = real.makeOperator(
        options.name, ca, _now(), options.days, options.key_type, role
    )
    out = options.out or settings.owner.client_ca.parent / "operators"
    files = [
        real.certFile(cert, out / f"{options.name}.pem"),
        real.keyFile(key, out / f"{options.name}.key"),
    ]
    if role == READER:
        what = (
            "reads status, lists, the journal and backups, and changes nothing; "
            f"the journal names it {role}:{options.name}"
        )
    else:
        what = f"may do everything; the journal names its changes {role}:{options.name}"
    return [
        *real.writeFiles(files, options.force),
        f"{role} {options.name!r}: clientAuth, valid {options.days} days; it {what}",
    ]


def issuer(settings: Settings, options: argparse.Namespace) -> list[str]:
    pki = settings.pki
    for name, path in (
        ("pki.issuer_cert", pki.issuer_cert),
        ("pki.bundle", pki.bundle),
    ):
        if path.resolve() == settings.owner.client_ca.resolve():
            raise PKIError(f"{name} and owner.client_ca are the same file, {path} [O1]")
    cn = options.cn or f"{settings.site_name} devid issuer"
    cert, key = real.makeIssuer(cn, _now(), options.days, options.key_type)
    if settings.owner.client_ca.exists():
        owner = real.readCertificates(settings.owner.client_ca)[0]
        bundled = real.readCertificates(pki.bundle) if pki.bundle.exists() else []
        for what, certs in (("the new issuer", [cert]), ("pki.bundle", bundled)):
            problem = real.ownerConflict(owner, what, certs)
            if problem is not None:
                raise PKIError(f"{problem}; owners need a CA of their own [O1]")
    lines = real.writeFiles(
        [real.certFile(cert, pki.issuer_cert), real.keyFile(key, pki.issuer_key)],
        options.force,
    )
    # [T4] the bundle holds the issuer (and any legacy CAs already there).
    real.appendFile(pki.bundle, real.certFile(cert, pki.bundle)[1])
    lines.append(f"added the issuer to {pki.bundle} (the LDevID trust bundle)")
    lines.append(f"next: chown fleetd {pki.issuer_key} (fleetd signs LDevIDs with it)")
    return lines


def ekRoots(settings: Settings, options: argparse.Namespace) -> list[str]:
    target = settings.ek_roots
    known = real.existingDigests(target)
    now = _now()
    found: list[tuple[Path, real.EKRoot]] = []
    for name in options.files:
        for root in real.readEKRoots(Path(name)):
            if root.isCA is False:
                raise PKIError(
                    f"{name}: {root.subject!r} is not a CA certificate (an EK "
                    "certificate itself?); nothing imported"
                )
            if root.notAfter < now and not options.force:
                raise PKIError(
                    f"{name}: {root.subject!r} expired {root.notAfter:%Y-%m-%d}; "
                    "nothing imported (--force imports it anyway)"
                )
            found.append((Path(name), root))
    lines = []
    asFile = target.is_file() or (not target.exists() and target.suffix == ".pem")
    if not asFile:
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
    for source, root in found:
        kind = "root (anchor)" if root.selfSigned else "intermediate"
        until = f"{root.notAfter:%Y-%m-%d}"
        described = f"{root.subject} [{kind}, until {until}, sha256 {root.sha256[:16]}]"
        if root.sha256 in known:
            lines.append(f"already there: {described}")
            continue
        known.add(root.sha256)
        if asFile:
            real.appendFile(target, root.pem())
            lines.append(f"appended to {target}: {described} from {source}")
        else:
            lines.extend(
                real.writeFiles([(target / real.slug(root), root.pem(), 0o644)], False)
            )
            lines.append(f"  {described} from {source}")
    return lines


def _now() -> datetime:
    return datetime.now(UTC)


def _parser() -> _Parser:
    parser = _Parser(prog="fleetd-pki", description="Make the site's real PKI.")
    parser.add_argument(
        "--config", type=Path, help="fleetd TOML file (env FLEETD_CONFIG)"
    )
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser
    )

    def command(name: str, run: Callable[..., list[str]], help: str) -> _Parser:
        sub: _Parser = commands.add_parser(name, help=help)
        sub.set_defaults(run=run)
        sub.add_argument("--key-type", choices=("ecdsa", "rsa"), default="ecdsa")
        sub.add_argument("--force", action="store_true", help="replace existing files")
        return sub

    owner = command("owner-ca", ownerCA, "create the owner CA (owner.client_ca)")
    owner.add_argument("--cn", default="fleetd owner CA")
    owner.add_argument("--days", type=int, default=3650)
    owner.add_argument("--ca-key", type=Path, help="where its key goes")
    op = command("operator", operator, "a clientAuth certificate for one operator")
    op.add_argument("name", help="the operator's name: the CN, and the journal's actor")
    op.add_argument(
        "--role",
        choices=ROLES,
        default=OWNER,
        help="owner: everything; reader: status, lists, journal, backups, no change",
    )
    op.add_argument("--days", type=int, default=365)
    op.add_argument(
        "--out", type=Path, help="directory (default: operators/ beside the CA)"
    )
    op.add_argument("--ca-key", type=Path, help="the owner CA's key (if moved offline)")
    iss = command("issuer", issuer, "create the LDevID issuer (pki.issuer_*)")
    iss.add_argument("--cn", help="default: '<site> devid issuer'")
    iss.add_argument("--days", type=int, default=3650)
    ek = commands.add_parser("ek-roots", help="TPM vendors' EK roots (attest.ek_roots)")
    ekCommands = ek.add_subparsers(
        dest="ek_command", required=True, parser_class=_Parser
    )
    imp: _Parser = ekCommands.add_parser(
        "import", help="add vendor root/intermediate files"
    )
    imp.set_defaults(run=ekRoots)
    imp.add_argument("files", nargs="+", help="PEM or DER certificate files")
    imp.add_argument("--force", action="store_true", help="import expired ones too")
    return parser


def run(argv: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
    """Parse C{argv}, do the command, return the lines to print."""
    options = _parser().parse_args(argv)
    if getattr(options, "days", 1) < 1:
        raise _UsageError("--days must be at least 1")
    environ = os.environ if env is None else env
    config = options.config or Path(environ.get("FLEETD_CONFIG") or DEFAULT_CONFIG)
    settings = loadSettings(config)
    lines: list[str] = options.run(settings, options)
    return lines


def main(argv: list[str] | None = None) -> int:
    """Console script C{fleetd-pki}: 0 on success, 2 with one line on error."""
    try:
        lines = run(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except ConfigError as e:
        print(f"fleetd-pki: configuration error: {e}", file=sys.stderr)
        return 2
    except (_UsageError, PKIError, OSError) as e:
        print(f"fleetd-pki: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
