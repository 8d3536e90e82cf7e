"""
C{fleetd-devpki --config FILE}: create the development PKI a fleetd config
names (L{fleetd.pki.dev}), checking that the config's paths are where the
dev PKI writes its files. Exit status 0, or 2 with one line on error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetd.pki.dev import DevPKIPaths, ensureDevPKI

__all__ = ["main"]


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _UsageError(message)


# Config keys that name dev PKI files, and which file each must be.
_CONFIG_FILES = {
    "tls.cert": "public_cert",
    "tls.key": "public_key",
    "tls.chain": "public_ca",
    "pki.issuer_cert": "devid_issuer",
    "pki.issuer_key": "devid_issuer_key",
    "pki.bundle": "bundle",
    "attest.ek_roots": "ek_roots",
    "owner.client_ca": "owner_ca",
    "owner.client_cert": "owner_cert",
    "owner.client_key": "owner_key",
    "owner.server_ca": "public_ca",
}


def _readConfig(source: Path) -> tuple[str, DevPKIPaths]:
    """The enrollment name and the dev PKI placement a fleetd config names."""
    try:
        data = tomllib.loads(source.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ValueError(f"config: cannot read {source}: {e.strerror}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"config: {source} is not valid TOML: {e}") from e
    base = source.resolve().parent

    def path(dotted: str) -> Path | None:
        table, _, key = dotted.partition(".")
        section = data.get(table)
        value = section.get(key) if isinstance(section, dict) else None
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{dotted}: must be a non-empty string")
        return None if value is None else Path(os.path.normpath(base / value))

    topology, cert = path("site.topology"), path("tls.cert")
    if topology is None or cert is None:
        raise ValueError(
            f"{'site.topology' if topology is None else 'tls.cert'}: missing"
        )
    paths = DevPKIPaths.inside(cert.parent)
    for key, attribute in _CONFIG_FILES.items():
        configured, expected = path(key), getattr(paths, attribute)
        if configured is not None and configured != expected:
            raise ValueError(f"{key}: the dev PKI writes {expected}, not {configured}")
    return _enrollmentName(topology), paths


def _enrollmentName(topology: Path) -> str:
    try:
        doc = json.loads(topology.read_bytes())
    except OSError as e:
        raise ValueError(f"site.topology: cannot read {topology}: {e.strerror}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"site.topology: {topology} is not valid JSON: {e}") from e
    name = doc.get("enrollment_name") if isinstance(doc, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise ValueError("site.topology.enrollment_name: missing or not a string")
    return name


def _run(argv: Sequence[str]) -> str:
    parser = _Parser(
        prog="fleetd-devpki",
        description="Create the development PKI named by a fleetd config.",
    )
    parser.add_argument("--config", required=True, type=Path, help="fleetd TOML file")
    parser.add_argument(
        "--key-type", choices=("ecdsa", "rsa"), default="ecdsa", help="key algorithm"
    )
    options = parser.parse_args(argv)
    name, paths = _readConfig(options.config)
    existed = paths.complete()
    ensureDevPKI(paths.directory, name, keyType=options.key_type)
    return f"dev PKI {'ready' if existed else 'created'} in {paths.directory}"


def main(argv: list[str] | None = None) -> int:
    """Console script C{fleetd-devpki}: 0 on success, 2 with one line on error."""
    try:
        line = _run(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (_UsageError, ValueError, OSError) as e:
        message = str(e).replace("\n", " ")
        print(f"fleetd-devpki: {message}", file=sys.stderr)
        return 2
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
