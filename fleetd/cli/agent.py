"""
fleetd-agent: the node-side client, run as a Tinkerbell action in HookOS.

The command frame follows DESIGN §6. The commands themselves (attest, plan,
disks, renew) arrive with the machine-trust issue; until then each one
refuses with one line and exit status 3, so a workflow that runs this build
fails loudly instead of seeming to attest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import IO, Any

from fleetd.cli import agent_disks

COMMANDS = ("attest", "plan", "disks", "renew")
NOT_AVAILABLE = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise SystemExit(f"fleetd-agent: {message}")


def buildParser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fleetd-agent", description="fleetd node-side client.")
    parser.add_argument("--server", required=True, help="https://HOST:8444")
    parser.add_argument("--ca", help="CA bundle for the device listener")
    parser.add_argument("--tcti", default="device:/dev/tpmrm0", help="TPM TCTI")
    parser.add_argument("--state", default="/var/lib/fleetd-agent", help="state dir")
    parser.add_argument("--json", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        command = sub.add_parser(name)
        if name == "disks":
            agent_disks.addArguments(command)
    return parser


def main(argv: Sequence[str] | None = None, err: IO[str] | None = None) -> int:
    err = sys.stderr if err is None else err
    args = buildParser().parse_args(argv)
    if args.command == "disks":
        return agent_disks.run(args, err=err)
    err.write(
        f"fleetd-agent: {args.command}: not-available: this build has no"
        " machine-trust support yet\n"
    )
    return NOT_AVAILABLE


if __name__ == "__main__":
    raise SystemExit(main())
