"""
fleetd-agent: the node-side client, run as a Tinkerbell action in HookOS.

The command frame follows design.md, wire contract; each command lives in its own module
(L{fleetd.agent.attest}: attest, plan, renew; L{fleetd.agent.disks}: disks;
L{fleetd.agent.meta}: meta, which edits a disk and needs no C{--server};
L{fleetd.agent.ek}: ek, a receiving scan's reading, which talks to no server).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import IO

from fleetd.agent import disks, ek, meta
from fleetd.agent.client import sourceAddress
from fleetd.clitools import Parser, addJSONOption, runMain

COMMANDS = ("attest", "plan", "disks", "renew", "meta", "ek")
# The commands that talk to fleetd, and so need --server.
ONLINE = ("attest", "plan", "disks", "renew")


class AgentParser(Parser):
    """Usage mistakes are C{fleetd-agent: ...}, exit status 1."""

    usageStatus = 1
    namesCommand = False


def _stateDir(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("empty: give the agent's state directory")
    return value


def _source(value: str) -> str:
    try:
        return sourceAddress(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def buildParser() -> argparse.ArgumentParser:
    parser = AgentParser(prog="fleetd-agent", description="fleetd node-side client.")
    parser.add_argument("--server", help="https://HOST:8444 (all but meta and ek)")
    parser.add_argument("--ca", help="CA bundle for the device listener")
    parser.add_argument(
        "--source",
        dest="source_address",
        type=_source,
        metavar="ADDRESS",
        help="connect to fleetd from this local address (default: the kernel's)",
    )
    parser.add_argument("--tcti", default="device:/dev/tpmrm0", help="TPM TCTI")
    parser.add_argument(
        "--state", type=_stateDir, default="/var/lib/fleetd-agent", help="state dir"
    )
    addJSONOption(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=AgentParser)
    for name in COMMANDS:
        command = sub.add_parser(name)
        if name == "disks":
            disks.addArguments(command)
        if name == "attest":
            command.add_argument("--serial", help="chassis serial (default: SMBIOS)")
            command.add_argument("--uuid", help="system uuid (default: SMBIOS)")
            command.add_argument(
                "--ek", choices=("auto", "rsa", "ecc"), default="auto", help="EK type"
            )
        if name == "meta":
            meta.addArguments(command)
        if name == "ek":
            ek.addArguments(command)
        if name == "plan":
            command.add_argument("--device", help="ask for this device's plan")
            command.add_argument(
                "--write-meta",
                metavar="DEV",
                help="write the run's code as META 0x0b on DEV, the target disk",
            )
            command.add_argument(
                "--image-file",
                action="store_true",
                help="DEV is a disk image file: its serial is not checked",
            )
            command.add_argument(
                "--target-link",
                metavar="PATH",
                help="make PATH a symlink to the target disk's /dev node",
            )
            command.add_argument(
                "--sysfs-root", default="/sys", help="where sysfs is mounted (tests)"
            )
    return parser


def main(
    argv: Sequence[str] | None = None,
    err: IO[str] | None = None,
    out: IO[str] | None = None,
) -> int:
    errors = sys.stderr if err is None else err
    output = sys.stdout if out is None else out

    def run() -> int:
        parser = buildParser()
        args = parser.parse_args(argv)
        if args.command in ONLINE and args.server is None:
            parser.error("the following arguments are required: --server")
        if args.command == "meta":
            return meta.run(args, output, errors)
        if args.command == "disks":
            return disks.run(args, out=output, err=errors)
        if args.command == "ek":
            return ek.run(args, output, errors)
        from fleetd.agent import attest

        return attest.run(args, output, errors)

    return runMain("fleetd-agent", run, output, errors)


if __name__ == "__main__":
    raise SystemExit(main())
